package lease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/releasetest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/storetest"
)

var ctx = context.Background()

// counting wraps a Granter, counting its calls and the units given back,
// and moving the clock forward by delay while a grant is on its way: the
// store dates the grant delay after it was sent.
type counting struct {
	sluice.Granter
	clock    *storetest.Clock
	delay    time.Duration
	mu       sync.Mutex
	grants   int
	asked    []int64 // each grant's size
	returns  int
	returned int64
}

func (c *counting) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	c.mu.Lock()
	c.grants++
	c.asked = append(c.asked, n)
	c.mu.Unlock()
	c.clock.Advance(c.delay)
	return c.Granter.Grant(ctx, key, l, n)
}

func (c *counting) Return(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused int64) (int64, error) {
	n, err := c.Granter.Return(ctx, key, l, g, unused)
	c.mu.Lock()
	c.returns++
	c.returned += n
	c.mu.Unlock()
	return n, err
}

func newMemory(t *testing.T, clock *storetest.Clock) *memory.Store {
	m := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { m.Close() })
	return m
}

func newLease(t *testing.T, g sluice.Granter, clock *storetest.Clock, d time.Duration, size int64) *lease.Store {
	t.Helper()
	s, err := lease.New(g, &lease.Options{MaxStaleness: d, Size: size, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// counted returns a clock at T0, a counting granter over a memory store
// whose grants take delay, and a Store of leases of size and staleness d.
func counted(t *testing.T, delay, d time.Duration, size int64) (*storetest.Clock, *counting, *lease.Store) {
	t.Helper()
	clock := storetest.NewClock(storetest.T0)
	c := &counting{Granter: newMemory(t, clock), clock: clock, delay: delay}
	return clock, c, newLease(t, c, clock, d, size)
}

func take(t *testing.T, s *lease.Store, key string, l sluice.Limit, cost int64) sluice.Decision {
	t.Helper()
	d, err := s.Take(ctx, key, l, cost)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	for _, d := range []time.Duration{0, -time.Second, time.Nanosecond, lease.MinStaleness - 1} {
		if _, err := lease.New(m, &lease.Options{MaxStaleness: d}); !errors.Is(err, lease.ErrInvalidStaleness) {
			t.Errorf("MaxStaleness %v: err = %v, want ErrInvalidStaleness", d, err)
		}
	}
	if _, err := lease.New(m, nil); !errors.Is(err, lease.ErrInvalidStaleness) {
		t.Errorf("nil options: err = %v, want ErrInvalidStaleness", err)
	}
	if _, err := lease.New(m, &lease.Options{MaxStaleness: time.Second, Size: -1}); !errors.Is(err, lease.ErrInvalidOptions) {
		t.Errorf("Size -1: err = %v, want ErrInvalidOptions", err)
	}
	if _, err := lease.New(nil, &lease.Options{MaxStaleness: time.Second}); !errors.Is(err, lease.ErrNoGranter) {
		t.Errorf("nil granter: err = %v, want ErrNoGranter", err)
	}
	s := newLease(t, m, clock, 2*time.Second, 0)
	for _, c := range []struct {
		name string
		l    sluice.Limit
		cost int64
		want error
	}{
		{"staleness_above_period", sluice.PerSecond(10), 1, lease.ErrInvalidStaleness},
		{"cost", sluice.PerMinute(10), 0, sluice.ErrInvalidCost},
		{"limit", sluice.Limit{Rate: 1}, 1, sluice.ErrInvalidLimit},
	} {
		if _, err := s.Take(ctx, "k", c.l, c.cost); !errors.Is(err, c.want) {
			t.Errorf("%s: Take err = %v, want %v", c.name, err, c.want)
		}
		if _, err := s.Peek(ctx, "k", c.l, c.cost); !errors.Is(err, c.want) {
			t.Errorf("%s: Peek err = %v, want %v", c.name, err, c.want)
		}
	}
	var zero lease.Store
	if _, err := zero.Take(ctx, "k", sluice.PerMinute(1), 1); !errors.Is(err, lease.ErrNoGranter) {
		t.Errorf("zero Store: err = %v, want ErrNoGranter", err)
	}
	if err := zero.Close(ctx); err != nil {
		t.Errorf("zero Store: Close = %v", err)
	}
}

// One grant serves Size requests in memory; the next request asks again.
func TestLocal(t *testing.T) {
	t.Parallel()
	_, c, s := counted(t, 0, 300*time.Millisecond, 5)
	l := sluice.PerSecond(10)
	for i := range 5 {
		d := take(t, s, "k", l, 1)
		want := sluice.SourceLease
		if i == 0 {
			want = sluice.SourceBackend
		}
		// Remaining is the key's: the store's 5 after the grant, plus
		// what the lease has not spent.
		if !d.Allowed || d.Remaining != int64(9-i) || d.Source != want {
			t.Fatalf("take %d = %+v, want allowed, remaining %d from %v", i, d, 9-i, want)
		}
	}
	if c.grants != 1 {
		t.Fatalf("grants = %d, want 1", c.grants)
	}
	if d, err := s.Peek(ctx, "k", l, 1); err != nil || d.Source != sluice.SourceBackend || d.Remaining != 5 {
		t.Fatalf("Peek of a spent lease = %+v, %v; want the store's: 5 left", d, err)
	}
	take(t, s, "k", l, 1)
	if c.grants != 2 {
		t.Fatalf("grants = %d, want 2", c.grants)
	}
	if d, err := s.Peek(ctx, "k", l, 4); err != nil || !d.Allowed || d.Source != sluice.SourceLease || d.Remaining != 4 {
		t.Fatalf("Peek 4 = %+v, %v; want allowed from the lease, 4 left", d, err)
	}
	if d := take(t, s, "k", l, 4); !d.Allowed || d.Remaining != 0 {
		t.Fatalf("take 4 after Peek = %+v; Peek took something", d)
	}
}

// A lease lives MaxStaleness from when its grant was sent, however late the
// store dated it; its unused units then go back under the return rule.
func TestLifetimeFromSend(t *testing.T) {
	t.Parallel()
	clock, c, s := counted(t, 100*time.Millisecond, 300*time.Millisecond, 10)
	l := sluice.PerSecond(10)
	take(t, s, "k", l, 1) // sent at 0, dated 100ms
	clock.Set(storetest.T0.Add(300 * time.Millisecond))
	if d := take(t, s, "k", l, 1); d.Source != sluice.SourceLease || c.grants != 1 {
		t.Fatalf("at D: %+v after %d grants; want the lease", d, c.grants)
	}
	clock.Advance(time.Microsecond)
	take(t, s, "k", l, 1)
	if c.grants != 2 || c.returns != 1 {
		t.Fatalf("after D: %d grants, %d returns; want 2, 1", c.grants, c.returns)
	}
	// 8 unused at age 200ms+1µs: 3 intervals begun, 5 back.
	if c.returned != 5 {
		t.Fatalf("returned %d, want 5", c.returned)
	}
}

// A grant that comes back after its lease's end cannot be spent: the
// request is answered exactly by the store, never denied with a negative
// retry time.
func TestGrantArrivesExpired(t *testing.T) {
	t.Parallel()
	_, c, s := counted(t, 400*time.Millisecond, 300*time.Millisecond, 5)
	l := sluice.PerSecond(10)
	d := take(t, s, "k", l, 1)
	if !d.Allowed || d.RetryAfter != 0 || d.Source == sluice.SourceLease || c.grants != 1 {
		t.Fatalf("grant back after D: %+v after %d grants; want an exact answer", d, c.grants)
	}
	// The store charged the grant (5) and the exact take (1).
	if d, err := c.Granter.Peek(ctx, "k", l, 1); err != nil || d.Remaining != 4 {
		t.Fatalf("store: %+v, %v; want 4 left", d, err)
	}
}

// A zero grant is remembered until the key's retry time.
func TestDenyRemembered(t *testing.T) {
	t.Parallel()
	clock, c, s := counted(t, 0, 300*time.Millisecond, 10)
	l := sluice.PerSecond(10)
	take(t, s, "k", l, 10)
	d := take(t, s, "k", l, 1)
	if d.Allowed || d.RetryAfter != 100*time.Millisecond || d.Source != sluice.SourceBackend {
		t.Fatalf("empty: %+v, want denied for 100ms by the store", d)
	}
	clock.Advance(99 * time.Millisecond)
	if d := take(t, s, "k", l, 1); d.Allowed || d.Source != sluice.SourceDenyCache || d.RetryAfter != time.Millisecond || c.grants != 2 {
		t.Fatalf("remembered: %+v after %d grants", d, c.grants)
	}
	clock.Advance(time.Millisecond)
	if d := take(t, s, "k", l, 1); !d.Allowed || c.grants != 3 {
		t.Fatalf("at the retry time: %+v after %d grants", d, c.grants)
	}
}

// Close returns the unused units; Reset drops the lease and the key.
func TestCloseReset(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	s := newLease(t, m, clock, 300*time.Millisecond, 10)
	l := sluice.PerSecond(10)
	take(t, s, "k", l, 3)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if d, err := m.Peek(ctx, "k", l, 1); err != nil || d.Remaining != 7 {
		t.Fatalf("after Close: %+v, %v; want 7 left", d, err)
	}
	if got, want := s.Stats(), (lease.Stats{Grants: 1, Granted: 10, Returned: 7}); got != want {
		t.Fatalf("Stats() = %+v, want %+v", got, want)
	}
	take(t, s, "k", l, 3)
	take(t, s, "k", l, 1)
	if got := s.Stats(); got.Local != 1 || got.Keys != 1 {
		t.Fatalf("Stats() = %+v, want Local 1 (the second take), Keys 1", got)
	}
	if err := s.Reset(ctx, "k", l); err != nil {
		t.Fatal(err)
	}
	if d := take(t, s, "k", l, 1); !d.Allowed || d.Source != sluice.SourceBackend || d.Remaining != 9 {
		t.Fatalf("after Reset: %+v; want a fresh grant", d)
	}
}

// A Reset whose ctx is already cancelled still drops the local lease (its
// unused units are not returned) and reports the cancellation; the store's
// reset did not happen here, and a memory store says so.
func TestResetCancelledDropsLease(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	s := newLease(t, m, clock, 300*time.Millisecond, 10)
	l := sluice.PerSecond(10)
	take(t, s, "k", l, 3) // a lease of 10, 7 left locally, none in the store
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := s.Reset(cancelled, "k", l); !errors.Is(err, context.Canceled) {
		t.Fatalf("Reset with a cancelled ctx = %v, want context.Canceled", err)
	}
	if got := s.Len(); got != 0 {
		t.Errorf("Len after a cancelled Reset = %d, want 0 (the lease dropped)", got)
	}
	// The 7 local units are gone, and the store's key was not reset.
	if d := take(t, s, "k", l, 1); d.Allowed || d.Source != sluice.SourceBackend {
		t.Errorf("after a cancelled Reset: %+v, want denied by the store (no lease left, key not reset)", d)
	}
	if got := s.Stats(); got.Returned != 0 {
		t.Errorf("Stats().Returned = %d, want 0 (a Reset returns nothing)", got.Returned)
	}
}

// Each process's lease is independent and safe under concurrent use: the
// fleet admits exactly what the store granted.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	l := sluice.PerMinute(1000)
	var admitted sync.WaitGroup
	var mu sync.Mutex
	total := 0
	for range 4 {
		s := newLease(t, m, clock, time.Second, 7)
		for range 8 {
			admitted.Add(1)
			go func() {
				defer admitted.Done()
				for range 100 {
					if d, err := s.Take(ctx, "k", l, 1); err == nil && d.Allowed {
						mu.Lock()
						total++
						mu.Unlock()
					}
				}
			}()
		}
	}
	admitted.Wait()
	if total > 1000 || total < 1000-4*7 {
		t.Fatalf("admitted %d of 1000; at most the 4 leases' units may be stranded", total)
	}
}

// A fixed window's lease ends with its window, however long MaxStaleness,
// and its unused units do not pass into the next window.
func TestWindowEnd(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0.Add(500 * time.Millisecond))
	c := &counting{Granter: newMemory(t, clock), clock: clock}
	s := newLease(t, c, clock, 800*time.Millisecond, 4)
	l := sluice.PerSecond(10).WithAlgorithm(sluice.FixedWindow)
	take(t, s, "k", l, 1)
	clock.Set(storetest.T0.Add(time.Second - time.Microsecond))
	if d := take(t, s, "k", l, 1); d.Source != sluice.SourceLease {
		t.Fatalf("1µs before the window's end: %+v, want the lease", d)
	}
	clock.Advance(time.Microsecond)
	d := take(t, s, "k", l, 1)
	if d.Source != sluice.SourceBackend || d.Remaining != 9 || c.grants != 2 {
		t.Fatalf("at the next window: %+v after %d grants; want a new grant", d, c.grants)
	}
	if c.returns != 1 || c.returned != 0 {
		t.Fatalf("%d returns of %d units; want the 2 unused sent back once, and none taken back: their window has gone", c.returns, c.returned)
	}
	if p, err := c.Peek(ctx, "k", l, 1); err != nil || p.Remaining != 6 {
		t.Fatalf("store after the new grant: %+v, %v; want 6 left in the new window", p, err)
	}
}

// Idle leases are swept once the table has grown: a flood of cold keys
// cannot grow a Store without bound.
func TestSweep(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	s := newLease(t, newMemory(t, clock), clock, 300*time.Millisecond, 1)
	l := sluice.PerMinute(10)
	const cold = 9_998 // with "two" under two limits, the 10,000 that start a sweep
	// "two" has a spent lease under l and, under one, a remembered
	// denial, which the sweep must keep.
	one := sluice.PerMinute(1)
	take(t, s, "two", l, 1)
	take(t, s, "two", one, 1)
	if d := take(t, s, "two", one, 1); d.Allowed {
		t.Fatalf("second take under %v: %+v, want denied", one, d)
	}
	for i := range cold {
		take(t, s, fmt.Sprint("cold-", i), l, 1) // each lease spent at once
	}
	if got := s.Len(); got != cold+2 {
		t.Fatalf("Len = %d, want %d before a sweep", got, cold+2)
	}
	take(t, s, "next", l, 1) // the table is full: the spent leases go
	lease.WaitSweep(s)
	// next, idle once answered, goes too unless the sweep passed its slot
	// while its request was out.
	if got := s.Len(); got < 1 || got > 2 {
		t.Fatalf("Len = %d after the sweep, want the denial (and perhaps next)", got)
	}
	if d := take(t, s, "two", one, 1); d.Allowed || d.Source != sluice.SourceDenyCache {
		t.Fatalf("under %v after the sweep: %+v, want the remembered denial", one, d)
	}
}

// A burst of hot keys that then go idle is swept on the clock, and its
// tables shrink, with no further growth of the table to start a sweep:
// within a second (sweepEvery) of their D passing, at the next request.
// A key asked for less often than that but within its D keeps its demand.
func TestSweepOnTheClock(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	d := map[string]time.Duration{}
	s, err := lease.New(newMemory(t, clock), &lease.Options{
		For: func(key string, _ sluice.Limit) time.Duration {
			if v, ok := d[key]; ok {
				return v
			}
			return 300 * time.Millisecond
		},
		Clock: clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	d["slow"] = 10 * time.Second
	l := sluice.PerMinute(6_000_000)
	const burst = 4_000 // fewer than start a sweep by growth
	for i := range burst {
		for range 8 { // hot: leased
			take(t, s, fmt.Sprint("hot-", i), l, 1)
		}
	}
	take(t, s, "slow", l, 1)
	if st := s.Stats(); st.Keys != burst+1 || st.Leased < burst {
		t.Fatalf("after the burst: %+v, want %d keys, the burst's leased", st, burst+1)
	}
	grown := lease.Slots(s)
	clock.Advance(900 * time.Millisecond) // the leases have ended, but a sweep is not due
	take(t, s, "slow", l, 1)
	if got := s.Len(); got != burst+1 {
		t.Fatalf("Len = %d before a sweep is due, want %d", got, burst+1)
	}
	clock.Advance(200 * time.Millisecond) // a second since New
	take(t, s, "after", l, 1)
	lease.WaitSweep(s)
	if got := s.Len(); got != 2 {
		t.Fatalf("Len = %d a second after the burst, want 2 (slow and after)", got)
	}
	if got := lease.Slots(s); got >= grown/4 {
		t.Fatalf("%d slots after the sweep, want under a quarter of the burst's %d", got, grown)
	}
	// "slow", last asked for at 0.9 s, is kept until its D of 10 s has
	// passed.
	clock.Advance(8 * time.Second)
	take(t, s, "after", l, 1)
	lease.WaitSweep(s)
	if got := s.Len(); got != 2 {
		t.Fatalf("Len = %d 8.2 s after slow was asked for, want 2", got)
	}
	clock.Advance(2 * time.Second)
	take(t, s, "after", l, 1)
	lease.WaitSweep(s)
	if got := s.Len(); got != 1 {
		t.Fatalf("Len = %d 10.2 s after slow was asked for (D 10 s), want 1", got)
	}
}

// Options.For gives each key its own staleness: zero answers exactly
// through the granter, a positive D leases for D, and one longer than the
// limit's period is refused on that call.
func TestFor(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	c := &counting{Granter: newMemory(t, clock), clock: clock}
	if _, err := lease.New(c, &lease.Options{For: func(string, sluice.Limit) time.Duration { return 0 }}); err != nil {
		t.Fatalf("For without MaxStaleness: %v", err)
	}
	stale := map[string]time.Duration{"exact": 0, "hot": 200 * time.Millisecond, "long": 2 * time.Second, "neg": -time.Millisecond, "tiny": lease.MinStaleness - 1}
	s, err := lease.New(c, &lease.Options{
		For:   func(key string, _ sluice.Limit) time.Duration { return stale[key] },
		Size:  5,
		Clock: clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	l := sluice.PerSecond(10)
	for i := range 3 {
		if d := take(t, s, "exact", l, 1); !d.Allowed || d.Source != sluice.SourceBackend || d.Remaining != int64(9-i) {
			t.Fatalf("exact take %d = %+v, want the store's answer", i, d)
		}
	}
	if c.grants != 0 {
		t.Fatalf("exact key: %d grants, want 0", c.grants)
	}
	if d, err := s.Peek(ctx, "exact", l, 1); err != nil || d.Remaining != 7 {
		t.Fatalf("exact Peek = %+v, %v; want the store's 7", d, err)
	}
	// The sliding window log cannot be leased, but it can be answered exactly.
	if d := take(t, s, "exact", l.WithAlgorithm(sluice.SlidingWindowLog), 1); !d.Allowed {
		t.Fatalf("exact log = %+v, want allowed", d)
	}
	take(t, s, "hot", l, 1)
	clock.Advance(200 * time.Millisecond)
	if d := take(t, s, "hot", l, 1); d.Source != sluice.SourceLease || c.grants != 1 {
		t.Fatalf("hot at D: %+v after %d grants; want the lease", d, c.grants)
	}
	clock.Advance(time.Microsecond)
	if take(t, s, "hot", l, 1); c.grants != 2 {
		t.Fatalf("hot after D: %d grants, want 2", c.grants)
	}
	for _, key := range []string{"long", "neg", "tiny"} {
		if _, err := s.Take(ctx, key, l, 1); !errors.Is(err, lease.ErrInvalidStaleness) {
			t.Errorf("%s: Take err = %v, want ErrInvalidStaleness", key, err)
		}
		if _, err := s.Peek(ctx, key, l, 1); !errors.Is(err, lease.ErrInvalidStaleness) {
			t.Errorf("%s: Peek err = %v, want ErrInvalidStaleness", key, err)
		}
	}
	if _, err := s.Take(ctx, "long", sluice.PerMinute(10), 1); err != nil {
		t.Errorf("long under a minute's period: %v", err)
	}
}

// Adaptive sizing, step by step: a key is leased once this process's
// demand (an EWMA of the units it asks per D) reaches 4, with leases of its
// demand rounded up, capped at Capacity / (2 × fleet size); a key asked
// for twice per D is never leased.
func TestAdaptiveSize(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	c := &counting{Granter: newMemory(t, clock), clock: clock}
	fleet := 1
	s, err := lease.New(c, &lease.Options{MaxStaleness: 100 * time.Millisecond, FleetSize: func() int { return fleet }, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	l := sluice.PerSecond(100) // Capacity 100
	every := func(key string, gap time.Duration, n int) {
		t.Helper()
		for range n {
			take(t, s, key, l, 1)
			clock.Advance(gap)
		}
	}
	// One request every 10ms: demand 1, 1.86, 2.63, 3.33, 3.97 (exact),
	// then 4.54: a lease of 5 at the sixth.
	every("hot", 10*time.Millisecond, 6)
	if got, want := fmt.Sprint(c.asked), "[5]"; got != want {
		t.Fatalf("after 6 requests 10ms apart: grants %v, want %v", got, want)
	}
	// Steady state, 10 per D: leases grow towards 10.
	every("hot", 10*time.Millisecond, 200)
	if n := c.asked[len(c.asked)-1]; n < 9 || n > 10 {
		t.Fatalf("steady 10 per D: grants %v, want the last 9 or 10", c.asked)
	}
	// A fleet of 10: at most 100 / 20 = 5 per lease.
	fleet = 10
	c.asked = nil
	every("hot", 10*time.Millisecond, 50)
	for _, n := range c.asked {
		if n != 5 {
			t.Fatalf("fleet of 10: grants %v, want 5 each", c.asked)
		}
	}
	// A fleet of 200: the cap is 1, no more than a request's cost: exact.
	fleet = 200
	grants := c.grants
	every("hot", 10*time.Millisecond, 20)
	if c.grants != grants {
		t.Fatalf("fleet of 200: %d grants, want none (exact)", c.grants-grants)
	}
	// Twice per D converges to a demand of 2: never leased.
	grants = c.grants
	every("cold", 50*time.Millisecond, 100)
	if c.grants != grants {
		t.Fatalf("cold key: %d grants, want none", c.grants-grants)
	}
	// Four at one instant: demand 4, leased at the fourth.
	fleet = 1
	for i := range 4 {
		grants := c.grants
		// Exact or granted, Remaining is the key's figure.
		if d := take(t, s, "burst", l, 1); d.Source != sluice.SourceBackend || d.Remaining != 99-int64(i) || (c.grants != grants) != (i == 3) {
			t.Fatalf("burst take %d = %+v after %d grants, want a grant only at the fourth", i, d, c.grants-grants)
		}
	}
	if got := c.asked[len(c.asked)-1]; got != 4 {
		t.Fatalf("burst: grant of %d, want 4", got)
	}
	// A lease holds at least two requests of the cost: at one instant
	// costs 2 and 5 make a demand of 7, and a lease of 7 would keep 2
	// units past a request of 5 (units such leases mostly strand), so the
	// store answers it exactly; another 5, demand 12: a lease of 12.
	grants = c.grants
	take(t, s, "weighted", l, 2)
	if d := take(t, s, "weighted", l, 5); !d.Allowed || d.Source != sluice.SourceBackend || c.grants != grants {
		t.Fatalf("weighted: Take(5) at demand 7 = %+v after %d grants (%v); want exact, none", d, c.grants-grants, c.asked)
	}
	if d := take(t, s, "weighted", l, 5); !d.Allowed || c.grants != grants+1 || c.asked[len(c.asked)-1] != 12 {
		t.Fatalf("weighted: Take(5) at demand 12 = %+v, grants %v; want one of 12", d, c.asked)
	}
}

// A lease holds three quarters of its size when the key's last grant left
// the store under half its capacity: units stranded in a lease that ends
// unspent cost admissions only when the store runs short.
func TestLeaseSizeWhenScarce(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	c := &counting{Granter: m, clock: clock}
	s := newLease(t, c, clock, 100*time.Millisecond, 0)
	l := sluice.PerSecond(100) // Capacity 100, a unit per 10ms
	every := func(n int) {
		t.Helper()
		for range n {
			take(t, s, "k", l, 1)
			clock.Advance(10 * time.Millisecond)
		}
	}
	every(100) // 10 per D: leases of 10, the store full
	if n := c.asked[len(c.asked)-1]; n != 10 {
		t.Fatalf("store full: grants %v, want the last of 10", c.asked)
	}
	// Others take the store down to 40; the next lease's grant leaves it
	// under half, and the lease after it holds ⌈10 × 3/4⌉ = 8.
	for range 50 {
		m.Take(ctx, "k", l, 1)
	}
	grants := len(c.asked)
	every(20)
	if got := c.asked[grants+1:]; len(got) == 0 || slices.ContainsFunc(got, func(n int64) bool { return n != 8 }) {
		t.Fatalf("store under half: grants %v, want 8 each after the first", c.asked[grants:])
	}
}

// Layered checks are all-or-nothing: a leased check's units are consumed
// only when every other check admits, whether that other check is leased
// or answered exactly by the store.
func TestTakeAll(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	c := &counting{Granter: m, clock: clock}
	stale := map[string]time.Duration{"a": 100 * time.Millisecond, "c": 100 * time.Millisecond}
	s, err := lease.New(c, &lease.Options{For: func(key string, _ sluice.Limit) time.Duration { return stale[key] }, Size: 5, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	la, lb, lc := sluice.PerSecond(10), sluice.PerMinute(1), sluice.PerSecond(2)
	take(t, s, "a", la, 1) // a's lease holds 4
	takeAll := func(reqs ...sluice.Request) []sluice.Decision {
		t.Helper()
		ds, err := s.TakeAll(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		return ds
	}
	a, b, cc := sluice.Request{Key: "a", Limit: la, Cost: 1}, sluice.Request{Key: "b", Limit: lb, Cost: 1}, sluice.Request{Key: "c", Limit: lc, Cost: 1}
	if ds := takeAll(a, b); !ds[0].Allowed || !ds[1].Allowed || ds[0].Source != sluice.SourceLease || ds[0].Remaining != 8 || ds[1].Remaining != 0 {
		t.Fatalf("both admit: %+v", ds)
	}
	// b (exact, spent) denies: a keeps its units and reports them as Peek
	// would (8 left: the store's 5 and the lease's 3).
	if ds := takeAll(a, b); !ds[0].Allowed || ds[1].Allowed || ds[0].Remaining != 8 {
		t.Fatalf("exact b denies: %+v; want a allowed with 8 left, b denied", ds)
	}
	if d, err := s.Peek(ctx, "a", la, 3); err != nil || !d.Allowed || d.Remaining != 8 || d.Source != sluice.SourceLease {
		t.Fatalf("a's lease after b denied: %+v, %v; want 3 units kept", d, err)
	}
	// c (leased, spent) denies: a keeps its units again.
	take(t, s, "c", lc, 2)
	if ds := takeAll(a, cc); !ds[0].Allowed || ds[1].Allowed || ds[0].Remaining != 8 {
		t.Fatalf("leased c denies: %+v", ds)
	}
	if d, err := s.Peek(ctx, "a", la, 3); err != nil || !d.Allowed || d.Remaining != 8 {
		t.Fatalf("a's lease after c denied: %+v, %v; want 3 units kept", d, err)
	}
	if c.grants != 3 {
		t.Fatalf("%d grants, want 3 (a, c, c's denied refill)", c.grants)
	}
	for _, bad := range [][]sluice.Request{{a, {Key: "a", Limit: sluice.PerHour(1), Cost: 1}}, {a, {Key: "x", Limit: la, Cost: 0}}} {
		if _, err := s.TakeAll(ctx, bad); err == nil {
			t.Errorf("TakeAll(%v): no error", bad)
		}
	}

	// A granter that cannot TakeAll: leased checks are leased, hot or not;
	// two exact ones are refused.
	single, err := lease.New(struct{ sluice.Granter }{m}, &lease.Options{For: func(key string, _ sluice.Limit) time.Duration { return stale[key] }, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	fresh := sluice.Request{Key: "c", Limit: sluice.PerMinute(10), Cost: 1}
	if ds, err := single.TakeAll(ctx, []sluice.Request{fresh, {Key: "b", Limit: lb, Cost: 1}}); err != nil || !ds[0].Allowed || ds[1].Allowed {
		t.Fatalf("fallback: %+v, %v; want c allowed, b denied", ds, err)
	}
	// The forced lease keeps its unit: 1 beside the store's 8 (c's state
	// still holds the units taken under lc).
	if d, err := single.Peek(ctx, "c", fresh.Limit, 1); err != nil || d.Source != sluice.SourceLease || d.Remaining != 9 {
		t.Fatalf("fallback: c's forced lease = %+v, %v; want its unit kept", d, err)
	}
	if _, err := single.TakeAll(ctx, []sluice.Request{{Key: "x", Limit: lb, Cost: 1}, {Key: "y", Limit: lb, Cost: 1}}); !errors.Is(err, lease.ErrNoTakeAll) {
		t.Fatalf("two exact checks without a MultiStore: %v, want ErrNoTakeAll", err)
	}
}

// Reset and config reloads take effect within D: a Reset in one process
// ends another's lease at most D after that lease's grant was sent, and a
// changed limit is another lease, asked of the store at its first request.
func TestResetReloadWithinD(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	const d = 300 * time.Millisecond
	a, b := newLease(t, m, clock, d, 5), newLease(t, m, clock, d, 5)
	l := sluice.PerSecond(10)
	take(t, a, "k", l, 1) // a holds 4, sent at 0
	clock.Advance(100 * time.Millisecond)
	take(t, b, "k", l, 1)
	if err := b.Reset(ctx, "k", l); err != nil {
		t.Fatal(err)
	}
	clock.Set(storetest.T0.Add(d))
	if dec := take(t, a, "k", l, 1); dec.Source != sluice.SourceLease {
		t.Fatalf("a at D: %+v, want its lease still", dec)
	}
	clock.Advance(time.Microsecond)
	// The lease has ended: its 3 unused units go back, 3 intervals old:
	// none; the store, reset, grants 5 from its full 10 (5 left, and 4 in
	// the lease).
	if dec := take(t, a, "k", l, 1); dec.Source != sluice.SourceBackend || dec.Remaining != 9 {
		t.Fatalf("a after D: %+v, want a new grant", dec)
	}
	if p, err := m.Peek(ctx, "k", l, 1); err != nil || p.Remaining != 5 {
		t.Fatalf("store after a's new grant: %+v, %v; want the reset key less 5", p, err)
	}
	l2 := sluice.PerSecond(20)
	if dec := take(t, a, "k", l2, 1); dec.Source != sluice.SourceBackend || dec.Limit != l2 {
		t.Fatalf("a under a reloaded limit: %+v; want a grant under it", dec)
	}
}

// noGrant is a granter whose failure policy holds every grant back.
type noGrant struct{ sluice.Granter }

func (noGrant) Grant(context.Context, string, sluice.Limit, int64) (sluice.Grant, error) {
	return sluice.Grant{}, resilient.ErrNoGrant
}

// Grants held back by a failure policy send the request to the granter's
// Take; in TakeAll, without a MultiStore to take several at once, that is
// ErrNoTakeAll rather than a guess.
func TestNoGrant(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	g := noGrant{newMemory(t, clock)}
	s := newLease(t, g, clock, time.Second, 5)
	l := sluice.PerMinute(10)
	if d := take(t, s, "k", l, 1); !d.Allowed || d.Source != sluice.SourceBackend || d.Remaining != 9 {
		t.Fatalf("Take = %+v, want the store's exact answer", d)
	}
	reqs := []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 1}}
	if _, err := s.TakeAll(ctx, reqs); !errors.Is(err, lease.ErrNoTakeAll) {
		t.Fatalf("TakeAll = %v, want ErrNoTakeAll", err)
	}
	if ds, err := s.TakeAll(ctx, reqs[:1]); err != nil || !ds[0].Allowed {
		t.Fatalf("TakeAll of one = %+v, %v; want it taken exactly", ds, err)
	}
	// A grant sent that failed counts; one a breaker held back does not.
	if st := s.Stats(); st.Grants == 0 {
		t.Errorf("grants sent and failed: Stats %+v, want them counted", st)
	}
	held := newLease(t, heldBack{g}, clock, time.Second, 5)
	take(t, held, "k", l, 1)
	if st := held.Stats(); st.Grants != 0 {
		t.Errorf("grants held back: Stats %+v, want none counted", st)
	}
}

type heldBack struct{ sluice.Granter }

func (heldBack) Grant(context.Context, string, sluice.Limit, int64) (sluice.Grant, error) {
	return sluice.Grant{}, fmt.Errorf("%w: %w", resilient.ErrNoGrant, resilient.ErrNotSent)
}

// A key leased under two limits (a reloaded policy) holds two leases, each
// spent, validated, reset and returned on its own.
func TestOneKeyTwoLimits(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	s := newLease(t, newMemory(t, clock), clock, 2*time.Second, 5)
	a, b := sluice.PerMinute(10), sluice.PerMinute(20)
	for i, c := range []struct {
		l         sluice.Limit
		remaining int64
		source    sluice.Source
	}{
		// Remaining: the store's after the grant (one GCRA state for
		// both: 5 of 10 left under a, 5 of 20 under b), plus the lease's.
		{a, 9, sluice.SourceBackend},
		{b, 9, sluice.SourceBackend},
		{a, 8, sluice.SourceLease},
		{b, 8, sluice.SourceLease},
		{b, 7, sluice.SourceLease},
	} {
		d := take(t, s, "k", c.l, 1)
		if !d.Allowed || d.Remaining != c.remaining || d.Source != c.source || d.Limit != c.l {
			t.Errorf("take %d under %v: %+v, want allowed, Remaining %d from %v", i, c.l, d, c.remaining, c.source)
		}
	}
	if got, want := s.Len(), 2; got != want {
		t.Errorf("Len = %d, want %d", got, want)
	}
	// A leased key's request is validated against its own limit.
	if _, err := s.Take(ctx, "k", a, 11); !errors.Is(err, sluice.ErrCostExceedsBurst) {
		t.Errorf("cost 11 under %v: err = %v, want ErrCostExceedsBurst", a, err)
	}
	if _, err := s.Take(ctx, "k", b, 0); !errors.Is(err, sluice.ErrInvalidCost) {
		t.Errorf("cost 0 under %v: err = %v, want ErrInvalidCost", b, err)
	}
	if err := s.Reset(ctx, "k", a); err != nil {
		t.Fatal(err)
	}
	if got, want := s.Len(), 1; got != want {
		t.Errorf("Len after Reset = %d, want %d", got, want)
	}
	// b's lease lives on and reports the figure of its grant: the reset
	// reaches it within D.
	if d := take(t, s, "k", b, 1); d.Source != sluice.SourceLease || d.Remaining != 6 {
		t.Errorf("under %v after the other's Reset: %+v, want its lease's Remaining 6 (5 + 1)", b, d)
	}
	if d := take(t, s, "k", a, 1); d.Source != sluice.SourceBackend || d.Remaining != 9 {
		t.Errorf("under %v after its Reset: %+v, want a new grant's Remaining 9 (5 + 4)", a, d)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	// b's unit goes nowhere: its grant predates the Reset of the state
	// both limits share, which never charged it.
	if st.Grants != 3 || st.Returned != 4 || st.Keys != 0 {
		t.Errorf("Stats = %+v, want 3 grants, 4 units returned (a's new lease's; none of b's, granted before the Reset), no keys", st)
	}
}

// TestConformance runs the store conformance suite through a lease.Store
// whose keys are never leased (For answers 0): every call must reach the
// granter and come back exactly as the granter's own answer, errors
// included.
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) sluice.Store {
		m := memory.New(&memory.Options{Clock: now})
		s, err := lease.New(m, &lease.Options{For: func(string, sluice.Limit) time.Duration { return 0 }, Clock: now})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close(context.Background()); m.Close() })
		return s
	})
}

// In-flight slots pass through to the granter, unleased; a granter that
// keeps none gives ErrNoSlots, and the zero Store ErrNoGranter.
func TestSlotsPassThrough(t *testing.T) {
	t.Parallel()
	m := memory.New(nil)
	defer m.Close()
	s, err := lease.New(m, &lease.Options{MaxStaleness: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close(ctx)
	l := sluice.Concurrent(1, time.Minute)
	if d, err := s.Acquire(ctx, "k", l, 1, "a"); err != nil || !d.Allowed {
		t.Fatalf("Acquire(a) = %+v, %v", d, err)
	}
	if d, err := m.Acquire(ctx, "k", l, 1, "b"); err != nil || d.Allowed {
		t.Fatalf("the granter admitted b beside a: %+v, %v", d, err)
	}
	if ok, err := s.Extend(ctx, "k", l, "a"); err != nil || !ok {
		t.Fatalf("Extend(a) = %v, %v", ok, err)
	}
	if ok, err := s.Release(ctx, "k", "a"); err != nil || !ok {
		t.Fatalf("Release(a) = %v, %v", ok, err)
	}
	if d, err := m.Acquire(ctx, "k", l, 1, "b"); err != nil || !d.Allowed {
		t.Fatalf("after the release the granter refused b: %+v, %v", d, err)
	}

	bare, err := lease.New(&counting{Granter: m, clock: storetest.NewClock(storetest.T0)}, &lease.Options{MaxStaleness: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer bare.Close(ctx)
	if _, err := bare.Acquire(ctx, "k", l, 1, "c"); !errors.Is(err, lease.ErrNoSlots) {
		t.Errorf("Acquire on a granter without slots: %v, want ErrNoSlots", err)
	}
	if _, err := bare.Release(ctx, "k", "c"); !errors.Is(err, lease.ErrNoSlots) {
		t.Errorf("Release on a granter without slots: %v, want ErrNoSlots", err)
	}
	var zero lease.Store
	if _, err := zero.Extend(ctx, "k", l, "c"); !errors.Is(err, lease.ErrNoGranter) {
		t.Errorf("Extend on the zero Store: %v, want ErrNoGranter", err)
	}
}

// A remembered denial ends D after its grant's send at the latest, so
// that a Reset by another process reaches this one within D, as its
// leases do, whatever the key's own retry time (a window's end, an
// Interval of minutes).
func TestDenyReachesResetWithinD(t *testing.T) {
	t.Parallel()
	for _, l := range []sluice.Limit{sluice.PerMinute(10).WithAlgorithm(sluice.FixedWindow), sluice.PerMinute(10)} {
		clock := storetest.NewClock(storetest.T0.Add(time.Second))
		m := newMemory(t, clock)
		const d = 100 * time.Millisecond
		a, b := newLease(t, m, clock, d, 5), newLease(t, m, clock, d, 5)
		for range 10 {
			take(t, a, "k", l, 1)
		}
		if dec := take(t, a, "k", l, 1); dec.Allowed || dec.RetryAfter <= d {
			t.Fatalf("%v: a, the key spent: %+v; want a denial for longer than D", l, dec)
		}
		if err := b.Reset(ctx, "k", l); err != nil {
			t.Fatal(err)
		}
		if dec := take(t, a, "k", l, 1); dec.Allowed || dec.Source != sluice.SourceDenyCache || dec.RetryAfter <= d {
			t.Fatalf("%v: a within D of its denial: %+v; want it remembered, with the store's retry time", l, dec)
		}
		clock.Advance(d)
		if dec := take(t, a, "k", l, 1); !dec.Allowed {
			t.Errorf("%v: a, D after b's Reset: %+v; want allowed", l, dec)
		}
	}
}

// A request of cost n is told to retry when n units will be there, and
// one that a grant cannot cover is answered by the store until a grant
// covers as much: a client retrying as told is admitted, where returning
// each partial grant at its retry lost units to the return rule each time
// and could deny it forever.
func TestCostBeyondGrant(t *testing.T) {
	t.Parallel()
	l := sluice.PerSecond(10)
	for _, size := range []int64{10, 0} {
		clock := storetest.NewClock(storetest.T0)
		m := newMemory(t, clock)
		s, err := lease.New(m, &lease.Options{MaxStaleness: 300 * time.Millisecond, Size: size, Clock: clock.Now})
		if err != nil {
			t.Fatal(err)
		}
		for range 20 { // hot, and spent
			take(t, s, "k", l, 1)
		}
		exact, _ := m.Peek(ctx, "k", l, 3)
		var d sluice.Decision
		tries := 0
		for tries = 1; tries <= 5; tries++ {
			if d = take(t, s, "k", l, 3); d.Allowed {
				break
			}
			if tries == 1 && d.RetryAfter < exact.RetryAfter {
				t.Errorf("size %d: RetryAfter %v for 3 units; the store's is %v", size, d.RetryAfter, exact.RetryAfter)
			}
			clock.Advance(d.RetryAfter)
		}
		if !d.Allowed {
			t.Errorf("size %d: a cost-3 request retrying as told was denied %d times: %+v", size, tries-1, d)
		}
	}
}

// heldGrant is a granter whose grants wait for release, whatever their
// context says: a store slow to answer.
type heldGrant struct {
	sluice.Granter
	sent    chan struct{}
	release chan struct{}
}

func (h heldGrant) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	h.sent <- struct{}{}
	<-h.release
	return h.Granter.Grant(ctx, key, l, n)
}

// A request queued behind another's grant of the same key leaves when its
// own context ends, with its error, rather than when the grant answers.
func TestRefillWaitKeepsDeadline(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	g := heldGrant{newMemory(t, clock), make(chan struct{}, 1), make(chan struct{})}
	s := newLease(t, g, clock, time.Second, 10)
	l := sluice.PerSecond(100)
	first := make(chan error, 1)
	go func() { _, err := s.Take(ctx, "k", l, 1); first <- err }()
	<-g.sent // the first request's grant is in flight
	cctx, cancel := context.WithCancel(ctx)
	second := make(chan error, 1)
	go func() { _, err := s.Take(cctx, "k", l, 1); second <- err }()
	cancel()
	select {
	case err := <-second:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the queued Take, its context cancelled: %v; want context.Canceled", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the queued Take, its context cancelled, still waits on the other's grant")
	}
	close(g.release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// A key whose grant once fell short of a request is leased again D later,
// even when every request on it has that cost.
func TestShortCostLeasedAgain(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	s := newLease(t, m, clock, 300*time.Millisecond, 20)
	l := sluice.PerSecond(100)
	if _, err := m.Take(ctx, "k", l, 99); err != nil { // 1 unit left
		t.Fatal(err)
	}
	if d := take(t, s, "k", l, 2); d.Allowed {
		t.Fatalf("cost 2 with 1 unit left: %+v; want denied", d)
	}
	clock.Advance(2 * time.Second) // the bucket full again
	for range 200 {
		if d := take(t, s, "k", l, 2); !d.Allowed {
			t.Fatalf("cost 2 at a third of the rate: %+v", d)
		}
		clock.Advance(30 * time.Millisecond)
	}
	if st := s.Stats(); st.Local < 100 {
		t.Errorf("%d of 200 decisions local (%d grants): the key is no longer leased", st.Local, st.Grants)
	}
}

// A request whose context has ended does not start a refill: the lease's
// units stay in it (for Close to return), not taken out for a return the
// store would refuse.
func TestRefillEndedContextKeepsUnits(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	c := &counting{Granter: newMemory(t, clock), clock: clock}
	s := newLease(t, c, clock, 100*time.Millisecond, 50)
	l := sluice.PerSecond(100)
	take(t, s, "k", l, 1) // a lease of 50, 49 left
	clock.Advance(200 * time.Millisecond)
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Take(ended, "k", l, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("Take with an ended context after the lease expired: %v; want context.Canceled", err)
	}
	if c.returns != 0 {
		t.Fatalf("%d returns sent for a request whose context had ended", c.returns)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if c.returns != 1 {
		t.Errorf("Close sent %d returns; want the lease's units returned once", c.returns)
	}
}

// A call whose context has ended is refused with its error, as by every
// store, even when a live lease could answer it, and takes nothing.
func TestEndedContextLeaseUntouched(t *testing.T) {
	t.Parallel()
	_, c, s := counted(t, 0, time.Second, 10)
	l := sluice.PerSecond(100)
	take(t, s, "k", l, 1) // a lease of 10, 9 left
	ended, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Take(ended, "k", l, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Take with an ended context from a live lease: %v; want context.Canceled", err)
	}
	if _, err := s.Peek(ended, "k", l, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Peek with an ended context on a live lease: %v; want context.Canceled", err)
	}
	if _, err := s.TakeAll(ended, []sluice.Request{{Key: "k", Limit: l, Cost: 1}}); !errors.Is(err, context.Canceled) {
		t.Errorf("TakeAll with an ended context on a live lease: %v; want context.Canceled", err)
	}
	for i := range 9 {
		if d := take(t, s, "k", l, 1); d.Source != sluice.SourceLease {
			t.Fatalf("take %d after the ended calls = %+v; want the lease's (9 units left)", i, d)
		}
	}
	if c.grants != 1 {
		t.Errorf("grants = %d, want 1", c.grants)
	}
}

// abandoning is a granter in front of a failure policy: it takes
// abandoned holders itself.
type abandoning struct {
	*memory.Store
	got []string
}

func (a *abandoning) AbandonSlot(key, holder string) { a.got = append(a.got, key+"/"+holder) }

// Leases pass an abandoned holder on to their granter, so that a failure
// policy under them releases it past its breaker.
func TestAbandonSlotPassesThrough(t *testing.T) {
	t.Parallel()
	g := &abandoning{Store: newMemory(t, storetest.NewClock(storetest.T0))}
	s := newLease(t, g, storetest.NewClock(storetest.T0), time.Second, 10)
	sluice.ReleaseAbandoned(s, "k", "h")
	if len(g.got) != 1 || g.got[0] != "k/h" {
		t.Errorf("the granter was handed %v; want k/h", g.got)
	}
}

// A grant that arrives while Close runs is returned by Close, not
// stranded: the lease has left its table but keeps its units.
func TestCloseDuringGrant(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	b := heldGrant{m, make(chan struct{}), make(chan struct{})}
	s := newLease(t, b, clock, 300*time.Millisecond, 10)
	l := sluice.PerSecond(10)
	taken := make(chan sluice.Decision)
	go func() {
		d, _ := s.Take(ctx, "k", l, 1)
		taken <- d
	}()
	<-b.sent
	closed := make(chan error)
	go func() { closed <- s.Close(ctx) }()
	time.Sleep(10 * time.Millisecond) // Close waits for the grant
	close(b.release)
	if d := <-taken; !d.Allowed {
		t.Fatalf("Take = %+v, want allowed", d)
	}
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	if d, err := m.Peek(ctx, "k", l, 1); err != nil || d.Remaining != 9 {
		t.Fatalf("after Close: %+v, %v; want 9 left (the grant's 9 unused returned)", d, err)
	}
}

// Past the most limits a Store gives ids to, a new limit is answered
// exactly by the store, and the limits it knows stay leased.
func TestManyLimits(t *testing.T) {
	defer lease.SetMaxLimits(2)()
	_, c, s := counted(t, 0, 300*time.Millisecond, 10)
	for _, rate := range []int64{10, 20, 30} {
		if d := take(t, s, fmt.Sprint("k", rate), sluice.PerSecond(rate), 1); !d.Allowed || d.Source != sluice.SourceBackend {
			t.Fatalf("rate %d: %+v, want allowed by the store", rate, d)
		}
	}
	if c.grants != 2 {
		t.Fatalf("%d grants, want 2: the third limit has no id", c.grants)
	}
	for _, rate := range []int64{10, 20} {
		if d := take(t, s, fmt.Sprint("k", rate), sluice.PerSecond(rate), 1); d.Source != sluice.SourceLease {
			t.Fatalf("rate %d again: %+v, want answered from its lease", rate, d)
		}
	}
	if d := take(t, s, "k30", sluice.PerSecond(30), 1); d.Source != sluice.SourceBackend || d.Remaining != 28 {
		t.Fatalf("rate 30 again: %+v, want exact with 28 left", d)
	}
}

// Limits that differ in one field only, even the algorithm, find their ids
// without allocating, alternated on one key.
func TestLimitIDs(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	s := newLease(t, newMemory(t, clock), clock, time.Second, 1000)
	a := sluice.PerSecond(1_000_000)
	ls := []sluice.Limit{a, a.WithAlgorithm(sluice.TokenBucket), a.WithAlgorithm(sluice.LeakyBucket), {Rate: a.Rate, Period: a.Period, Burst: 2_000_000}}
	keys := []string{"k0", "k1", "k2", "k3"}
	for i, l := range ls {
		take(t, s, keys[i], l, 1)
	}
	allocs := testing.AllocsPerRun(200, func() {
		for i, l := range ls {
			if d, _ := s.Take(ctx, keys[i], l, 1); d.Source != sluice.SourceLease {
				t.Fatalf("%v: %+v, want answered from its lease", l, d)
			}
		}
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per round of local decisions, want 0", allocs)
	}
	if st := s.Stats(); st.Leased != 4 || st.Keys != 4 {
		t.Fatalf("Stats() = %+v, want 4 leased", st)
	}
}

// A sliding window counter's denial of n > 1 units says when n units will
// be there, as the store does: from a remembered denial, and when a
// partial grant cannot cover the request (the window's end is too early:
// the count then weighs in full as the previous window's).
func TestSlidingWindowCounterWait(t *testing.T) {
	l := sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Rate: 100, Period: 10 * time.Second}
	t.Run("remembered", func(t *testing.T) {
		start := storetest.T0.Truncate(10 * time.Second)
		clock := storetest.NewClock(start)
		m, ref := newMemory(t, clock), newMemory(t, clock)
		s := newLease(t, m, clock, time.Second, 20)
		for range 100 {
			take(t, s, "k", l, 1)
			ref.Take(ctx, "k", l, 1)
		}
		clock.Set(start.Add(10*time.Second + time.Millisecond))
		if d := take(t, s, "k", l, 1); d.Allowed {
			t.Fatalf("cost 1: %+v, want denied", d)
		}
		d := take(t, s, "k", l, 50)
		want, _ := ref.Peek(ctx, "k", l, 50)
		if d.Allowed || d.RetryAfter < want.RetryAfter {
			t.Errorf("cost 50: %+v; want denied for at least the exact %v", d, want.RetryAfter)
		}
	})
	t.Run("partial", func(t *testing.T) {
		start := storetest.T0.Truncate(10 * time.Second)
		clock := storetest.NewClock(start)
		m := newMemory(t, clock)
		m.Take(ctx, "k", l, 90)
		clock.Advance(5 * time.Second)
		s := newLease(t, m, clock, time.Second, 20)
		d := take(t, s, "k", l, 15)
		if d.Allowed {
			t.Fatalf("cost 15: %+v, want denied", d)
		}
		if err := s.Close(ctx); err != nil {
			t.Fatal(err)
		}
		clock.Advance(d.RetryAfter)
		if p, _ := m.Peek(ctx, "k", l, 15); !p.Allowed {
			t.Errorf("RetryAfter %v is too early: %+v", d.RetryAfter, p)
		}
	})
}

// A request a partial grant cannot cover is told a RetryAfter after which,
// with nobody else taking, it is admitted: the lease's units may go back
// to the store less the return rule's share meanwhile.
func TestPartialGrantRetryAfterIsEnough(t *testing.T) {
	t.Parallel()
	l := sluice.PerSecond(10) // GCRA, burst 10, I = 100ms
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	s := newLease(t, m, clock, time.Second, 5)
	if _, err := m.Take(ctx, "k", l, 10); err != nil {
		t.Fatal(err)
	}
	clock.Advance(300 * time.Millisecond) // 3 units back
	d := take(t, s, "k", l, 5)
	if d.Allowed {
		t.Fatalf("cost 5 with 3 left admitted: %+v", d)
	}
	clock.Advance(d.RetryAfter)
	if d2 := take(t, s, "k", l, 5); !d2.Allowed {
		t.Errorf("retried after the RetryAfter (%v) the lease gave: denied again %+v", d.RetryAfter, d2)
	}
}

// A staleness For gives below MinStaleness is refused on every call, a
// key's lease or not.
func TestForBelowMinStalenessOnALeasedKey(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	var d atomic.Int64
	d.Store(int64(time.Second))
	s, err := lease.New(m, &lease.Options{For: func(string, sluice.Limit) time.Duration { return time.Duration(d.Load()) }, Size: 10, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	l := sluice.PerSecond(100)
	take(t, s, "k", l, 1) // leased
	d.Store(int64(lease.MinStaleness - 1))
	if dec, err := s.Take(ctx, "k", l, 1); !errors.Is(err, lease.ErrInvalidStaleness) {
		t.Errorf("Take under MinStaleness on a leased key: %+v, %v; want ErrInvalidStaleness", dec, err)
	}
}

// TestResetElsewhere: a process's lease granted before another process
// resets the key gives nothing back into the reset key when it is
// replaced, so after the Reset the two admit what an exact limiter would
// from a fresh key, plus only the units the old lease spent.
func TestResetElsewhere(t *testing.T) {
	t.Parallel()
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket, sluice.FixedWindow, sluice.SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(storetest.T0)
			m := newMemory(t, clock)
			l := sluice.PerMinute(20).WithAlgorithm(a)
			p, q := newLease(t, m, clock, time.Second, 8), newLease(t, m, clock, time.Second, 8)
			if d := take(t, p, "k", l, 1); !d.Allowed { // p holds a lease of 8, 7 unspent
				t.Fatalf("first take: %+v", d)
			}
			clock.Advance(time.Millisecond)
			if err := q.Reset(ctx, "k", l); err != nil {
				t.Fatal(err)
			}
			clock.Advance(time.Millisecond)
			admitted := 0
			for range 40 {
				if take(t, q, "k", l, 1).Allowed {
					admitted++
				}
			}
			// p's lease ends; its next request replaces it, which returns
			// its 7 unspent units into the key q has since drained.
			clock.Advance(1100 * time.Millisecond)
			for range 40 {
				if take(t, p, "k", l, 1).Allowed {
					admitted++
				}
				if take(t, q, "k", l, 1).Allowed {
					admitted++
				}
			}
			// 20 from the fresh key, plus what 1.1s refills under the
			// bucket algorithms (one unit every 3s: none); nothing back.
			if admitted != 20 {
				t.Errorf("admitted %d after the Reset, want 20 (the fresh key's burst)", admitted)
			}
			if got := p.Stats().Returned; got != 0 {
				t.Errorf("p returned %d units into the reset key, want 0", got)
			}
		})
	}
}

// TestTakeAllRollbackNotLocal: a leased check put back because another
// check denied is no local decision (the metric of local decisions counted
// it, beside requests that were refused).
func TestTakeAllRollbackNotLocal(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	s := newLease(t, newMemory(t, clock), clock, time.Second, 10)
	leased, exact := sluice.PerMinute(100), sluice.PerMinute(1).WithAlgorithm(sluice.FixedWindow)
	take(t, s, "hot", leased, 1) // a lease of 10
	local := s.Stats().Local
	for i := range 5 {
		ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "hot", Limit: leased, Cost: 1}, {Key: "x", Limit: exact, Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		if want := i == 0; ds[1].Allowed != want {
			t.Fatalf("request %d: %+v, want the exact check allowed %v", i, ds, want)
		}
	}
	if got := s.Stats().Local - local; got != 1 {
		t.Errorf("%d local decisions, want 1 (the 4 rolled back are none)", got)
	}
}

// A store-wide MaxStaleness leases what can be leased: a sliding window
// log, which cannot, is answered exactly by the granter, from the first
// request on, in Take, Peek and TakeAll alike. A D that For gives such a
// key asks for a lease explicitly, and is refused with
// ErrGrantUnsupported, which wraps ErrInvalidLimit.
func TestLogUnderMaxStaleness(t *testing.T) {
	t.Parallel()
	clock, c, s := counted(t, 0, 50*time.Millisecond, 0)
	logLimit := sluice.PerMinute(1000).WithAlgorithm(sluice.SlidingWindowLog)
	for i := range 50 {
		d, err := s.Take(ctx, "log", logLimit, 1)
		if err != nil || !d.Allowed || d.Source != sluice.SourceBackend || d.Remaining != int64(999-i) {
			t.Fatalf("take %d = %+v, %v; want the store's exact answer", i, d, err)
		}
	}
	small := sluice.PerMinute(3).WithAlgorithm(sluice.SlidingWindowLog)
	for i := range 5 {
		d := take(t, s, "small", small, 1)
		if d.Allowed != (i < 3) {
			t.Fatalf("take %d of 3/min = %+v", i, d)
		}
	}
	if d, err := s.Peek(ctx, "log", logLimit, 1); err != nil || d.Remaining != 950 {
		t.Fatalf("Peek = %+v, %v; want the store's 950", d, err)
	}
	c.mu.Lock()
	grants := c.grants
	c.mu.Unlock()
	if grants != 0 {
		t.Fatalf("%d grants on sliding window logs, want 0", grants)
	}
	ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "log", Limit: logLimit, Cost: 1}, {Key: "g", Limit: sluice.PerSecond(100), Cost: 1}})
	if err != nil || !ds[0].Allowed || ds[0].Remaining != 949 || !ds[1].Allowed {
		t.Fatalf("TakeAll = %+v, %v", ds, err)
	}
	if err := s.CheckLimit(logLimit); err != nil {
		t.Fatalf("CheckLimit(log) = %v, want nil", err)
	}

	explicit, err := lease.New(c, &lease.Options{
		For:   func(string, sluice.Limit) time.Duration { return 50 * time.Millisecond },
		Clock: clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := explicit.Take(ctx, "log", logLimit, 1); !errors.Is(err, sluice.ErrGrantUnsupported) || !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("For on a log: Take err = %v, want ErrGrantUnsupported and ErrInvalidLimit", err)
	}
	if _, err := explicit.Peek(ctx, "log", logLimit, 1); !errors.Is(err, sluice.ErrGrantUnsupported) || !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("For on a log: Peek err = %v, want ErrGrantUnsupported and ErrInvalidLimit", err)
	}
	if _, err := explicit.TakeAll(ctx, []sluice.Request{{Key: "log", Limit: logLimit, Cost: 1}}); !errors.Is(err, sluice.ErrGrantUnsupported) || !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("For on a log: TakeAll err = %v, want ErrGrantUnsupported and ErrInvalidLimit", err)
	}
}

// CheckLimit refuses up front what every request would be refused: a
// MaxStaleness longer than the limit's period, and a zero Store. NewLimiter
// asks it.
func TestCheckLimit(t *testing.T) {
	t.Parallel()
	_, _, s := counted(t, 0, 2*time.Second, 0)
	short := sluice.PerSecond(10)
	if err := s.CheckLimit(short); !errors.Is(err, lease.ErrInvalidStaleness) {
		t.Errorf("CheckLimit(%v) = %v, want ErrInvalidStaleness", short, err)
	}
	if _, err := sluice.NewLimiter(s, short, nil); !errors.Is(err, lease.ErrInvalidStaleness) {
		t.Errorf("NewLimiter(%v) = %v, want ErrInvalidStaleness", short, err)
	}
	for _, l := range []sluice.Limit{sluice.PerMinute(10), sluice.PerSecond(1).WithAlgorithm(sluice.SlidingWindowLog)} {
		if err := s.CheckLimit(l); err != nil {
			t.Errorf("CheckLimit(%v) = %v, want nil", l, err)
		}
		if _, err := sluice.NewLimiter(s, l, nil); err != nil {
			t.Errorf("NewLimiter(%v) = %v, want nil", l, err)
		}
	}
	var zero lease.Store
	if err := zero.CheckLimit(sluice.PerMinute(1)); !errors.Is(err, lease.ErrNoGranter) {
		t.Errorf("zero Store: CheckLimit = %v, want ErrNoGranter", err)
	}
	// For decides per key: nothing is known up front.
	per, err := lease.New(newMemory(t, storetest.NewClock(storetest.T0)), &lease.Options{For: func(string, sluice.Limit) time.Duration { return time.Hour }})
	if err != nil {
		t.Fatal(err)
	}
	if err := per.CheckLimit(short); err != nil {
		t.Errorf("For: CheckLimit = %v, want nil", err)
	}
}

// A request that the live lease cannot cover goes to the store's Take with
// the lease's units spent with the store's: it is admitted as an exact
// limiter would admit it, and Peek says so beforehand. No unit is lost to
// the return rule, and none is given back.
func TestCostAboveLeaseCountsLease(t *testing.T) {
	t.Parallel()
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowCounter, sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			l := sluice.PerMinute(100).WithAlgorithm(alg)
			clock := storetest.NewClock(storetest.T0)
			exact := newMemory(t, clock)
			c := &counting{Granter: newMemory(t, clock), clock: clock}
			// Sized by demand, at most 100 / (2 × 4) = 12 units: below the
			// cost of 15.
			s, err := lease.New(c, &lease.Options{MaxStaleness: 5 * time.Second, FleetSize: func() int { return 4 }, Clock: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 83 {
				e, _ := exact.Take(ctx, "k", l, 1)
				if d := take(t, s, "k", l, 1); !d.Allowed || !e.Allowed {
					t.Fatalf("take %d: %+v (exact %+v)", i, d, e)
				}
			}
			if c.grants == 0 || s.Stats().Local == 0 {
				t.Fatalf("stats %+v: the key was never leased", s.Stats())
			}
			want, _ := exact.Peek(ctx, "k", l, 15)
			p, err := s.Peek(ctx, "k", l, 15)
			if err != nil || !p.Allowed || p.Remaining != want.Remaining {
				t.Errorf("Peek(15) with 17 left = %+v, %v; want allowed, Remaining %d (exact %+v)", p, err, want.Remaining, want)
			}
			if p, _ := s.Peek(ctx, "k", l, 18); p.Allowed {
				t.Errorf("Peek(18) with 17 left = %+v; want denied", p)
			} else if e, _ := exact.Peek(ctx, "k", l, 18); p.RetryAfter < e.RetryAfter {
				t.Errorf("Peek(18) with 17 left = %+v; RetryAfter below the exact %v", p, e.RetryAfter)
			}
			want, _ = exact.Take(ctx, "k", l, 15)
			d := take(t, s, "k", l, 15)
			if !d.Allowed || d.Remaining != want.Remaining {
				t.Fatalf("Take(15) with 17 left = %+v; want allowed as exact: %+v", d, want)
			}
			if c.returns != 0 {
				t.Fatalf("%d returns before the exact Take (grants %v, stats %+v): the lease's units were given back, less the return rule's share, not spent", c.returns, c.asked, s.Stats())
			}
		})
	}
}

// failingGrant is a granter whose grants wait for release and then fail as
// a resilient store's do when the backend does not answer.
type failingGrant struct {
	sluice.Granter
	grants  atomic.Int64
	sent    chan struct{}
	release chan struct{}
	err     error // nil: resilient.ErrNoGrant
}

func (f *failingGrant) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	f.grants.Add(1)
	f.sent <- struct{}{}
	<-f.release
	if f.err != nil {
		return sluice.Grant{}, f.err
	}
	return sluice.Grant{}, fmt.Errorf("%w: timed out", resilient.ErrNoGrant)
}

// Requests queued behind a grant that fails go to the store's Take, not
// each to a grant of its own in turn: with a stalled store each would wait
// a timeout more.
func TestQueuedBehindFailedGrant(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	f := &failingGrant{Granter: newMemory(t, clock), sent: make(chan struct{}, 16), release: make(chan struct{})}
	s := newLease(t, f, clock, time.Second, 10)
	l := sluice.PerSecond(100)
	const n = 8
	done := make(chan sluice.Decision, n)
	go func() { done <- take(t, s, "k", l, 1) }()
	<-f.sent // the first request's grant is in flight
	for range n - 1 {
		go func() { done <- take(t, s, "k", l, 1) }()
	}
	time.Sleep(50 * time.Millisecond) // the others queue on the key's refill
	close(f.release)
	for range n {
		if d := <-done; !d.Allowed || d.Source != sluice.SourceBackend {
			t.Errorf("a request behind the failed grant = %+v; want the store's Take", d)
		}
	}
	if got := f.grants.Load(); got != 1 {
		t.Errorf("%d grants sent, want the one the others queued behind", got)
	}
}

// policyGrant is failingGrant over a granter whose failure policy can
// answer without the store (resilient.Store's TakeByPolicy): it counts the
// Takes that reach the store and the policy's answers.
type policyGrant struct {
	*failingGrant
	takes, byPolicy atomic.Int64
}

func (p *policyGrant) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	p.takes.Add(1)
	return p.failingGrant.Take(ctx, key, l, cost)
}

func (p *policyGrant) TakeByPolicy(_ context.Context, _ string, l sluice.Limit, _ int64, _ error) (sluice.Decision, error) {
	p.byPolicy.Add(1)
	return sluice.Decision{Allowed: true, Limit: l, Source: sluice.SourceFallback}, nil
}

// With a granter whose policy can answer alone, the request whose grant
// failed and those queued behind it are answered by the policy without
// another call to the store: each waits for a store that does not answer
// once, not a second time for a Take.
func TestFailedGrantAnsweredByPolicy(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	p := &policyGrant{failingGrant: &failingGrant{Granter: newMemory(t, clock), sent: make(chan struct{}, 16), release: make(chan struct{})}}
	s := newLease(t, p, clock, time.Second, 10)
	l := sluice.PerSecond(100)
	const n = 8
	done := make(chan sluice.Decision, n)
	go func() { done <- take(t, s, "k", l, 1) }()
	<-p.sent
	for range n - 1 {
		go func() { done <- take(t, s, "k", l, 1) }()
	}
	time.Sleep(50 * time.Millisecond) // the others queue on the key's refill
	close(p.release)
	for range n {
		if d := <-done; !d.Allowed || d.Source != sluice.SourceFallback {
			t.Errorf("a request behind the failed grant = %+v; want the policy's answer", d)
		}
	}
	if g, tk, bp := p.grants.Load(), p.takes.Load(), p.byPolicy.Load(); g != 1 || tk != 0 || bp != n {
		t.Errorf("%d grants, %d store Takes, %d policy answers; want 1, 0, %d", g, tk, bp, n)
	}
}

// stallGrant is a memory store whose grants and regrants fail, while fail
// is set, as a resilient store's do when the backend does not answer, and
// whose Takes and TakeAlls the policy answers then, as after a timeout; the
// policy answers alone too (TakeByPolicy, PeekByPolicy, TakeAllByPolicy),
// admitting every key but those in deny (for a minute). It counts the
// grants sent, the other calls that reach the store, and the policy's
// answers.
type stallGrant struct {
	*memory.Store
	fail                     atomic.Bool
	deny                     map[string]bool
	grants, calls            atomic.Int64
	policyTakes, policyPeeks atomic.Int64 // the checks taken and peeked
	policyAlls               atomic.Int64 // the TakeAllByPolicy calls
	during                   func()       // when set, called by each Take the policy answers
	answered                 func()       // when set, called by each Take the store answers
}

var errStalled = fmt.Errorf("%w: timed out", resilient.ErrNoGrant)

func (g *stallGrant) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	g.grants.Add(1)
	if g.fail.Load() {
		return sluice.Grant{}, errStalled
	}
	return g.Store.Grant(ctx, key, l, n)
}

func (g *stallGrant) Regrant(ctx context.Context, key string, l sluice.Limit, old sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	g.grants.Add(1)
	if g.fail.Load() {
		return 0, sluice.Grant{}, errStalled
	}
	return g.Store.Regrant(ctx, key, l, old, unused, n)
}

func (g *stallGrant) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	g.calls.Add(1)
	if g.fail.Load() {
		if g.during != nil {
			g.during()
		}
		return g.policy(key, l), nil
	}
	if g.answered != nil {
		defer g.answered()
	}
	return g.Store.Take(ctx, key, l, cost)
}

func (g *stallGrant) Peek(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	g.calls.Add(1)
	if g.fail.Load() {
		return g.policy(key, l), nil
	}
	return g.Store.Peek(ctx, key, l, cost)
}

func (g *stallGrant) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	g.calls.Add(1)
	if g.fail.Load() {
		ds := make([]sluice.Decision, len(reqs))
		for i, r := range reqs {
			ds[i] = g.policy(r.Key, r.Limit)
		}
		return ds, nil
	}
	return g.Store.TakeAll(ctx, reqs)
}

