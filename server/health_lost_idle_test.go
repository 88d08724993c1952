//go:build unix

package server

import (
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
)

// TestFaultStoreLostIdleAtOnce: under the error policy an instance no
// request reaches learns that Redis was killed from the watch's next
// check, which says so as it starts (a refused dial), not once go-redis
// has retried for its 1 s timeout; /v1/status's since is that check's
// start, so `store back`'s down_for counts from it: the outage less up to
// one check interval at its start, plus up to one at its end.
func TestFaultStoreLostIdleAtOnce(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	p := startSluice(t, nil, "--config", "testdata/envoy-example.yaml", "--redis", r.url(),
		"--failure-policy", "error", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0")
	count := func(msg string) int { return strings.Count(p.stderr.String(), `msg="`+msg+`"`) }
	const trials, outage = 5, 1500 * time.Millisecond
	for i := range trials {
		time.Sleep(rand.N(time.Second))
		r.Stop()
		killed := time.Now()
		for count("store lost") < i+1 {
			if time.Since(killed) > 5*time.Second {
				t.Fatalf("no store lost line 5s after Redis was killed:\n%s", p.stderr.String())
			}
			time.Sleep(2 * time.Millisecond)
		}
		seen := time.Now()
		_, st := p.getJSON(t, "/v1/status")
		since, err := time.Parse(time.RFC3339Nano, st["store"].(map[string]any)["since"].(string))
		if err != nil {
			t.Fatal(err)
		}
		// The watch checks every second; its check is told at once.
		if after, told := since.Sub(killed), seen.Sub(since); after < 0 || after > 1300*time.Millisecond || told > 300*time.Millisecond {
			t.Errorf("trial %d: since %v after the kill, store lost seen %v after since; want within [0, 1.3s] and 300ms", i, after, told)
		}
		time.Sleep(outage - time.Since(killed))
		r.restart(t)
		for count("store back") < i+1 {
			if time.Since(killed) > 10*time.Second {
				t.Fatalf("no store back line:\n%s", p.stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}
