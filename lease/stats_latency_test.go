//go:build measure

package lease_test

import (
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/latencytest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// TestStatsLatency measures what Stats costs the requests around it:
// SLUICE_STATS_KEYS keys leased on a stopped clock, then a goroutine
// taking from 1,000 other keys, first alone, then while Stats is called
// over and over. It logs the requests' latency in each phase.
//
//	SLUICE_STATS_KEYS=1000000 go test -tags measure -run TestStatsLatency -v ./lease/
func TestStatsLatency(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SLUICE_STATS_KEYS"))
	if n <= 0 {
		t.Skip("SLUICE_STATS_KEYS not set")
	}
	clock := storetest.NewClock(storetest.T0)
	m := memory.New(&memory.Options{MaxKeys: 2 * n, Clock: clock.Now, SweepInterval: -1})
	defer m.Close()
	s := newLease(t, m, clock, time.Minute, 1000)
	defer s.Close(ctx)
	l := sluice.PerMinute(6_000_000)
	b := time.Now()
	for i := range n {
		take(t, s, "b"+strconv.Itoa(i), l, 1)
	}
	lease.WaitSweep(s)
	t.Logf("built %d keys in %v; Stats %+v", s.Len(), time.Since(b), s.Stats())
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("s", i)
		take(t, s, keys[i], l, 1)
	}
	phase := func(name string, d time.Duration, during func()) {
		latencytest.Phase(t, name, keys, func(k string) error { _, err := s.Take(ctx, k, l, 1); return err }, d, during, nil)
	}
	phase("no Stats", 2*time.Second, nil)
	phase("Stats over and over", 0, func() {
		calls := 0
		var st lease.Stats
		var slowest time.Duration
		for a := time.Now(); time.Since(a) < 2*time.Second; calls++ {
			c := time.Now()
			st = s.Stats()
			slowest = max(slowest, time.Since(c))
		}
		t.Logf("%d Stats calls, slowest %v; the last: Keys %d, Leased %d", calls, slowest, st.Keys, st.Leased)
	})
}