func (g *stallGrant) policy(key string, l sluice.Limit) sluice.Decision {
	if g.deny[key] {
		return sluice.Decision{Limit: l, RetryAfter: time.Minute, Source: sluice.SourceFallback}
	}
	return sluice.Decision{Allowed: true, Limit: l, Source: sluice.SourceFallback}
}

func (g *stallGrant) Return(ctx context.Context, key string, l sluice.Limit, old sluice.Grant, unused int64) (int64, error) {
	g.calls.Add(1)
	return g.Store.Return(ctx, key, l, old, unused)
}

func (g *stallGrant) TakeByPolicy(_ context.Context, key string, l sluice.Limit, _ int64, _ error) (sluice.Decision, error) {
	g.policyTakes.Add(1)
	return g.policy(key, l), nil
}

func (g *stallGrant) PeekByPolicy(_ context.Context, key string, l sluice.Limit, _ int64, _ error) (sluice.Decision, error) {
	g.policyPeeks.Add(1)
	return g.policy(key, l), nil
}

// TakeAllByPolicy takes all of reqs or, when one is denied, none.
func (g *stallGrant) TakeAllByPolicy(_ context.Context, reqs []sluice.Request, _ error) ([]sluice.Decision, error) {
	g.policyAlls.Add(1)
	ds := make([]sluice.Decision, len(reqs))
	all := true
	for i, r := range reqs {
		ds[i] = g.policy(r.Key, r.Limit)
		all = all && ds[i].Allowed
	}
	if all {
		g.policyTakes.Add(int64(len(reqs)))
	}
	return ds, nil
}

