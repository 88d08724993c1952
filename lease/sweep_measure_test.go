//go:build measure

// Measurements, not checks: built with -tags measure (see each one).

package lease_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/latencytest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// TestSweepLatency measures what a sweep of a large table costs the
// requests around it: SLUICE_SWEEP_KEYS idle keys (a burst, leased for
// 500 ms, built on a stopped clock) on a memory store, then SLUICE_SWEEP_WORKERS goroutines (1 by default)
// taking from 1,000 other keys for 10 s on the running clock, during which
// the burst's leases end and a timed sweep forgets them. It logs the
// requests' latency: p50 to max, and the slowest with when they started.
//
//	SLUICE_SWEEP_KEYS=1000000 go test -tags measure -run TestSweepLatency -v ./lease/
func TestSweepLatency(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SLUICE_SWEEP_KEYS"))
	if n <= 0 {
		t.Skip("SLUICE_SWEEP_KEYS not set")
	}
	m := memory.New(&memory.Options{MaxKeys: 4 * n, SweepInterval: -1})
	defer m.Close()
	t0 := time.Now()
	var start atomic.Pointer[time.Time] // nil: the clock is stopped at t0
	clock := func() time.Time {
		if p := start.Load(); p != nil {
			return t0.Add(time.Since(*p))
		}
		return t0
	}
	s, err := lease.New(m, &lease.Options{
		For: func(key string, _ sluice.Limit) time.Duration {
			if strings.HasPrefix(key, "b") {
				return 500 * time.Millisecond
			}
			return 50 * time.Millisecond
		},
		Size:  4,
		Clock: clock,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	l := sluice.PerMinute(6_000_000)
	var worst time.Duration
	b := time.Now()
	for i := range n {
		a := time.Now()
		take(t, s, fmt.Sprint("b", i), l, 1)
		worst = max(worst, time.Since(a))
	}
	t.Logf("built %d keys in %v, slowest take %v", s.Len(), time.Since(b), worst)
	lease.WaitSweep(s)
	var chunks []time.Time // when the sweeps' goroutine began each chunk
	lease.PauseSweeps(s, func() { chunks = append(chunks, time.Now()) })
	now := time.Now()
	start.Store(&now)
	type rec struct{ at, lat time.Duration }
	var (
		mu  sync.Mutex
		all []rec
		wg  sync.WaitGroup
	)
	const run = 10 * time.Second
	workers, _ := strconv.Atoi(os.Getenv("SLUICE_SWEEP_WORKERS"))
	for w := range max(workers, 1) {
		wg.Go(func() {
			var mine []rec
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for time.Since(now) < run {
				a := time.Now()
				take(t, s, fmt.Sprint("s", r.IntN(1000)), l, 1)
				mine = append(mine, rec{a.Sub(now), time.Since(a)})
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	lats := make([]time.Duration, len(all))
	for i, r := range all {
		lats[i] = r.lat
	}
	slices.Sort(lats)
	q := func(p float64) time.Duration { return lats[int(p*float64(len(lats)-1))] }
	t.Logf("%d requests: p50 %v, p99 %v, p99.9 %v, p99.99 %v, max %v; %d keys left", len(lats), q(.5), q(.99), q(.999), q(.9999), lats[len(lats)-1], s.Len())
	lease.WaitSweep(s)
	var walks []time.Duration // a chunk's walk, and whatever held up its goroutine
	for i := 1; i < len(chunks); i++ {
		walks = append(walks, chunks[i].Sub(chunks[i-1]))
	}
	if len(walks) > 0 {
		slices.Sort(walks)
		from, to := chunks[0].Sub(now), chunks[len(chunks)-1].Sub(now)
		var in, out time.Duration // the slowest request started during the sweep, and outside it
		for _, r := range all {
			if r.at >= from && r.at <= to {
				in = max(in, r.lat)
			} else {
				out = max(out, r.lat)
			}
		}
		t.Logf("%d chunks walked by the goroutine from %v to %v: p50 %v, p99 %v, p99.9 %v, max %v apart; slowest request during it %v, outside it %v",
			len(walks), from.Round(time.Millisecond), to.Round(time.Millisecond),
			walks[len(walks)/2], walks[len(walks)*99/100], walks[len(walks)*999/1000], walks[len(walks)-1], in, out)
	}
	slices.SortFunc(all, func(a, b rec) int { return int(b.lat - a.lat) })
	for _, r := range all[:5] {
		t.Logf("started at %v: %v", r.at.Round(time.Millisecond), r.lat)
	}
}

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
