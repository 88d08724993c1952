package lease_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// gated holds a key's grants until its gate opens, telling when one is
// held.
type gated struct {
	*memory.Store
	mu    sync.Mutex
	gates map[string]chan struct{}
	takes map[string]chan struct{}
	held  chan string
}

func (g *gated) wait(key string) {
	g.mu.Lock()
	gate := g.gates[key]
	g.mu.Unlock()
	if gate != nil {
		g.held <- key
		<-gate
	}
}

// Take holds the first Take of a key in takes until its gate opens.
func (g *gated) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	g.mu.Lock()
	gate := g.takes[key]
	delete(g.takes, key)
	g.mu.Unlock()
	if gate != nil {
		g.held <- key
		<-gate
	}
	return g.Store.Take(ctx, key, l, cost)
}

func (g *gated) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	g.wait(key)
	return g.Store.Grant(ctx, key, l, n)
}

func (g *gated) Regrant(ctx context.Context, key string, l sluice.Limit, old sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	g.wait(key)
	return g.Store.Regrant(ctx, key, l, old, unused, n)
}

// A layered check's units put back while its lease's next grant is out go
// back to the store: put into the lease, the grant's units replaced them,
// and they were lost. Under closed-loop overload (TestLayeredClosedLoop)
// that lost 40-60 % of the units the store granted. (While the lease
// lives, its refills are the store's Take instead: TestTakeAllHoldKeepsLease.)
func TestPutBackDuringGrant(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	g := &gated{Store: m, gates: map[string]chan struct{}{}, held: make(chan string)}
	s := newLease(t, g, clock, 50*time.Millisecond, 4)
	lg := sluice.PerSecond(10) // one unit per 100 ms
	lf := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 10, Period: time.Second}
	if d, err := m.Take(ctx, "f", lf, 10); err != nil || !d.Allowed {
		t.Fatal(d, err) // f is spent: its grant will be nothing
	}
	gf, gg := make(chan struct{}), make(chan struct{})
	g.gates["f"] = gf
	all := make(chan []sluice.Decision)
	go func() {
		ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "g", Limit: lg, Cost: 3}, {Key: "f", Limit: lf, Cost: 1}})
		if err != nil {
			t.Error(err)
		}
		all <- ds
	}()
	if k := <-g.held; k != "f" {
		t.Fatalf("held %s's grant, want f's", k)
	}
	grantedBeside(t, s, "g", lg) // 3 of g's 4 units held for the TakeAll
	g.mu.Lock()
	g.gates["g"] = gg
	g.mu.Unlock()
	clock.Advance(60 * time.Millisecond) // g's lease has ended
	one := make(chan sluice.Decision)
	go func() { one <- take(t, s, "g", lg, 1) }() // a grant
	if k := <-g.held; k != "g" {
		t.Fatalf("held %s's grant, want g's", k)
	}
	close(gf) // f denies: g's 3 units are put back while g's grant is out
	if ds := <-all; ds[0].Allowed && ds[1].Allowed {
		t.Fatalf("TakeAll: %+v, want denied by f", ds)
	}
	close(gg)
	if d := <-one; !d.Allowed {
		t.Fatalf("take after the grant: %+v, want allowed", d)
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// 60 ms old, the 3 units went back less the Interval begun (2 of 3),
	// and the first lease's last unit with the regrant (none); the second
	// lease's 3 at Close.
	if st := s.Stats(); st.Returned != 5 || st.Forfeited != 2 {
		t.Fatalf("%+v: want 5 units given back, 2 forfeited", st)
	}
}

// grantedBeside waits until key's lease, granted for a TakeAll under way,
// holds units: those the TakeAll's check took are out of it by then.
func grantedBeside(t *testing.T, s *lease.Store, key string, l sluice.Limit) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		d, err := s.Peek(ctx, key, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Source == sluice.SourceLease {
			return
		}
	}
	t.Fatalf("%s: no lease granted", key)
}

