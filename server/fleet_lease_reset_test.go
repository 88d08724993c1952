//go:build unix

package server

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFleetLeaseResetReachesDenyCache: two `sluice serve` instances on one
// Redis, a policy leased for D = 1s. A cost above the lease size (at most
// 100 / (2 × 2) = 25) goes to Redis's Take, and instance B's deny cache keeps Redis's denial; a Reset
// through instance A must reach B within D, as the README says of leased
// policies (the denial alone would last until the hour's window ends).
func TestFleetLeaseResetReachesDenyCache(t *testing.T) {
	race.SkipTiming(t)
	const d = time.Second
	f := startFleet(t, "redis://"+redistest.Addr(t), 2, `
policies:
  - name: fw
    limit: fixed_window 100/hour
    lease: 1s
`)
	a, b := f.procs[0], f.procs[1]
	key := fmt.Sprintf("reset-%d", time.Now().UnixNano())
	check := func(p *proc, cost int) (bool, map[string]any) {
		t.Helper()
		code, js := p.post(t, "/v1/check", fmt.Sprintf(`{"policy":"fw","key":%q,"cost":%d}`, key, cost))
		if code != 200 && code != 429 {
			t.Fatalf("check: %d %v", code, js)
		}
		return js["allowed"] == true, js
	}
	denied := false
	for range 5 { // 2 of cost 50 fill the window
		if ok, _ := check(b, 50); !ok {
			denied = true
			break
		}
	}
	if !denied {
		t.Fatal("cost 50 never denied on a 100/hour key")
	}
	if ok, js := check(b, 50); ok || js["source"] != "deny_cache" {
		t.Fatalf("the denial again: %v; want it from B's deny cache", js)
	}
	if code, js := a.post(t, "/v1/reset", fmt.Sprintf(`{"policy":"fw","key":%q}`, key)); code/100 != 2 {
		t.Fatalf("reset through A: %d %v", code, js)
	}
	reset := time.Now()
	for {
		ok, js := check(b, 50)
		if ok {
			t.Logf("B admitted %v after the reset through A: %v", time.Since(reset).Round(time.Millisecond), js)
			break
		}
		if time.Since(reset) > d+time.Second {
			t.Fatalf("B still denies %v after a reset through A (D %v): %v", time.Since(reset).Round(time.Millisecond), d, js)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
