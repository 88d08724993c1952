//go:build unix && measure

// Measurements, not checks: built with -tags measure.

package server

import (
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLayeredMixedService measures layered leased checks through the
// service on a GCRA key that single requests share: 4 `sluice serve`
// processes on one private Redis; on each, SLUICE_LAYERED_MIXED paced
// clients (a request per 4 ms at most) send one /json request with a GCRA
// 1000/s burst 100 and a fixed window 300/s descriptor, both leased at
// 50 ms, and as many send the GCRA descriptor alone, for 5 s, beside as
// many sending the same to exact twins. It logs the GCRA units admitted
// per second. SLUICE_LAYERED_SINGLE=only sends the single requests alone.
//
//	SLUICE_LAYERED_MIXED=8 go test -tags measure -run TestLayeredMixedService -v ./server/
func TestLayeredMixedService(t *testing.T) {
	clients, _ := strconv.Atoi(os.Getenv("SLUICE_LAYERED_MIXED"))
	if clients <= 0 {
		t.Skip("SLUICE_LAYERED_MIXED not set")
	}
	singleOnly := os.Getenv("SLUICE_LAYERED_SINGLE") == "only"
	const procs, pace, run = 4, 4 * time.Millisecond, 5 * time.Second
	f := startFleet(t, startRedis(t).url(), procs, `
domain: m
policies:
  - name: g
    limit: gcra 1000/s burst 100
    lease: 50ms
  - name: f
    limit: fixed_window 300/s
    lease: 50ms
  - name: gx
    limit: gcra 1000/s burst 100
  - name: fx
    limit: fixed_window 300/s
`)
	f.awaitFleetSize(t, procs, 10*time.Second)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}, Timeout: 5 * time.Second}
	defer client.CloseIdleConnections()
	desc := func(policy string) string {
		return fmt.Sprintf(`{"entries":[{"key":"policy","value":%q},{"key":"key","value":"k"}]}`, policy)
	}
	bodies := [2][2]string{ // [leased][layered]
		{`{"domain":"m","descriptors":[` + desc("gx") + `]}`, `{"domain":"m","descriptors":[` + desc("gx") + `,` + desc("fx") + `]}`},
		{`{"domain":"m","descriptors":[` + desc("g") + `]}`, `{"domain":"m","descriptors":[` + desc("g") + `,` + desc("f") + `]}`},
	}
	var perSec [2][2][6]atomic.Int64 // [leased][layered][second]: GCRA units admitted
	var failed atomic.Pointer[string]
	start := time.Now()
	var wg sync.WaitGroup
	for _, p := range f.procs {
		for range clients {
			for leased := range 2 {
				for layered := range 2 {
					if singleOnly && layered == 1 {
						continue
					}
					wg.Go(func() {
						next := time.Now()
						for time.Since(start) < run {
							resp, err := client.Post("http://"+p.http+"/json", "application/json", strings.NewReader(bodies[leased][layered]))
							if err != nil {
								why := err.Error()
								failed.Store(&why)
								return
							}
							resp.Body.Close()
							switch resp.StatusCode {
							case http.StatusOK:
								perSec[leased][layered][min(int(time.Since(start)/time.Second), 5)].Add(1)
							case http.StatusTooManyRequests:
							default:
								why := resp.Status
								failed.Store(&why)
								return
							}
							next = next.Add(pace)
							if wait := time.Until(next); wait > 0 {
								time.Sleep(wait)
							} else {
								next = time.Now()
							}
						}
					})
				}
			}
		}
	}
	wg.Wait()
	if why := failed.Load(); why != nil {
		t.Fatalf("a request failed: %s", *why)
	}
	t.Logf("started %v into a fixed window; %d clients of each kind per instance", time.Duration(start.UnixNano())%time.Second, clients)
	var full [2]int64
	for i := range 5 {
		var sum [2]int64
		for leased := range 2 {
			sum[leased] = perSec[leased][0][i].Load() + perSec[leased][1][i].Load()
			if i >= 1 {
				full[leased] += sum[leased]
			}
		}
		t.Logf("  second %d: GCRA units leased %d (layered %d, single %d), exact %d (layered %d, single %d)", i,
			sum[1], perSec[1][1][i].Load(), perSec[1][0][i].Load(), sum[0], perSec[0][1][i].Load(), perSec[0][0][i].Load())
	}
	t.Logf("seconds 1-4: leased %d, exact %d: %.1f%% fewer", full[1], full[0], 100*float64(full[0]-full[1])/float64(full[0]))
	for _, p := range f.procs {
		t.Logf("  instance: lease forfeited %v, lost %v, returned %v, granted %v", metric(t, p, "sluice_lease_units_forfeited_total"), metric(t, p, "sluice_lease_units_lost_total"), metric(t, p, "sluice_lease_units_returned_total"), metric(t, p, "sluice_lease_units_granted_total"))
	}
}
