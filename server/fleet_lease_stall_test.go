//go:build unix

package server

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
)

// TestFaultLeaseStallBoundedByDecisionTimeout: with Redis stalled (CLIENT
// PAUSE ALL), requests on a hot leased key get the failure policy's answer
// within about one --decision-timeout, as on an unleased key: those queued
// behind a grant or return that failed go to the policy's Take rather than
// each sending their own in turn.
func TestFaultLeaseStallBoundedByDecisionTimeout(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	f := startFleet(t, r.url(), 1, `
policies:
  - name: g
    limit: gcra 1000/s burst 50
    key: "{k_g}"
    lease: 50ms
  - name: gx
    limit: gcra 1000/s burst 50
    key: "{k_gx}"
`, "--failure-policy", "local", "--decision-timeout", "50ms")
	url := "http://" + f.procs[0].http + "/v1/check"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 5 * time.Second}
	admin := r.client()
	defer admin.Close()
	for _, policy := range []string{"g", "gx"} {
		const clients, pause = 32, 1500 * time.Millisecond
		var mu sync.Mutex
		var lat []time.Duration
		var wg sync.WaitGroup
		start := time.Now()
		paused, resumed := start.Add(500*time.Millisecond), start.Add(500*time.Millisecond+pause)
		for c := range clients {
			wg.Go(func() {
				for time.Since(start) < 2500*time.Millisecond {
					t0 := time.Now()
					resp, err := client.Post(url, "application/json", strings.NewReader(fmt.Sprintf(`{"policy":%q,"key":"stall"}`, policy)))
					took := time.Since(t0)
					if err != nil {
						t.Errorf("client %d: %v", c, err)
						return
					}
					resp.Body.Close()
					// Requests sent within the pause, answered before it ends.
					if t0.After(paused.Add(20*time.Millisecond)) && t0.Add(took).Before(resumed) {
						mu.Lock()
						lat = append(lat, took)
						mu.Unlock()
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
		slices.Sort(lat)
		if len(lat) < 100 {
			t.Fatalf("policy %s: %d requests within the pause", policy, len(lat))
		}
		p95, worst := lat[len(lat)*95/100], lat[len(lat)-1]
		t.Logf("policy %s, Redis paused: %d requests, median %v, p95 %v, max %v", policy, len(lat), lat[len(lat)/2], p95, worst)
		// One timeout each: the request whose grant failed and those queued
		// behind it are answered by the failure policy (before, the first
		// then waited for a Take too, and earlier each queued request sent
		// a return and a grant in turn: 100–260ms).
		if p95 > 80*time.Millisecond || worst > 150*time.Millisecond {
			t.Errorf("policy %s, Redis paused: p95 %v, max %v; want p95 ≤ 80ms, max ≤ 150ms (decision timeout 50ms)", policy, p95, worst)
		}
		time.Sleep(time.Until(resumed.Add(500 * time.Millisecond)))
	}
}
