//go:build unix

package server

import (
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
)

// TestFaultServeOutageLines: the lines one Redis outage writes through
// `sluice serve` under its defaults (failure policy local, Redis without
// appendonly), Redis killed under load for 3s and restarted. Each line is
// one event: the breaker's opening names the failure policy that answers
// from then on and how many decisions it answered before, its closing the
// policy that stops; neither has a second line saying so (before, 6 WARN
// lines at the loss and 7 lines at the return). go-redis's own lines
// (its pool's failed dials, paced) are not sluice's and not counted here.
func TestFaultServeOutageLines(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	cfg := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: "+apiLimit+"\n")
	p := startSluice(t, nil, "--config", cfg, "--redis", r.url(), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
	stop := keepCalling(2, 5*time.Millisecond, func(int) { sendKey(p, "api", "k") })
	defer stop()
	time.Sleep(1500 * time.Millisecond)
	from := len(p.stderr.String())
	r.Stop()
	time.Sleep(3 * time.Second)
	r.restart(t)
	restarted := "Redis restarted: sluice's keys it had not saved are gone and their limits start afresh (each may admit up to its whole limit again); appendonly yes keeps them"
	want := map[string]string{
		// The loss, in about the order written.
		"store lost":              "WARN",
		"resilient: breaker open": "WARN", // from closed, and again as a probe fails
		"resilient: fleet registry lost; keeping the fleet size":                             "WARN",
		"fleet figures unavailable: the dashboard shows this instance's until Redis answers": "WARN",
		"resilient: breaker half_open":                                                       "INFO", // a probe
		// The return.
		"fleet figures available again":  "INFO",
		"resilient: fleet registry back": "INFO",
		"store back":                     "INFO",
		"resilient: breaker closed":      "INFO",
		restarted:                        "WARN",
	}
	lines := func() map[string]string {
		got := map[string]string{}
		for line := range strings.Lines(p.stderr.String()[from:]) {
			rec, ok := parseRecord(strings.TrimSpace(line))
			if !ok {
				t.Fatalf("not a log record: %q", line)
			}
			if rec["logger"] == "go-redis" {
				continue
			}
			if lv, seen := got[rec["msg"]]; seen && lv != rec["level"] {
				t.Errorf("%q logged at %s and at %s", rec["msg"], lv, rec["level"])
			}
			got[rec["msg"]] = rec["level"]
		}
		return got
	}
	// Every expected line written, then a second more for any other.
	var got map[string]string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if got = lines(); len(got) >= len(want) && maps.Equal(got, want) || time.Now().After(deadline) {
			break
		}
	}
	time.Sleep(time.Second)
	if got = lines(); !maps.Equal(got, want) {
		var extra, missing []string
		for m, lv := range got {
			if want[m] != lv {
				extra = append(extra, lv+" "+m)
			}
		}
		for m, lv := range want {
			if got[m] != lv {
				missing = append(missing, lv+" "+m)
			}
		}
		slices.Sort(extra)
		slices.Sort(missing)
		t.Errorf("an outage's lines: not expected %q, missing %q; log:\n%s", extra, missing, p.stderr.String()[from:])
	}
	for _, attr := range []string{"policy=local", "answered_while_closed="} {
		if !strings.Contains(logged(t, p.stderr, "resilient: breaker open", "from=closed"), attr) {
			t.Errorf("the breaker's opening line has no %s", attr)
		}
	}
	if !strings.Contains(logged(t, p.stderr, "resilient: breaker closed"), "policy=local") {
		t.Error("the breaker's closing line does not name the policy")
	}
}