// stallLease returns a lease store (Size 10, D a second, on a test clock)
// over a stallGrant whose policy denies the keys in deny; the keys in exact
// are not leased.
func stallLease(t *testing.T, deny []string, exact ...string) (*storetest.Clock, *stallGrant, *lease.Store) {
	t.Helper()
	clock := storetest.NewClock(storetest.T0)
	g := &stallGrant{Store: newMemory(t, clock), deny: map[string]bool{}}
	for _, k := range deny {
		g.deny[k] = true
	}
	s, err := lease.New(g, &lease.Options{Size: 10, Clock: clock.Now, For: func(key string, _ sluice.Limit) time.Duration {
		if slices.Contains(exact, key) {
			return 0
		}
		return time.Second
	}})
	if err != nil {
		t.Fatal(err)
	}
	return clock, g, s
}

// A TakeAll whose grants fail (sent together) is answered, for the checks
// no live lease answers, by the failure policy, with no call to the store
// after them: no TakeAll of the checks (a timeout more on a
// store that does not answer). All or nothing: when the policy denies
// one, it takes nothing for the others (one TakeAllByPolicy, no Peeks),
// and the units a lease answered a check with go back into it.
func TestTakeAllFailedGrantAnsweredByPolicy(t *testing.T) {
	t.Parallel()
	_, g, s := stallLease(t, nil, "x") // x not leased: the store's TakeAll would answer it
	l := sluice.PerSecond(100)
	take(t, s, "a", l, 1) // a's lease holds 9 units
	g.fail.Store(true)
	reqs := []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 1}, {Key: "c", Limit: l, Cost: 1}, {Key: "x", Limit: l, Cost: 1}}
	ds, err := s.TakeAll(ctx, reqs)
	if err != nil {
		t.Fatal(err)
	}
	if !ds[0].Allowed || ds[0].Source != sluice.SourceLease {
		t.Errorf("a: %+v, want its lease's admission", ds[0])
	}
	for i, d := range ds[1:] {
		if !d.Allowed || d.Source != sluice.SourceFallback {
			t.Errorf("%s: %+v, want the policy's admission", reqs[i+1].Key, d)
		}
	}
	if gr, c, pt, pa := g.grants.Load(), g.calls.Load(), g.policyTakes.Load(), g.policyAlls.Load(); gr != 3 || c != 0 || pt != 3 || pa != 1 {
		t.Errorf("%d grants, %d other store calls, %d policy takes in %d TakeAllByPolicy; want 3 (a's, then b's and c's together, which failed), 0, 3 (b, c, x) in 1", gr, c, pt, pa)
	}

	g.deny["x"] = true
	local, peeks := s.Stats().Local, g.policyPeeks.Load()
	if ds, err = s.TakeAll(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	if ds[3].Allowed || !ds[0].Allowed || !ds[1].Allowed || !ds[2].Allowed {
		t.Errorf("TakeAll with x denied by the policy: %+v; want x alone denied", ds)
	}
	if pt, pp, pa := g.policyTakes.Load(), g.policyPeeks.Load(), g.policyAlls.Load(); pt != 3 || pp != peeks || pa != 2 {
		t.Errorf("x denied: %d policy takes, %d peeks, %d TakeAllByPolicy; want none taken, none peeked, 1", pt-3, pp-peeks, pa-1)
	}
	if c := g.calls.Load(); c != 0 {
		t.Errorf("%d calls to the store after the failed grant, want none", c)
	}
	if got := s.Stats().Local; got != local {
		t.Errorf("Stats.Local %d after a denied TakeAll, want %d: a's unit was not spent", got, local)
	}
	if d := take(t, s, "a", l, 8); !d.Allowed || d.Source != sluice.SourceLease {
		t.Errorf("a's last 8 units: %+v; want them still in its lease", d)
	}
}

