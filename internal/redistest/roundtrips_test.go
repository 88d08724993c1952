package redistest_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestRoundTripsSlowest: RoundTrips tells the path's round trip at each
// moment: 10 ms or more (and less than the later 100) through a proxy 5 ms
// each way, then 100 ms or more once it is 50 ms each way, and nothing for
// a span no PING was in flight in.
func TestRoundTripsSlowest(t *testing.T) {
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	proxy.SetDelay(5 * time.Millisecond)
	rt := redistest.WatchRoundTrips(t, proxy.Addr)
	before := time.Now()
	time.Sleep(200 * time.Millisecond)
	near := time.Now()
	proxy.SetDelay(50 * time.Millisecond)
	time.Sleep(300 * time.Millisecond)
	far := time.Now()
	if d := rt.Slowest(before.Add(50*time.Millisecond), near.Add(-50*time.Millisecond)); d < 10*time.Millisecond || d >= 100*time.Millisecond {
		t.Errorf("round trip 5ms each way: slowest %v", d)
	}
	if d := rt.Slowest(far.Add(-100*time.Millisecond), far.Add(-90*time.Millisecond)); d < 100*time.Millisecond {
		t.Errorf("round trip 50ms each way: slowest %v", d)
	}
	if d := rt.Slowest(before.Add(-time.Hour), before.Add(-time.Minute)); d != 0 {
		t.Errorf("an hour before: slowest %v, want 0", d)
	}
}
