package server

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
)

// TestFaultServeSlotClientGone: a /v1/acquire and a /v1/extend whose
// client hangs up while sluice serve waits for a stalled Redis are no
// store failure, under every failure policy: nothing is written (counted
// as 499, where each was a 503 to nobody), and neither /v1/stats nor the
// in-flight metrics count an error (each counted one).
func TestFaultServeSlotClientGone(t *testing.T) {
	race.SkipTiming(t)
	for _, policy := range []string{"local", "closed", "error"} {
		t.Run(policy, func(t *testing.T) {
			r := startRedis(t)
			f := startFleet(t, r.url(), 1, "policies:\n  - name: jobs\n    in_flight: {max: 1, hold: 30s}\n",
				"--failure-policy", policy, "--decision-timeout", "2s")
			p := f.procs[0]
			code, got := p.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
			token, _ := got["token"].(string)
			if code != http.StatusOK || token == "" {
				t.Fatalf("first acquire: %d %v", code, got)
			}
			r.pause(t)
			hangUp(t, p, "/v1/acquire", `{"policy":"jobs","key":"k"}`, 300*time.Millisecond)
			hangUp(t, p, "/v1/extend", `{"token":"`+token+`"}`, 300*time.Millisecond)
			// Redis stays paused until both are counted, so that it never
			// answers them.
			acquires := awaitRequests(t, p, "http", "POST /v1/acquire", 2)
			extends := awaitRequests(t, p, "http", "POST /v1/extend", 1)
			r.resume(t)
			if want := map[string]float64{"200": 1, "499": 1}; !equalCounts(acquires, want) {
				t.Errorf("POST /v1/acquire counted by code %v, want %v", acquires, want)
			}
			if want := map[string]float64{"499": 1}; !equalCounts(extends, want) {
				t.Errorf("POST /v1/extend counted by code %v, want %v", extends, want)
			}
			allowed, denied, errs := decisionCounts(t, p, "jobs")
			if allowed != 1 || denied != 0 || errs != 0 {
				t.Errorf("/v1/stats: allowed %d, denied %d, errors %d; want 1, 0, 0", allowed, denied, errs)
			}
			for _, name := range []string{
				`sluice_inflight_acquires_total{outcome="error",policy="jobs",priority="critical"}`,
				`sluice_inflight_acquires_total{outcome="denied",policy="jobs",priority="critical"}`,
				`sluice_inflight_calls_total{call="extend",outcome="error",policy="jobs"}`,
			} {
				if got := metric(t, p, name); got > 0 {
					t.Errorf("%s = %v, want none", name, got)
				}
			}
		})
	}
}