// While a TakeAll's check holds units of a live lease, until the other
// checks' store calls are back, the key's refills are the store's Take:
// when another check denies, the units go back into the lease. A new grant
// replaced the lease, and they went back to the store less one unit per
// Interval of their age: through the service, with a GCRA key that single
// requests share, most of the units returns forfeited.
func TestTakeAllHoldKeepsLease(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	g := &gated{Store: m, gates: map[string]chan struct{}{}, held: make(chan string)}
	s := newLease(t, g, clock, time.Second, 4)
	lg := sluice.PerSecond(100) // one unit per 10 ms
	lf := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 10, Period: time.Second}
	if d, err := m.Take(ctx, "f", lf, 10); err != nil || !d.Allowed {
		t.Fatal(d, err) // f is spent: its grant will be nothing
	}
	gf := make(chan struct{})
	g.gates["f"] = gf
	all := make(chan []sluice.Decision)
	go func() {
		// Both need grants, sent together: g's takes 3 of its 4 units and
		// holds them until f's is back.
		ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "g", Limit: lg, Cost: 3}, {Key: "f", Limit: lf, Cost: 1}})
		if err != nil {
			t.Error(err)
		}
		all <- ds
	}()
	if k := <-g.held; k != "f" {
		t.Fatalf("held %s's grant, want f's", k)
	}
	grantedBeside(t, s, "g", lg) // 3 of g's 4 units held for the TakeAll
	if d := take(t, s, "g", lg, 1); !d.Allowed || d.Source != sluice.SourceLease {
		t.Fatalf("a take beside the TakeAll: %+v, want the lease's last unit", d)
	}
	clock.Advance(15 * time.Millisecond)
	if d := take(t, s, "g", lg, 1); !d.Allowed || d.Source != sluice.SourceBackend {
		t.Fatalf("a take while the TakeAll holds the lease's last units: %+v, want the store's", d)
	}
	close(gf)
	if ds := <-all; ds[0].Allowed && ds[1].Allowed {
		t.Fatalf("TakeAll: %+v, want denied by f", ds)
	}
	if st := s.Stats(); st.Grants != 2 || st.Forfeited != 0 {
		t.Fatalf("%+v: want g's grant and f's, nothing forfeited", st)
	}
	if d := take(t, s, "g", lg, 3); !d.Allowed || d.Source != sluice.SourceLease {
		t.Fatalf("after the TakeAll: %+v, want the lease's 3 units", d)
	}
}

// While a top-up has a live lease's last units out, with the store's Take
// of the rest, another request on the key goes to the store's Take rather
// than a new grant: when the store denies the rest, the units go back into
// the lease. A new grant replaced the lease, and they went back to the
// store under the return rule, which kept them; under closed-loop overload
// that was what was left of layered checks' loss (TestLayeredClosedLoop).
func TestTopUpKeepsLease(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	g := &gated{Store: m, takes: map[string]chan struct{}{}, held: make(chan string)}
	s := newLease(t, g, clock, time.Second, 4)
	l := sluice.PerSecond(10) // one unit per 100 ms
	take(t, s, "k", l, 1)     // a lease of 4, 3 left
	take(t, s, "k", l, 2)     // 1 left
	if d, err := m.Take(ctx, "k", l, 6); err != nil || !d.Allowed {
		t.Fatal(d, err) // the store is empty
	}
	clock.Advance(250 * time.Millisecond) // 2 units back in the store; the lease lives
	gate := make(chan struct{})
	g.takes["k"] = gate
	first := make(chan sluice.Decision)
	go func() { first <- take(t, s, "k", l, 3) }() // the lease's 1 and 2 from the store
	if k := <-g.held; k != "k" {
		t.Fatalf("held %s's Take", k)
	}
	if d := take(t, s, "k", l, 1); !d.Allowed {
		t.Fatalf("a take while the top-up is out: %+v, want allowed", d)
	}
	close(gate) // 1 unit left in the store: the top-up is denied
	if d := <-first; d.Allowed {
		t.Fatalf("the top-up: %+v, want denied", d)
	}
	if st := s.Stats(); st.Forfeited != 0 || st.Grants != 1 {
		t.Fatalf("%+v: want one grant, nothing forfeited", st)
	}
	if d := take(t, s, "k", l, 1); !d.Allowed || d.Source != sluice.SourceLease {
		t.Fatalf("after the top-up: %+v, want the lease's unit", d)
	}
}