// A TakeAll whose store call the failure policy answered (the store did
// not) sends no other: a lease's units that the policy's denial puts back
// go into the lease, not to the store, even when the denial is for longer
// than D (where a store's denial gives them back young, see quiet): the
// return would wait for the store again.
func TestTakeAllPolicyDenialNoReturn(t *testing.T) {
	t.Parallel()
	_, g, s := stallLease(t, []string{"x"}, "x")
	l := sluice.PerSecond(100)
	take(t, s, "a", l, 1) // a's lease holds 9 units
	g.fail.Store(true)
	ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "x", Limit: l, Cost: 1}})
	if err != nil || !ds[0].Allowed || ds[1].Allowed {
		t.Fatalf("TakeAll = %+v, %v; want x denied by the policy", ds, err)
	}
	if c := g.calls.Load(); c != 1 {
		t.Errorf("%d store calls, want 1: the one the policy answered, no return", c)
	}
	if d := take(t, s, "a", l, 9); !d.Allowed || d.Source != sluice.SourceLease {
		t.Errorf("a's 9 units: %+v; want them still in its lease", d)
	}
}

// A Take whose cost goes to the store's Take with a live lease's last
// units, when the failure policy answers that Take (the store did not),
// asks the store nothing more. Denied, the units go back into the lease,
// and a sliding window counter's wait is not asked of the store's Peek;
// admitted after the lease ended (the store's call outlasting it), the
// policy answers for the lease's units, which cannot be spent, rather
// than the store's Take of the whole cost again: each a second timeout.
func TestTakeTopUpAnsweredByPolicy(t *testing.T) {
	t.Parallel()
	clock, g, s := stallLease(t, []string{"x"})
	l := sluice.PerSecond(100).WithAlgorithm(sluice.SlidingWindowCounter)
	take(t, s, "x", l, 8) // x's lease holds 2 units
	take(t, s, "a", l, 8)
	g.fail.Store(true)
	if d := take(t, s, "x", l, 3); d.Allowed || d.Source != sluice.SourceFallback {
		t.Errorf("x's 3 units, the policy denying: %+v; want its denial", d)
	}
	if c := g.calls.Load(); c != 1 {
		t.Errorf("%d store calls, want 1: the Take the policy answered, no Peek for the wait", c)
	}
	if d := take(t, s, "x", l, 2); !d.Allowed || d.Source != sluice.SourceLease {
		t.Errorf("x's 2 units: %+v; want them still in its lease", d)
	}

	g.during = func() { clock.Advance(2 * time.Second) } // the lease ends meanwhile
	d := take(t, s, "a", l, 3)
	if !d.Allowed || d.Source != sluice.SourceFallback {
		t.Errorf("a's 3 units, the policy admitting after the lease ended: %+v; want its admission", d)
	}
	if c, pa := g.calls.Load(), g.policyAlls.Load(); c != 2 || pa != 1 {
		t.Errorf("%d store calls, %d policy answers; want 2 (the Takes the policy answered), 1 (for the lease's 2 units)", c, pa)
	}
}

