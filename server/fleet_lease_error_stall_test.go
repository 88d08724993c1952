//go:build unix

package server

import (
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestFaultLeaseErrorPolicyStallConcurrent: under --failure-policy error,
// with Redis stopped (SIGSTOP), 40 requests at once on a leased key whose
// lease has just ended are answered within about one --decision-timeout,
// as on an unleased key: those queued behind the refill whose call timed
// out get its error at once. Before, each sent its own grant in turn and
// waited its own timeout (max 300–400 ms at 50 ms).
func TestFaultLeaseErrorPolicyStallConcurrent(t *testing.T) {
	s := startLeaseStall(t, "error", `
policies:
  - name: g
    limit: gcra 1000/s burst 100
    key: "{k_g}"
    lease: 50ms
`, stallDecisionTimeout)
	const rounds, clients = 6, 40
	var lat stallTimes
	for round := range rounds {
		// Demand enough for a lease, then let it end holding units: the
		// next request's refill is a regrant, which the others queue
		// behind.
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 25 {
					if _, _, err := s.check("g"); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		time.Sleep(60 * time.Millisecond)
		s.redis.pause(t)
		start := make(chan struct{})
		for range clients {
			wg.Go(func() {
				<-start
				code, took, err := s.check("g")
				if err != nil {
					t.Errorf("round %d: %v", round, err)
					return
				}
				lat.add(took, code)
			})
		}
		close(start)
		wg.Wait()
		s.redis.resume(t)
		time.Sleep(100 * time.Millisecond)
	}
	if lat.len() != rounds*clients {
		t.Fatalf("%d answers, want %d", lat.len(), rounds*clients)
	}
	lat.bound(t, fmt.Sprintf("Redis stopped, %d × %d requests at once", rounds, clients), s.timeout, 99, 100*time.Millisecond, 200*time.Millisecond)
	if lat.codes[http.StatusOK] != 0 {
		t.Errorf("codes %v: a decision made with Redis stopped and no failure policy", lat.codes)
	}
}
