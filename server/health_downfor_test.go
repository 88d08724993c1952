//go:build unix

package server

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
)

// TestFaultDownForFromFirstFailure: Redis frozen (SIGSTOP) or killed
// under load through sluice serve, whose watch checks every second. The
// watch declares the store lost a check or more after the first decision
// failed; `store back`'s down_for counts from that first failure: at least
// the outage (stop to restart) less a little, at most stop to the line.
func TestFaultDownForFromFirstFailure(t *testing.T) {
	race.SkipTiming(t)
	const outage = 2500 * time.Millisecond
	for _, how := range []string{"sigstop", "kill"} {
		t.Run(how, func(t *testing.T) {
			r := startRedis(t)
			f := startFleet(t, r.url(), 1, "policies:\n  - name: api\n    limit: fixed_window 1000000000/1h\n", "--failure-policy", "local")
			p := f.procs[0]
			l := f.drive(2, "k", "api")
			defer l.finish()
			time.Sleep(300 * time.Millisecond)
			stopped := time.Now()
			if how == "sigstop" {
				r.pause(t)
			} else {
				r.Stop()
			}
			time.Sleep(outage)
			if how == "sigstop" {
				r.resume(t)
			} else {
				r.restart(t) // returns once Redis is ready
			}
			restarted := time.Now()
			var line string
			for deadline := time.Now().Add(10 * time.Second); line == ""; time.Sleep(5 * time.Millisecond) {
				for l := range strings.Lines(p.stderr.String()) {
					if strings.Contains(l, `msg="store back"`) {
						line = l
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("no store back line:\n%s", p.stderr.String())
				}
			}
			seen := time.Now()
			_, v, ok := strings.Cut(line, "down_for=")
			if !ok {
				t.Fatalf("store back line %q: no down_for", line)
			}
			downFor, err := time.ParseDuration(strings.Fields(v)[0])
			if err != nil {
				t.Fatalf("store back line %q: %v", line, err)
			}
			// The decisions in flight at the stop fail within the decision
			// timeout (or at once, refused).
			const tolerance = 200 * time.Millisecond
			if lo, hi := restarted.Sub(stopped)-tolerance, seen.Sub(stopped); downFor < lo || downFor > hi {
				t.Errorf("down_for=%v, want within [%v, %v] (stop to restart %v, less %v; stop to the line seen):\n%s",
					downFor, lo, hi, restarted.Sub(stopped), tolerance, p.stderr.String())
			}
		})
	}
}