// A Take topped up from a lease that ended while the store took the rest,
// whose next Take of the rest the failure policy denies, is that denial:
// a sliding window counter's wait is not asked of the store's Peek (a
// second timeout on a store that does not answer).
func TestTakeRestDeniedByPolicyNoWait(t *testing.T) {
	t.Parallel()
	clock, g, s := stallLease(t, []string{"x"})
	l := sluice.PerMinute(6000).WithAlgorithm(sluice.SlidingWindowCounter) // a window longer than the lease
	take(t, s, "x", l, 8)                                                  // x's lease holds 2 units until 1s
	clock.Advance(900 * time.Millisecond)
	g.answered = func() {
		// The lease ends while the store takes the rest; then the store
		// stops answering.
		g.answered = nil
		clock.Advance(200 * time.Millisecond)
		g.fail.Store(true)
	}
	calls := g.calls.Load()
	if d := take(t, s, "x", l, 3); d.Allowed || d.Source != sluice.SourceFallback {
		t.Errorf("x's 3 units, the policy denying the rest: %+v; want its denial", d)
	}
	if c := g.calls.Load() - calls; c != 2 {
		t.Errorf("%d store calls, want 2: the Take the store answered, the one the policy answered, no Peek for the wait", c)
	}
}

// A Peek of more than a live lease's units, when the failure policy
// answers the store's Peek of the rest with a denial, is that denial: a
// sliding window counter's wait is not asked of the store's Peek (a
// second timeout on a store that does not answer).
func TestPeekLiveUnitsAnsweredByPolicy(t *testing.T) {
	t.Parallel()
	_, g, s := stallLease(t, []string{"x"})
	l := sluice.PerSecond(100).WithAlgorithm(sluice.SlidingWindowCounter)
	take(t, s, "x", l, 1) // x's lease holds 9 units
	g.fail.Store(true)
	calls := g.calls.Load()
	d, err := s.Peek(ctx, "x", l, 12)
	if err != nil || d.Allowed || d.Source != sluice.SourceFallback || d.Remaining != 9 {
		t.Errorf("Peek of 12, the policy denying: %+v, %v; want its denial, 9 remaining (the lease's)", d, err)
	}
	if c := g.calls.Load() - calls; c != 1 {
		t.Errorf("%d store calls, want 1: the Peek the policy answered, none for the wait", c)
	}
}

