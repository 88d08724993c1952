//go:build unix

package server

import (
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
)

// TestFaultLeaseErrorPolicyStallConcurrent: under --failure-policy error,
// with Redis stopped (SIGSTOP), 40 requests at once on a leased key whose
// lease has just ended are answered within about one --decision-timeout,
// as on an unleased key: those queued behind the refill whose call timed
// out get its error at once. Before, each sent its own grant in turn and
// waited its own timeout (max 300–400 ms at 50 ms).
func TestFaultLeaseErrorPolicyStallConcurrent(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	f := startFleet(t, r.url(), 1, `
policies:
  - name: g
    limit: gcra 1000/s burst 100
    key: "{k_g}"
    lease: 50ms
`, "--failure-policy", "error", "--decision-timeout", "50ms")
	url := "http://" + f.procs[0].http + "/v1/check"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 5 * time.Second}
	check := func() (int, error) {
		resp, err := client.Post(url, "application/json", strings.NewReader(`{"policy":"g","key":"stall"}`))
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	const rounds, clients = 6, 40
	var lat []time.Duration
	codes := map[int]int{}
	for round := range rounds {
		// Demand enough for a lease, then let it end holding units: the
		// next request's refill is a regrant, which the others queue
		// behind.
		var wg sync.WaitGroup
		for range 8 {
			wg.Go(func() {
				for range 25 {
					if _, err := check(); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		time.Sleep(60 * time.Millisecond)
		r.pause(t)
		var mu sync.Mutex
		start := make(chan struct{})
		for range clients {
			wg.Go(func() {
				<-start
				t0 := time.Now()
				code, err := check()
				took := time.Since(t0)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					t.Errorf("round %d: %v", round, err)
					return
				}
				lat, codes[code] = append(lat, took), codes[code]+1
			})
		}
		close(start)
		wg.Wait()
		r.resume(t)
		time.Sleep(100 * time.Millisecond)
	}
	slices.Sort(lat)
	if len(lat) != rounds*clients {
		t.Fatalf("%d answers, want %d", len(lat), rounds*clients)
	}
	p99, worst := lat[len(lat)*99/100], lat[len(lat)-1]
	t.Logf("Redis stopped, %d × %d requests at once: median %v, p99 %v, max %v; codes %v", rounds, clients, lat[len(lat)/2], p99, worst, codes)
	if p99 > 100*time.Millisecond || worst > 200*time.Millisecond {
		t.Errorf("p99 %v, max %v; want p99 ≤ 100ms, max ≤ 200ms (decision timeout 50ms)", p99, worst)
	}
	if codes[http.StatusOK] != 0 {
		t.Errorf("codes %v: a decision made with Redis stopped and no failure policy", codes)
	}
}
