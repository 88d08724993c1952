//go:build unix

package server

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestFaultLeaseStallBoundedByDecisionTimeout: with Redis stalled (CLIENT
// PAUSE ALL), requests on a hot leased key get the failure policy's answer
// within about one --decision-timeout, as on an unleased key: those queued
// behind a grant or return that failed go to the policy's Take rather than
// each sending their own in turn.
func TestFaultLeaseStallBoundedByDecisionTimeout(t *testing.T) {
	s := startLeaseStall(t, "local", `
policies:
  - name: g
    limit: gcra 1000/s burst 50
    key: "{k_g}"
    lease: 50ms
  - name: gx
    limit: gcra 1000/s burst 50
    key: "{k_gx}"
`, leaseStallTimeout)
	admin := s.redis.client()
	defer admin.Close()
	for _, policy := range []string{"g", "gx"} {
		const clients, pause = 32, 1500 * time.Millisecond
		var lat stallTimes
		var wg sync.WaitGroup
		start := time.Now()
		paused, resumed := start.Add(500*time.Millisecond), start.Add(500*time.Millisecond+pause)
		for c := range clients {
			wg.Go(func() {
				for time.Since(start) < 2500*time.Millisecond {
					t0 := time.Now()
					code, took, err := s.check(policy)
					if err != nil {
						t.Errorf("client %d: %v", c, err)
						return
					}
					// Requests sent within the pause, answered before it ends.
					if t0.After(paused.Add(20*time.Millisecond)) && t0.Add(took).Before(resumed) {
						lat.add(took, code)
					}
					time.Sleep(50 * time.Millisecond)
				}
			})
		}
		time.Sleep(time.Until(paused))
		if err := admin.Do(context.Background(), "CLIENT", "PAUSE", pause.Milliseconds(), "ALL").Err(); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		if lat.len() < 100 {
			t.Fatalf("policy %s: %d requests within the pause", policy, lat.len())
		}
		// One timeout each: the request whose grant failed and those queued
		// behind it are answered by the failure policy (before, the first
		// then waited for a Take too, and earlier each queued request sent
		// a return and a grant in turn: 100–260ms).
		lat.bound(t, fmt.Sprintf("policy %s, Redis paused", policy), s.timeout, 95, leaseStallTimeout*7/4, 5*leaseStallTimeout)
		time.Sleep(time.Until(resumed.Add(500 * time.Millisecond)))
	}
}

// leaseStallTimeout is the test's decision timeout: long beside the delays
// a loaded machine adds (at 50ms, p95 up to 310ms on the unleased policy
// too), so that one timeout and two stay apart.
const leaseStallTimeout = 200 * time.Millisecond