// slowGrant is a granter whose every grant takes a round trip during which
// one interval of the limit passes: the store refills a unit per grant.
type slowGrant struct {
	sluice.Granter
	clock         *storetest.Clock
	interval, rtt time.Duration
	grants, takes atomic.Int64
}

func (g *slowGrant) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	g.grants.Add(1)
	time.Sleep(g.rtt)
	g.clock.Advance(g.interval)
	return g.Granter.Grant(ctx, key, l, n)
}

func (g *slowGrant) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	g.takes.Add(1)
	return g.Granter.Take(ctx, key, l, cost)
}

// Requests queued behind a grant that others spent go to the store's
// Take, not each to a grant of its own in turn: with a store slower than
// the limit's interval every grant holds a unit, and a line of grants
// would hold a request a round trip for each one ahead of it (a 429
// answered after hundreds of milliseconds).
func TestQueuedBehindSpentGrantTakes(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	checkQueuedBehindSpentGrant(t, newMemory(t, clock), clock)
}

// checkQueuedBehindSpentGrant spends store's whole burst on a key, then
// sends 16 requests at once through a lease whose grants each take a round
// trip in which a unit comes back, and checks that at most 3 grants are
// sent: the requests that waited for one that others spent take instead.
func checkQueuedBehindSpentGrant(t *testing.T, store interface {
	sluice.Store
	sluice.Granter
}, clock *storetest.Clock) {
	t.Helper()
	l := sluice.PerSecond(100)
	for range 100 { // the store's whole burst, spent elsewhere
		if d, err := store.Take(ctx, "k", l, 1); err != nil || !d.Allowed {
			t.Fatal(d, err)
		}
	}
	g := &slowGrant{Granter: store, clock: clock, interval: l.Interval(), rtt: 20 * time.Millisecond}
	s := newLease(t, g, clock, time.Second, 10)
	const n = 16
	done := make(chan sluice.Decision, n)
	for range n {
		go func() { done <- take(t, s, "k", l, 1) }()
	}
	allowed := 0
	for range n {
		if d := <-done; d.Allowed {
			allowed++
		}
	}
	if got := g.grants.Load(); got > 3 {
		t.Errorf("%d grants sent for %d requests queued on one key (%d allowed, %d Takes); want at most 3: the rest take", got, n, allowed, g.takes.Load())
	}
}

// failingRegrant is a granter that can regrant, whose regrants wait for
// release (when set) and then fail with err. It counts every call that
// reaches the store, and the answers of its failure policy (as
// resilient.Store's TakeByPolicy).
type failingRegrant struct {
	sluice.Granter
	err                                        error
	sent, release                              chan struct{}
	regrants, grants, returns, takes, byPolicy atomic.Int64
}

func (f *failingRegrant) Regrant(context.Context, string, sluice.Limit, sluice.Grant, int64, int64) (int64, sluice.Grant, error) {
	f.regrants.Add(1)
	if f.release != nil {
		f.sent <- struct{}{}
		<-f.release
	}
	return 0, sluice.Grant{}, f.err
}

func (f *failingRegrant) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	f.grants.Add(1)
	return f.Granter.Grant(ctx, key, l, n)
}

func (f *failingRegrant) Return(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused int64) (int64, error) {
	f.returns.Add(1)
	return f.Granter.Return(ctx, key, l, g, unused)
}

func (f *failingRegrant) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	f.takes.Add(1)
	return f.Granter.Take(ctx, key, l, cost)
}

func (f *failingRegrant) TakeByPolicy(_ context.Context, _ string, l sluice.Limit, _ int64, _ error) (sluice.Decision, error) {
	f.byPolicy.Add(1)
	return sluice.Decision{Allowed: true, Limit: l, Source: sluice.SourceFallback}, nil
}

// A refill's regrant that fails, or that a breaker holds back, is treated
// as a return that failed: it is not resent, nor followed by a grant, a
// return or a Take; the request and those queued behind it are answered by
// the failure policy; the lease's leftover stays out of the store.
func TestRegrantFailedAnsweredByPolicy(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		err  error
	}{
		{"sent", fmt.Errorf("%w: timed out", resilient.ErrNoGrant)},
		{"held_back", fmt.Errorf("%w: %w: breaker open", resilient.ErrNoGrant, resilient.ErrNotSent)},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(storetest.T0)
			m := newMemory(t, clock)
			f := &failingRegrant{Granter: m, err: c.err, sent: make(chan struct{}, 16), release: make(chan struct{})}
			s := newLease(t, f, clock, 300*time.Millisecond, 10)
			l := sluice.PerSecond(10)
			take(t, s, "k", l, 1) // a lease of 10, 9 left
			clock.Advance(301 * time.Millisecond)
			const n = 8
			done := make(chan sluice.Decision, n)
			go func() { done <- take(t, s, "k", l, 1) }()
			<-f.sent // the refill's regrant is in flight
			for range n - 1 {
				go func() { done <- take(t, s, "k", l, 1) }()
			}
			time.Sleep(50 * time.Millisecond) // the others queue on the key's refill
			close(f.release)
			for range n {
				if d := <-done; !d.Allowed || d.Source != sluice.SourceFallback {
					t.Errorf("a request behind the failed regrant = %+v; want the policy's answer", d)
				}
			}
			if r, g, rt, tk, bp := f.regrants.Load(), f.grants.Load(), f.returns.Load(), f.takes.Load(), f.byPolicy.Load(); r != 1 || g != 1 || rt != 0 || tk != 0 || bp != n {
				t.Errorf("%d regrants, %d grants, %d returns, %d Takes, %d policy answers; want 1, 1 (the first lease), 0, 0, %d", r, g, rt, tk, bp, n)
			}
			// 10 taken at 0, 3 refilled since: the 9 unused were not given back.
			if d, err := m.Peek(ctx, "k", l, 1); err != nil || d.Remaining != 3 {
				t.Errorf("the store: %+v, %v; want 3 left", d, err)
			}
			if st := s.Stats(); st.Returned != 0 {
				t.Errorf("stats %+v; want nothing returned", st)
			}
		})
	}
}

// A regrant that fails with an error a failure policy does not answer is
// the request's error, as a return's would be; it is not resent.
func TestRegrantErrorNotResent(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	errDown := errors.New("redis: connection reset")
	f := &failingRegrant{Granter: newMemory(t, clock), err: errDown}
	s := newLease(t, f, clock, 300*time.Millisecond, 10)
	l := sluice.PerSecond(10)
	take(t, s, "k", l, 1)
	clock.Advance(301 * time.Millisecond)
	if d, err := s.Take(ctx, "k", l, 1); !errors.Is(err, errDown) {
		t.Fatalf("Take whose regrant failed = %+v, %v; want its error", d, err)
	}
	if r, g, rt, tk := f.regrants.Load(), f.grants.Load(), f.returns.Load(), f.takes.Load(); r != 1 || g != 1 || rt != 0 || tk != 0 {
		t.Errorf("%d regrants, %d grants, %d returns, %d Takes; want 1, 1 (the first lease), 0, 0", r, g, rt, tk)
	}
	// The lease gave its units to the failed call: the next request asks
	// for a new lease alone.
	f.err = nil
	if d := take(t, s, "k", l, 1); !d.Allowed || d.Source != sluice.SourceBackend || f.grants.Load() != 2 || f.regrants.Load() != 1 {
		t.Errorf("next Take = %+v after %d grants, %d regrants; want a grant of its own", d, f.grants.Load(), f.regrants.Load())
	}
}

// Without a failure policy (a grant's or regrant's error is not
// resilient.ErrNoGrant), the requests queued behind a grant or regrant that
// failed get its error at once: none sends a call of its own, grant, Take
// or return, each of which would wait a timeout more on a stalled store.
func TestQueuedBehindFailedGrantError(t *testing.T) {
	t.Parallel()
	errDown := errors.New("redis: i/o timeout")
	const n = 8
	check := func(t *testing.T, done chan error) {
		for range n {
			if err := <-done; !errors.Is(err, errDown) {
				t.Errorf("a request behind the failed call: %v; want its error", err)
			}
		}
	}
	run := func(s *lease.Store, sent chan struct{}, release chan struct{}) chan error {
		done := make(chan error, n)
		l := sluice.PerSecond(10)
		tk := func() {
			_, err := s.Take(ctx, "k", l, 1)
			done <- err
		}
		go tk()
		<-sent // the first request's call is in flight
		for range n - 1 {
			go tk()
		}
		time.Sleep(50 * time.Millisecond) // the others queue on the key's refill
		close(release)
		return done
	}
	t.Run("grant", func(t *testing.T) {
		t.Parallel()
		clock := storetest.NewClock(storetest.T0)
		p := &policyGrant{failingGrant: &failingGrant{Granter: newMemory(t, clock), sent: make(chan struct{}, 16), release: make(chan struct{}), err: errDown}}
		s := newLease(t, struct{ sluice.Granter }{p}, clock, time.Second, 10) // no TakeByPolicy: no failure policy
		check(t, run(s, p.sent, p.release))
		if g, tk := p.grants.Load(), p.takes.Load(); g != 1 || tk != 0 {
			t.Errorf("%d grants, %d store Takes; want 1, 0", g, tk)
		}
	})
	t.Run("regrant", func(t *testing.T) {
		t.Parallel()
		clock := storetest.NewClock(storetest.T0)
		f := &failingRegrant{Granter: newMemory(t, clock), err: errDown}
		s := newLease(t, struct{ sluice.Regranter }{f}, clock, 300*time.Millisecond, 10)
		take(t, s, "k", sluice.PerSecond(10), 1) // a lease of 10, 9 left
		clock.Advance(301 * time.Millisecond)
		f.sent, f.release = make(chan struct{}, 16), make(chan struct{})
		check(t, run(s, f.sent, f.release))
		if r, g, rt, tk := f.regrants.Load(), f.grants.Load(), f.returns.Load(), f.takes.Load(); r != 1 || g != 1 || rt != 0 || tk != 0 {
			t.Errorf("%d regrants, %d grants, %d returns, %d Takes; want 1, 1 (the first lease), 0, 0", r, g, rt, tk)
		}
	})
}

// A live lease's last units, too few for a request, are spent on it with
// the store's exact Take of the rest, whatever the lease's age, and put
// back when that Take denies; no grant, no return. Given back, they lost
// one unit per Interval of the lease's age (all of them, once it was old);
// spent with a grant's, they or the grant were lost when the store had too
// few to cover the request. Peek agrees.
func TestStrandedUnitsSpentWithStore(t *testing.T) {
	t.Parallel()
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		l := sluice.Limit{Algorithm: alg, Rate: 10, Period: time.Second, Burst: 10} // one unit per 100ms
		// drain takes every unit the store has left, as other processes do.
		drain := func(t *testing.T, m *memory.Store) {
			for {
				if d, err := m.Take(ctx, "k", l, 1); err != nil || !d.Allowed {
					return
				}
			}
		}
		// both Peeks cost and then Takes it, and wants both to decide allowed.
		both := func(t *testing.T, s *lease.Store, cost int64, allowed bool) sluice.Decision {
			t.Helper()
			p, err := s.Peek(ctx, "k", l, cost)
			if err != nil {
				t.Fatal(err)
			}
			d := take(t, s, "k", l, cost)
			if p.Allowed != allowed || d.Allowed != allowed {
				t.Fatalf("Peek(%d) = %+v, Take(%d) = %+v; want allowed %v", cost, p, cost, d, allowed)
			}
			return d
		}
		t.Run(alg.String()+"/old", func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(storetest.T0)
			m := newMemory(t, clock)
			c := &counting{Granter: m, clock: clock}
			s := newLease(t, c, clock, time.Second, 4)
			take(t, s, "k", l, 1)
			take(t, s, "k", l, 1) // 2 of the grant's 4 left
			drain(t, m)
			clock.Advance(250 * time.Millisecond) // 2 units in the store; the lease's 2 aged past return
			both(t, s, 4, true)
			if c.grants != 1 || c.returns != 0 {
				t.Errorf("grants %v, %d returns; want the first grant alone: the store's Take of 2", c.asked, c.returns)
			}
		})
		t.Run(alg.String()+"/young", func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(storetest.T0)
			m := newMemory(t, clock)
			c := &counting{Granter: m, clock: clock}
			s := newLease(t, c, clock, time.Second, 4)
			take(t, s, "k", l, 1) // 3 left
			drain(t, m)
			// The 3 are kept, young as they are (a return would give back
			// all but one per Interval begun), and the store has none of
			// the other 3: denied, the 3 put back.
			if d := take(t, s, "k", l, 6); d.Allowed {
				t.Fatalf("Take(6) = %+v; want denied, the store empty", d)
			}
			take(t, s, "k", l, 1)                 // 2 of the lease's 3 left
			clock.Advance(250 * time.Millisecond) // 2 units in the store: 2 + 2 < 6
			d := both(t, s, 6, false)
			if d.RetryAfter < 350*time.Millisecond {
				t.Errorf("Take(6) = %+v; want RetryAfter at least 350ms (6 units, 2 there, the next in 50ms)", d)
			}
			clock.Advance(200 * time.Millisecond) // 4 in the store, and the lease's 2 kept
			both(t, s, 6, true)
			if c.grants != 1 || c.returns != 0 {
				t.Errorf("grants %v, %d returns; want the first grant alone: the store's Takes", c.asked, c.returns)
			}
			if d := take(t, s, "k", l, 1); d.Allowed {
				t.Errorf("Take(1) = %+v; want denied, the lease and the store spent", d)
			}
		})
	}
}