// A GCRA lease taken for a TakeAll that a spent fixed window denies until
// its window's end goes back at once, and while the window denies the
// GCRA's next checks are the store's: held until it ended, it went back
// less one unit per Interval of its age, every D, and under closed-loop
// overload starting with a window layered checks lost 7-14 % of the exact
// limiter's units (TestLayeredClosedLoop, SLUICE_LAYERED_PHASE=0).
func TestSiblingDenialReturnsLease(t *testing.T) {
	t.Parallel()
	const d = 50 * time.Millisecond
	clock, m, s, lf := spentWindow(t, d)
	lg := sluice.PerSecond(100) // one unit per 10 ms
	if d, err := m.Take(ctx, "g", lg, 100); err != nil || !d.Allowed {
		t.Fatal(d, err) // the GCRA is empty
	}
	clock.Advance(100 * time.Millisecond) // 10 units back in the GCRA
	deniedBySibling(t, s, lg, lf)
	if st := s.Stats(); st.Grants != 2 || st.Granted != 10 || st.Returned != 10 {
		t.Fatalf("%+v: want a grant of 10 units for the GCRA, all of them back at once, and one grant of nothing for the window", st)
	}
	clock.Advance(d + 10*time.Millisecond)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	// Nothing admitted: the 10 units there at the grant and the 6 refilled
	// since, as without leases.
	if d, err := m.Peek(ctx, "g", lg, 1); err != nil || d.Remaining != 16 {
		t.Fatalf("the GCRA after Close: %+v, %v; want 16 left", d, err)
	}
	if st := s.Stats(); st.Forfeited != 0 {
		t.Fatalf("%+v: want nothing forfeited", st)
	}
}

// spentWindow returns a lease store (D d, Size 10) over a memory store on
// a test clock at a window's start, and a fixed window limit whose key "f"
// is spent there until T0 + 1s.
func spentWindow(t *testing.T, d time.Duration) (*storetest.Clock, *memory.Store, *lease.Store, sluice.Limit) {
	t.Helper()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	s := newLease(t, m, clock, d, 10)
	lf := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 10, Period: time.Second}
	if d, err := m.Take(ctx, "f", lf, 10); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	return clock, m, s, lf
}

// deniedBySibling sends 3 TakeAlls of a unit of "g" under lg and of "f"
// under lf, spent: each wants g's verdict allowed and f's denied.
func deniedBySibling(t *testing.T, s *lease.Store, lg, lf sluice.Limit) {
	t.Helper()
	reqs := []sluice.Request{{Key: "g", Limit: lg, Cost: 1}, {Key: "f", Limit: lf, Cost: 1}}
	for range 3 {
		ds, err := s.TakeAll(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		if !ds[0].Allowed || ds[1].Allowed {
			t.Fatalf("TakeAll: %+v, want the GCRA's verdict allowed and the window's denied", ds)
		}
	}
}

// A GCRA lease granted for a Take stays when a spent fixed window denies a
// TakeAll of the same key: the key's single requests spend it. Given back
// at once, young, it lost a unit per Interval of its age, at every such
// denial; with single requests on the key beside layered ones, 4 lease
// Stores over one Redis lost 1.8-3.5 % of the GCRA's units
// (TestLayeredMixedClosedLoop), and through the service up to 12 %.
func TestSiblingDenialKeepsTakesLease(t *testing.T) {
	t.Parallel()
	clock, _, s, lf := spentWindow(t, 50*time.Millisecond)
	lg := sluice.PerSecond(1000) // one unit per ms
	if d := take(t, s, "g", lg, 1); d.Source != sluice.SourceBackend {
		t.Fatalf("first Take: %+v, want a grant", d) // the lease holds 9
	}
	clock.Advance(5 * time.Millisecond)
	deniedBySibling(t, s, lg, lf)
	for i := range 9 {
		if d := take(t, s, "g", lg, 1); !d.Allowed || d.Source != sluice.SourceLease {
			t.Fatalf("Take %d after the denials: %+v, want the lease's", i, d)
		}
	}
	if st := s.Stats(); st.Returned != 0 || st.Forfeited != 0 {
		t.Fatalf("%+v: want nothing given back", st)
	}
}

// While a TakeAll's other checks are at the store, the checks their leases
// answer hold nothing: the key's other requests find the lease whole.
// Taken before the calls, the units were out of it for a round trip, and
// under closed-loop overload the key's other requests, finding it short,
// went to the store one by one (3.5 times fewer decisions in
// TestLayeredClosedLoop).
func TestTakeAllLeasesAnswerAfterCalls(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	g := &gated{Store: m, gates: map[string]chan struct{}{}, held: make(chan string)}
	s := newLease(t, g, clock, time.Second, 4)
	l := sluice.PerSecond(100)
	take(t, s, "a", l, 1) // a lease of 4, 3 left
	gc := make(chan struct{})
	g.gates["c"] = gc
	all := make(chan []sluice.Decision)
	go func() {
		ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: l, Cost: 3}, {Key: "c", Limit: l, Cost: 1}})
		if err != nil {
			t.Error(err)
		}
		all <- ds
	}()
	if k := <-g.held; k != "c" {
		t.Fatalf("held %s's grant, want c's", k)
	}
	if d := take(t, s, "a", l, 3); !d.Allowed || d.Source != sluice.SourceLease {
		t.Fatalf("a take while the TakeAll's grant is out: %+v, want the lease's 3 units", d)
	}
	close(gc)
	ds := <-all
	if !ds[0].Allowed || !ds[1].Allowed || ds[0].Source != sluice.SourceBackend {
		t.Fatalf("TakeAll: %+v; want both admitted, a by its refill", ds)
	}
	if st := s.Stats(); st.Grants != 3 || st.Forfeited != 0 {
		t.Fatalf("%+v: want a's two grants and c's, nothing forfeited", st)
	}
}