// lateTake is a granter over a memory store whose Takes and TakeAlls take
// rtt, half of it before the store decides and half after, on the test's
// clock, or the next of trips when set; during (when set) runs before the
// store decides, as a request elsewhere in the process would.
type lateTake struct {
	*memory.Store
	clock    *storetest.Clock
	rtt      time.Duration
	trips    [][2]time.Duration // before and after the store decides
	during   func()
	takes    []int64 // each Take's cost, a TakeAll's costs' sum
	regrants int     // Regrants and Returns
}

func (g *lateTake) call(cost int64, f func()) {
	g.takes = append(g.takes, cost)
	trip := [2]time.Duration{g.rtt / 2, g.rtt / 2}
	if len(g.trips) > 0 {
		trip, g.trips = g.trips[0], g.trips[1:]
	}
	g.clock.Advance(trip[0])
	if f := g.during; f != nil {
		g.during = nil
		f()
	}
	f()
	g.clock.Advance(trip[1])
}

func (g *lateTake) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (d sluice.Decision, err error) {
	g.call(cost, func() { d, err = g.Store.Take(ctx, key, l, cost) })
	return d, err
}

func (g *lateTake) TakeAll(ctx context.Context, reqs []sluice.Request) (ds []sluice.Decision, err error) {
	var cost int64
	for _, r := range reqs {
		cost += r.Cost
	}
	g.call(cost, func() { ds, err = g.Store.TakeAll(ctx, reqs) })
	return ds, err
}

func (g *lateTake) Regrant(ctx context.Context, key string, l sluice.Limit, gr sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	g.regrants++
	return g.Store.Regrant(ctx, key, l, gr, unused, n)
}

func (g *lateTake) Return(ctx context.Context, key string, l sluice.Limit, gr sluice.Grant, unused int64) (int64, error) {
	g.regrants++
	return g.Store.Return(ctx, key, l, gr, unused)
}

// A lease's last units go with the store's Take of the rest (see
// TestStrandedUnitsSpentWithStore); when that Take comes back after the
// lease's life they cannot be spent (the store may have taken its units
// after the lease ended), and the request takes them from the store too:
// admitted when the store has them, exactly, not denied with the store's
// units taken for nothing; the lease's units go back under the return
// rule. When the store has too few, the denial's wait is for the whole
// cost, since the units the first Take spent are gone with it.
func TestTopUpTakeBackAfterLease(t *testing.T) {
	t.Parallel()
	l := sluice.Limit{Rate: 10, Period: time.Second, Burst: 20} // GCRA, one unit per 100ms
	const d = 300 * time.Millisecond
	setup := func(t *testing.T) (*storetest.Clock, *memory.Store, *lateTake, *lease.Store) {
		clock := storetest.NewClock(storetest.T0)
		m := newMemory(t, clock)
		g := &lateTake{Store: m, clock: clock, rtt: 10 * time.Millisecond}
		s := newLease(t, g, clock, d, 10)
		if dec := take(t, s, "k", l, 5); !dec.Allowed { // granted 10 at 0, 5 left
			t.Fatal(dec)
		}
		return clock, m, g, s
	}
	t.Run("admitted", func(t *testing.T) {
		t.Parallel()
		clock, m, g, s := setup(t)
		clock.Set(storetest.T0.Add(d - 5*time.Millisecond)) // 12 in the store
		// 8: the store's Take of 3 decides at 300ms, within the lease's
		// life, and comes back at 305ms, after it: 5 more from the store.
		dec := take(t, s, "k", l, 8)
		if !dec.Allowed || dec.Source != sluice.SourceBackend {
			t.Fatalf("Take(8) = %+v; want admitted by the store", dec)
		}
		if want := []int64{3, 5}; !slices.Equal(g.takes, want) {
			t.Fatalf("the store's Takes: %v, want %v", g.takes, want)
		}
		// 10 + 3 refills, less 3 and 5: 5 left at 315ms.
		if p, err := m.Peek(ctx, "k", l, 5); err != nil || !p.Allowed {
			t.Fatalf("store after: %+v, %v; want 5 left", p, err)
		}
		if p, err := m.Peek(ctx, "k", l, 6); err != nil || p.Allowed {
			t.Fatalf("store after: %+v, %v; want 5 left", p, err)
		}
		// The lease's 5 go back on the next refill, under the return rule:
		// at 316ms, 5 − ⌈316/100⌉ = 1.
		clock.Advance(time.Millisecond)
		take(t, s, "k", l, 1)
		if st := s.Stats(); st.Returned != 1 {
			t.Fatalf("stats %+v: want the lease's 5 returned less 4 Intervals: 1", st)
		}
	})
	t.Run("slow", func(t *testing.T) {
		t.Parallel()
		clock, _, g, s := setup(t)
		g.rtt = 400 * time.Millisecond
		clock.Set(storetest.T0.Add(100 * time.Millisecond))
		// The Take of 3 comes back 400ms after it was sent: its units
		// are as old as a lease's can be, and the store answers the 8.
		if dec := take(t, s, "k", l, 8); !dec.Allowed {
			t.Fatalf("Take(8) = %+v; want admitted by the store", dec)
		}
		if want := []int64{3, 8}; !slices.Equal(g.takes, want) {
			t.Fatalf("the store's Takes: %v, want %v", g.takes, want)
		}
	})
	t.Run("denied", func(t *testing.T) {
		t.Parallel()
		clock, m, _, s := setup(t)
		for { // the store's last units, spent elsewhere
			if dec, err := m.Take(ctx, "k", l, 1); err != nil || !dec.Allowed {
				break
			}
		}
		clock.Set(storetest.T0.Add(d - 5*time.Millisecond)) // 2 in the store
		// Take(3) at 300ms: 3 there; then 5: none.
		dec := take(t, s, "k", l, 8)
		if dec.Allowed {
			t.Fatalf("Take(8) = %+v; want denied", dec)
		}
		// The store's 3 are spent: 8 more are needed, by 1.1s.
		clock.Advance(dec.RetryAfter)
		if p, err := m.Peek(ctx, "k", l, 8); err != nil || !p.Allowed {
			t.Fatalf("the store has no 8 after the denial's RetryAfter %v: %+v, %v", dec.RetryAfter, p, err)
		}
	})
}

// Under the fixed window a lease ends with its window: a Take of the rest
// that comes back after the window's end goes with a second Take of the
// lease's units when the store counted it in the new window (its
// ResetAfter says which), and otherwise the store answers the whole cost
// in the new window: the first Take's units are gone with the old one.
func TestTopUpTakeBackAfterWindow(t *testing.T) {
	t.Parallel()
	l := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 10, Period: time.Second}
	for _, c := range []struct {
		name  string
		at    time.Duration // when the request of 8 is sent; the store decides 5ms later
		takes []int64
	}{
		{"new", 995 * time.Millisecond, []int64{3, 5}},
		{"old", 990 * time.Millisecond, []int64{3, 8}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(storetest.T0)
			m := newMemory(t, clock)
			g := &lateTake{Store: m, clock: clock, rtt: 10 * time.Millisecond}
			s := newLease(t, g, clock, time.Second, 6)
			take(t, s, "k", l, 1) // 6 granted in the first window, 5 left
			clock.Set(storetest.T0.Add(c.at))
			if dec := take(t, s, "k", l, 8); !dec.Allowed {
				t.Fatalf("Take(8) = %+v; want admitted in the new window", dec)
			}
			if !slices.Equal(g.takes, c.takes) {
				t.Fatalf("the store's Takes: %v, want %v", g.takes, c.takes)
			}
			// The new window counts 8, whichever way: 2 left.
			if p, err := m.Peek(ctx, "k", l, 1); err != nil || p.Remaining != 2 {
				t.Fatalf("store: %+v, %v; want 2 left in the new window", p, err)
			}
		})
	}
}

// When the second Take, of the lease's units, is the one that crosses
// the window's end, the two Takes' units cannot go together either: the
// second's go with a third Take of the rest, in the new window.
func TestTopUpSecondTakeAfterWindow(t *testing.T) {
	t.Parallel()
	l := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 10, Period: time.Second}
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	g := &lateTake{Store: m, clock: clock}
	s := newLease(t, g, clock, 990*time.Millisecond, 6)
	take(t, s, "k", l, 1) // 6 granted, 5 left, until 990ms
	clock.Set(storetest.T0.Add(980 * time.Millisecond))
	// The Take of 3 decides at 983ms and comes back at 991ms, after the
	// lease; the Take of 5 decides at 1001ms, in the next window.
	g.trips = [][2]time.Duration{{3 * time.Millisecond, 8 * time.Millisecond}, {10 * time.Millisecond, 0}}
	if dec := take(t, s, "k", l, 8); !dec.Allowed {
		t.Fatalf("Take(8) = %+v; want admitted in the new window", dec)
	}
	// The 5 stay the request's, in the new window, and 3 more go with them.
	if want := []int64{3, 5, 3}; !slices.Equal(g.takes, want) {
		t.Fatalf("the store's Takes: %v, want %v", g.takes, want)
	}
	if p, err := m.Peek(ctx, "k", l, 1); err != nil || p.Remaining != 10-8 {
		t.Fatalf("store: %+v, %v; want 8 counted in the new window", p, err)
	}
}

// In a TakeAll, a lease whose units are too few for its check spends them
// with the store's Take of the rest, in the store's all-or-nothing TakeAll
// with the other checks, as Take does; it was returned young (the return
// rule keeping one unit per Interval of its age) for a new grant. When
// another check denies, the lease keeps its units.
func TestTakeAllSpendsLastUnits(t *testing.T) {
	t.Parallel()
	la, lb := sluice.Limit{Rate: 10, Period: time.Second, Burst: 20}, sluice.PerMinute(1)
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	g := &lateTake{Store: m, clock: clock}
	s, err := lease.New(g, &lease.Options{Size: 10, Clock: clock.Now, For: func(key string, _ sluice.Limit) time.Duration {
		if key == "b" {
			return 0 // exact
		}
		return 300 * time.Millisecond
	}})
	if err != nil {
		t.Fatal(err)
	}
	take(t, s, "a", la, 5) // 10 granted, 5 left; 10 in the store
	clock.Set(storetest.T0.Add(150 * time.Millisecond))
	reqs := []sluice.Request{{Key: "a", Limit: la, Cost: 8}, {Key: "b", Limit: lb, Cost: 1}}
	ds, err := s.TakeAll(ctx, reqs)
	if err != nil || !ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("TakeAll = %+v, %v; want both admitted", ds, err)
	}
	if want := []int64{3 + 1}; !slices.Equal(g.takes, want) || g.regrants != 0 {
		t.Fatalf("the store's TakeAlls %v, %d regrants and returns; want one TakeAll of a's 3 and b's 1, none", g.takes, g.regrants)
	}
	// 10 + 1 refilled − 3: none lost to a young return.
	if p, err := m.Peek(ctx, "a", la, 8); err != nil || !p.Allowed || p.Remaining != 8 {
		t.Fatalf("store: %+v, %v; want 8 left", p, err)
	}
	// b is spent: the next TakeAll is denied, and a's lease keeps its
	// units (a grant of the store's 8, 2 spent by a request of 2). b
	// denies for a minute, longer than the lease lives, but the lease was
	// granted for a Take: its units stay for the key's Takes (see
	// TestSiblingDenialKeepsTakesLease; one granted for a TakeAll goes
	// back at once, TestSiblingDenialReturnsLease).
	take(t, s, "a", la, 2)
	reqs[0].Cost = 9
	if ds, err := s.TakeAll(ctx, reqs); err != nil || ds[1].Allowed {
		t.Fatalf("TakeAll = %+v, %v; want b denied", ds, err)
	}
	if d, err := m.Peek(ctx, "a", la, 1); err != nil || d.Allowed {
		t.Fatalf("the store after the denial: %+v, %v; want nothing back", d, err)
	}
	if d := take(t, s, "a", la, 6); !d.Allowed || d.Source != sluice.SourceLease {
		t.Fatalf("a after the denial: %+v; want its lease's 6 kept", d)
	}
}

// A TakeAll whose store call comes back after the lease's life takes the
// lease's units from the store too, as Take does (TestTopUpTakeBackAfterLease).
func TestTakeAllTopUpBackAfterLease(t *testing.T) {
	t.Parallel()
	la, lb := sluice.Limit{Rate: 10, Period: time.Second, Burst: 20}, sluice.PerMinute(10)
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	g := &lateTake{Store: m, clock: clock, rtt: 10 * time.Millisecond}
	s, err := lease.New(g, &lease.Options{Size: 10, Clock: clock.Now, For: func(key string, _ sluice.Limit) time.Duration {
		if key == "b" {
			return 0
		}
		return 300 * time.Millisecond
	}})
	if err != nil {
		t.Fatal(err)
	}
	take(t, s, "a", la, 5)
	clock.Set(storetest.T0.Add(295 * time.Millisecond))
	ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: la, Cost: 8}, {Key: "b", Limit: lb, Cost: 1}})
	if err != nil || !ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("TakeAll = %+v, %v; want both admitted", ds, err)
	}
	if want := []int64{3 + 1, 5}; !slices.Equal(g.takes, want) {
		t.Fatalf("the store's calls took %v, want %v", g.takes, want)
	}
	// 10 + 3 refilled − 3 − 5.
	if p, err := m.Peek(ctx, "a", la, 5); err != nil || !p.Allowed || p.Remaining != 5 {
		t.Fatalf("store: %+v, %v; want 5 left", p, err)
	}
}

// A lease's last units that a request could not spend with the store's
// (it denied the rest) go back into the lease. Another request of the
// process, while that Take is on its way, finds the lease empty and goes
// to the store's Take: a new grant would replace the lease, and the units
// would go back to the store under the return rule, which keeps one per
// Interval of their age.
func TestTopUpUnitsBackAfterRefill(t *testing.T) {
	t.Parallel()
	l := sluice.Limit{Rate: 10, Period: time.Second, Burst: 20}
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	g := &lateTake{Store: m, clock: clock}
	s := newLease(t, g, clock, 300*time.Millisecond, 10)
	take(t, s, "k", l, 5) // 5 of 10 left; 10 in the store
	g.during = func() {
		m.Take(ctx, "k", l, 10) // elsewhere: the store is empty
		clock.Advance(100 * time.Millisecond)
		// Another request of this process, on the lease the first one
		// emptied: the store's Take of the one unit back.
		if dec := take(t, s, "k", l, 1); !dec.Allowed || dec.Source != sluice.SourceBackend {
			t.Errorf("Take(1) during the first Take = %+v, want the store's", dec)
		}
	}
	if dec := take(t, s, "k", l, 8); dec.Allowed { // Take(3): none there
		t.Fatalf("Take(8) = %+v; want denied", dec)
	}
	if st := s.Stats(); st.Grants != 1 || st.Forfeited != 0 {
		t.Fatalf("%+v: want one grant, nothing forfeited", st)
	}
	// The 5 are the lease's again; the store has none.
	if dec := take(t, s, "k", l, 5); !dec.Allowed || dec.Source != sluice.SourceLease {
		t.Fatalf("Take(5) = %+v; want the lease's", dec)
	}
	if p, err := m.Peek(ctx, "k", l, 1); err != nil || p.Allowed {
		t.Fatalf("store: %+v, %v; want none left", p, err)
	}
}