// A TakeAll whose leases answer every check makes no call and allocates
// only its answer's slices; one that a check's remembered denial answers
// takes no lease's units, in either order: the other check's verdict is
// its lease's, as a Peek's, and its lease holds what it held.
func TestTakeAllLocal(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	plenty := sluice.Limit{Rate: 1e9, Period: time.Hour}
	// 2 units an hour, spent below: the grant of nothing is remembered for
	// half an hour, under the staleness (an hour), so b's lease is not
	// given back for it (quiet).
	scarce := sluice.Limit{Rate: 2, Period: time.Hour}
	for _, c := range []struct {
		name string
		reqs []sluice.Request
		deny int // the check its remembered denial answers, −1 none
	}{
		{"leased", []sluice.Request{{Key: "a", Limit: plenty, Cost: 1}, {Key: "b", Limit: plenty, Cost: 1}}, -1},
		{"denied first", []sluice.Request{{Key: "a", Limit: scarce, Cost: 1}, {Key: "b", Limit: plenty, Cost: 1}}, 0},
		{"denied last", []sluice.Request{{Key: "b", Limit: plenty, Cost: 1}, {Key: "a", Limit: scarce, Cost: 1}}, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := newLease(t, newMemory(t, clock), clock, time.Hour, 1000)
			for range 3 {
				if _, err := s.TakeAll(ctx, c.reqs); err != nil {
					t.Fatal(err)
				}
			}
			other := 1 - max(c.deny, 0)
			before := s.Stats()
			peek, err := s.Peek(ctx, c.reqs[other].Key, c.reqs[other].Limit, 1)
			if err != nil || peek.Source != sluice.SourceLease {
				t.Fatalf("Peek = %+v, %v; want answered from its lease", peek, err)
			}
			ds, err := s.TakeAll(ctx, c.reqs)
			if err != nil {
				t.Fatal(err)
			}
			if c.deny >= 0 {
				if d := ds[c.deny]; d.Allowed || d.Source != sluice.SourceDenyCache {
					t.Fatalf("check %d: %+v, want its remembered denial", c.deny, d)
				}
				if ds[other] != peek {
					t.Fatalf("check %d: %+v, want its Peek's %+v", other, ds[other], peek)
				}
				if again, _ := s.Peek(ctx, c.reqs[other].Key, c.reqs[other].Limit, 1); again != peek {
					t.Fatalf("Peek after = %+v, want %+v: the lease lost units", again, peek)
				}
			} else if !ds[0].Allowed || !ds[1].Allowed {
				t.Fatalf("TakeAll = %+v, want both admitted", ds)
			}
			if !race.Enabled {
				if n := testing.AllocsPerRun(100, func() { s.TakeAll(ctx, c.reqs) }); n > 2 {
					t.Errorf("%v allocations per TakeAll, want at most 2", n)
				}
			}
			if st := s.Stats(); st.Grants != before.Grants || c.deny >= 0 && st.Local != before.Local {
				t.Fatalf("Stats() = %+v after %+v: want no grant, and no local decision when denied", st, before)
			}
		})
	}
}