// A TakeAll spends its leases' units when it is admitted, once every check
// is in: a lease that ends while the store's call for the other checks is
// out cannot be spent (the request would be admitted after the lease's
// life), and its check takes its units from the store instead, exactly,
// as a top-up's (TestTakeAllTopUpBackAfterLease); the lease's units go
// back under the return rule.
func TestTakeAllLeaseEndsBeforeReturn(t *testing.T) {
	t.Parallel()
	la, lb := sluice.Limit{Rate: 10, Period: time.Second, Burst: 20}, sluice.PerMinute(10)
	const d = 300 * time.Millisecond
	stale := func(key string, _ sluice.Limit) time.Duration {
		if key == "b" {
			return 0 // exact
		}
		return d
	}
	t.Run("store call", func(t *testing.T) {
		t.Parallel()
		clock := storetest.NewClock(storetest.T0)
		m := newMemory(t, clock)
		g := &lateTake{Store: m, clock: clock, rtt: 10 * time.Millisecond}
		s, err := lease.New(g, &lease.Options{Size: 10, Clock: clock.Now, For: stale})
		if err != nil {
			t.Fatal(err)
		}
		take(t, s, "a", la, 1) // granted 10 at 0, 9 left until 300ms
		clock.Set(storetest.T0.Add(d - 5*time.Millisecond))
		// a's 2 come from its lease at 295ms; b's TakeAll decides at 300ms
		// and comes back at 305ms, after a's lease.
		ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: la, Cost: 2}, {Key: "b", Limit: lb, Cost: 1}})
		if err != nil || !ds[0].Allowed || !ds[1].Allowed {
			t.Fatalf("TakeAll = %+v, %v; want both admitted", ds, err)
		}
		if ds[0].Source != sluice.SourceBackend {
			t.Errorf("a's decision = %+v; want the store's", ds[0])
		}
		if want := []int64{1, 2}; !slices.Equal(g.takes, want) {
			t.Fatalf("the store's calls took %v, want %v (b, then a's 2)", g.takes, want)
		}
		// 10 + 3 refilled − 2 at 315ms.
		if p, err := m.Peek(ctx, "a", la, 1); err != nil || p.Remaining != 11 {
			t.Fatalf("store: %+v, %v; want 11 left", p, err)
		}
		if st := s.Stats(); st.Local != 0 {
			t.Errorf("stats %+v: want no local decision", st)
		}
		// The lease's 9 go back on its next refill: at 316ms, 9 − 4.
		clock.Advance(time.Millisecond)
		take(t, s, "a", la, 1)
		if st := s.Stats(); st.Returned != 5 {
			t.Fatalf("stats %+v: want the lease's 9 returned less 4 Intervals: 5", st)
		}
	})
	t.Run("grant", func(t *testing.T) {
		t.Parallel()
		// No MultiStore, and another leased check's grant out past a's
		// lease: a's lease answers after that grant, not before it, and
		// has ended by then: a's 2 are its refill's (its 9 back less 4
		// Intervals, 10 granted).
		clock, c, s := counted(t, 0, d, 10)
		take(t, s, "a", la, 1)
		clock.Set(storetest.T0.Add(d - 5*time.Millisecond))
		c.delay = 10 * time.Millisecond
		ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: la, Cost: 2}, {Key: "c", Limit: la, Cost: 1}})
		if err != nil || !ds[0].Allowed || !ds[1].Allowed || ds[0].Source != sluice.SourceBackend {
			t.Fatalf("TakeAll = %+v, %v; want both admitted, a by its refill", ds, err)
		}
		// 10 + 3 refilled + 5 returned − 10 granted at 315ms.
		if p, err := c.Granter.Peek(ctx, "a", la, 1); err != nil || p.Remaining != 8 {
			t.Fatalf("store: %+v, %v; want 8 left", p, err)
		}
		if st := s.Stats(); st.Returned != 5 || st.Local != 0 {
			t.Fatalf("stats %+v: want a's 9 returned less 4 Intervals (5), no local decision", st)
		}
	})
	// Without a MultiStore, two leases that end while the one exact check
	// is out are taken one at a time: all or nothing in what the request
	// is told, the first's units lost when the second is denied.
	for _, denied := range []bool{false, true} {
		t.Run(fmt.Sprintf("each/denied=%v", denied), func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(storetest.T0)
			m := newMemory(t, clock)
			g := &lateTake{Store: m, clock: clock, rtt: 10 * time.Millisecond}
			s, err := lease.New(struct{ sluice.Granter }{g}, &lease.Options{Size: 10, Clock: clock.Now, For: stale})
			if err != nil {
				t.Fatal(err)
			}
			take(t, s, "a", la, 1)
			take(t, s, "c", la, 1)
			if denied {
				m.Take(ctx, "c", la, 10) // elsewhere: c's store is empty
			}
			clock.Set(storetest.T0.Add(d - 5*time.Millisecond))
			ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: la, Cost: 2}, {Key: "c", Limit: la, Cost: 5}, {Key: "b", Limit: lb, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if want := []int64{1, 2, 5}; !slices.Equal(g.takes, want) {
				t.Fatalf("the store's Takes %v, want %v", g.takes, want)
			}
			if ok := ds[0].Allowed && ds[1].Allowed && ds[2].Allowed; ok == denied || ds[1].Allowed == denied {
				t.Fatalf("TakeAll = %+v; want c denied: %v", ds, denied)
			}
			if ds[0].Source != sluice.SourceBackend {
				t.Errorf("a's decision = %+v; want the store's", ds[0])
			}
			// Denied, b's 1 and a's 2 were taken for nothing.
			if st, lost := s.Stats(), map[bool]uint64{false: 0, true: 3}[denied]; st.Lost != lost {
				t.Errorf("stats %+v: want %d lost", st, lost)
			}
		})
	}
}

// Units the store took for a request that could not spend them, when a
// lease ended while the store's Take of the rest was out, are counted in
// Stats.Lost: those of a request the store then denied (a Take's first
// Take of the rest, a TakeAll's other checks too), and those too old to
// go with the rest, taken again.
func TestLostUnitsCounted(t *testing.T) {
	t.Parallel()
	l := sluice.Limit{Rate: 10, Period: time.Second, Burst: 20} // GCRA, one unit per 100ms
	const d = 300 * time.Millisecond
	drain := func(m *memory.Store, key string) {
		for {
			if dec, err := m.Take(ctx, key, l, 1); err != nil || !dec.Allowed {
				return
			}
		}
	}
	for _, c := range []struct {
		name    string
		rtt     time.Duration
		at      time.Duration // when the request of 8 is sent
		drained bool
		lost    uint64
	}{
		// The Take of 3 comes back at 305ms, after the lease; the Take of
		// the lease's 5 is denied: the 3 are lost.
		{"denied", 10 * time.Millisecond, d - 5*time.Millisecond, true, 3},
		// The Take of 3 comes back 400ms after it was sent, too old: the
		// whole 8 are taken again, the 3 lost.
		{"too old", 400 * time.Millisecond, 100 * time.Millisecond, false, 3},
		// The Take of 5 goes with the 3: none lost.
		{"admitted", 10 * time.Millisecond, d - 5*time.Millisecond, false, 0},
	} {
		t.Run("Take/"+c.name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(storetest.T0)
			m := newMemory(t, clock)
			g := &lateTake{Store: m, clock: clock, rtt: c.rtt}
			s := newLease(t, g, clock, d, 10)
			take(t, s, "k", l, 5) // granted 10 at 0, 5 left
			if c.drained {
				drain(m, "k")
			}
			clock.Set(storetest.T0.Add(c.at))
			if dec := take(t, s, "k", l, 8); dec.Allowed == c.drained {
				t.Fatalf("Take(8) = %+v; want allowed %v", dec, !c.drained)
			}
			if st := s.Stats(); st.Lost != c.lost {
				t.Fatalf("stats %+v: want %d lost", st, c.lost)
			}
		})
	}
	t.Run("TakeAll", func(t *testing.T) {
		t.Parallel()
		clock := storetest.NewClock(storetest.T0)
		m := newMemory(t, clock)
		g := &lateTake{Store: m, clock: clock, rtt: 10 * time.Millisecond}
		s, err := lease.New(g, &lease.Options{Size: 10, Clock: clock.Now, For: func(key string, _ sluice.Limit) time.Duration {
			if key == "b" {
				return 0
			}
			return d
		}})
		if err != nil {
			t.Fatal(err)
		}
		take(t, s, "a", l, 1) // 9 left until 300ms
		drain(m, "a")
		clock.Set(storetest.T0.Add(d - 5*time.Millisecond))
		// b's 2 are taken at 300ms and come back at 305ms, after a's lease;
		// the store has 3 of a's 4, and the request is denied: b's 2 lost.
		ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: l, Cost: 4}, {Key: "b", Limit: sluice.PerMinute(10), Cost: 2}})
		if err != nil || ds[0].Allowed {
			t.Fatalf("TakeAll = %+v, %v; want a denied", ds, err)
		}
		if st := s.Stats(); st.Lost != 2 {
			t.Fatalf("stats %+v: want b's 2 lost", st)
		}
	})
}

// overlapped is a granter whose Takes and TakeAlls run next() first,
// once per call and not within it: another request of the same process,
// answered while this one's store call is out. (Not its grants: the
// key's other requests wait for those.)
type overlapped struct {
	*memory.Store
	next func()
	in   bool
}

func (g *overlapped) other() {
	if !g.in && g.next != nil {
		g.in = true
		g.next()
		g.in = false
	}
}

func (g *overlapped) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	g.other()
	return g.Store.Take(ctx, key, l, cost)
}

func (g *overlapped) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	g.other()
	return g.Store.TakeAll(ctx, reqs)
}

// A layered check under overload admits what its exact twin does: units a
// leased check took for a request that another check denied go back to
// the store when the lease was regranted meanwhile (by a request answered
// while the exact check's call was out), not dropped. Dropped, they were
// lost to the fixed window until its end: the layered check admitted a
// fraction of what the exact one did.
func TestTakeAllDeniedUnitsNotDropped(t *testing.T) {
	t.Parallel()
	fw := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 400, Period: time.Second}
	ex := sluice.Limit{Rate: 400, Period: time.Second, Burst: 100}
	const d = 50 * time.Millisecond
	run := func(leased map[string]bool) (admitted int64, st lease.Stats) {
		clock := storetest.NewClock(storetest.T0)
		m := newMemory(t, clock)
		g := &overlapped{Store: m}
		s, err := lease.New(g, &lease.Options{Size: 20, Clock: clock.Now, For: func(key string, _ sluice.Limit) time.Duration {
			if leased[key] {
				return d
			}
			return 0
		}})
		if err != nil {
			t.Fatal(err)
		}
		costs := []int64{3, 7, 1, 5, 8, 2, 6, 4}
		i := 0
		req := func() {
			c := costs[i%len(costs)]
			i++
			ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "fw", Limit: fw, Cost: c}, {Key: "ex", Limit: ex, Cost: c}})
			if err != nil {
				t.Fatal(err)
			}
			if ds[0].Allowed && ds[1].Allowed {
				admitted += c
			}
		}
		g.next = req
		// Two requests at a time every 0.5ms for 3 windows: about 20
		// times the limits.
		for clock.Now().Before(storetest.T0.Add(3 * time.Second)) {
			req()
			clock.Advance(500 * time.Microsecond)
		}
		return admitted, s.Stats()
	}
	exact, _ := run(nil)
	// Both leased, the GCRA lease's units held idle go back less the
	// return rule's Interval per Interval of age: some loss remains.
	for _, c := range []struct {
		leased map[string]bool
		share  int64 // at least, in % of the exact twin's
	}{{map[string]bool{"fw": true}, 95}, {map[string]bool{"fw": true, "ex": true}, 80}} {
		layered, st := run(c.leased)
		t.Logf("leased %v: admitted %d, exact %d; stats %+v", c.leased, layered, exact, st)
		if layered*100 < exact*c.share {
			t.Errorf("leased %v: layered checks admitted %d units, exact ones %d: want at least %d%%", c.leased, layered, exact, c.share)
		}
	}
}

// TestTakeAllDeniedElsewhereKeepsBudget: a leased check whose requests
// another check keeps denying spends nothing, so it must lose nothing.
// Counted as demand, those requests kept the key leased: every lease
// ended unspent and went back less the return rule's unit per Interval
// begun, about one unit per D, which drained a limit that refills slower
// than that (300 a minute lost 195 units in 10 s at D = 50 ms) and starved
// the key's other traffic.
func TestTakeAllDeniedElsewhereKeepsBudget(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	s, err := lease.New(m, &lease.Options{Clock: clock.Now, For: func(key string, _ sluice.Limit) time.Duration {
		if key == "user" {
			return 50 * time.Millisecond
		}
		return 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	user, ep, open := sluice.PerMinute(300), sluice.PerMinute(1), sluice.PerSecond(1000)
	take := func(other string) bool {
		l := ep
		if other == "open" {
			l = open
		}
		ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "user", Limit: user, Cost: 1}, {Key: other, Limit: l, Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return ds[0].Allowed && ds[1].Allowed
	}
	// First the key is hot and leased, its requests admitted: 40 in
	// 80 ms, with another check that has room.
	for range 40 {
		if !take("open") {
			t.Fatal("a request with room was denied")
		}
		clock.Advance(2 * time.Millisecond)
	}
	if s.Stats().Grants == 0 {
		t.Fatal("user was never leased")
	}
	// Then a request spends ep's one unit: every later one is denied by
	// ep for the next minute, while user has units throughout (41 taken,
	// 50 refilled by the end).
	if !take("ep") {
		t.Fatal("the first request was denied")
	}
	admitted := 0
	for end := clock.Now().Add(10 * time.Second); clock.Now().Before(end); clock.Advance(2 * time.Millisecond) {
		if take("ep") {
			admitted++
		}
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := m.Peek(ctx, "user", user, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("admitted %d; user's remaining %d; stats %+v", admitted, d.Remaining, s.Stats())
	// What the return rule kept is counted: a unit or so per lease of
	// the first 80 ms, where it was a unit per D throughout.
	if st := s.Stats(); st.Forfeited > 10 {
		t.Errorf("%d units forfeited to the return rule, want at most 10", st.Forfeited)
	}
	if admitted != 0 {
		t.Errorf("admitted %d requests that ep denies", admitted)
	}
	if d.Remaining != user.Capacity() {
		t.Errorf("user's remaining is %d after 10 s of requests denied by another check, want %d", d.Remaining, user.Capacity())
	}
}

// With sluice.MaxBackgroundReleases at work, an abandoned holder's release
// through a lease store is not sent, and TryAbandonSlot says so, as the
// granter's own would: the caller counts it. Not parallel: it fills the
// process's bound.
func TestTryAbandonSlotFull(t *testing.T) {
	m := memory.New(nil)
	t.Cleanup(func() { m.Close() })
	s, err := lease.New(m, &lease.Options{MaxStaleness: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(context.Background()) })
	releasetest.Fill(t, time.Now().Add(2*time.Second))
	if err := s.TryAbandonSlot("k", sluice.NewHolderID()); !errors.Is(err, sluice.ErrRetriesFull) {
		t.Errorf("TryAbandonSlot with the bound full = %v, want ErrRetriesFull", err)
	}
	var none *lease.Store
	if err := none.TryAbandonSlot("k", sluice.NewHolderID()); !errors.Is(err, lease.ErrNoGranter) {
		t.Errorf("nil store's TryAbandonSlot = %v, want ErrNoGranter", err)
	}
}
