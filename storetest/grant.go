package storetest

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// RunGrant runs the conformance suite of sluice.Granter against the stores
// newStore returns, which must implement it: partial grants, the return
// rule, window returns, bad input and a grant time set far in the past;
// and, for a sluice.Regranter, that a
// Regrant is a Return followed by a Grant.
func RunGrant(t *testing.T, newStore NewStore) {
	t.Run("grant_buckets", func(t *testing.T) {
		for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
			t.Run(a.String(), func(t *testing.T) {
				t.Parallel()
				testGrantBucket(t, newStore, a)
			})
		}
	})
	t.Run("grant_fixed_window", func(t *testing.T) { testGrantWindow(t, newStore, sluice.FixedWindow) })
	t.Run("grant_sliding_window_counter", func(t *testing.T) { testGrantWindow(t, newStore, sluice.SlidingWindowCounter) })
	t.Run("grant_bad_input", func(t *testing.T) { testGrantBadInput(t, newStore) })
	t.Run("regrant", func(t *testing.T) {
		for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket, sluice.FixedWindow, sluice.SlidingWindowCounter} {
			t.Run(a.String(), func(t *testing.T) {
				t.Parallel()
				testRegrant(t, newStore, a)
			})
		}
	})
	t.Run("return_forged_at", func(t *testing.T) {
		for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket, sluice.FixedWindow, sluice.SlidingWindowCounter} {
			t.Run(a.String(), func(t *testing.T) {
				t.Parallel()
				testReturnForgedAt(t, newStore, a)
			})
		}
	})
	t.Run("return_after_reset", func(t *testing.T) {
		for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket, sluice.FixedWindow, sluice.SlidingWindowCounter} {
			t.Run(a.String(), func(t *testing.T) {
				t.Parallel()
				testReturnAfterReset(t, newStore, a)
			})
		}
	})
}

// testReturnAfterReset: a grant made before a Reset gives nothing back
// into the key as it is after it, whose takes were never charged its
// units; a grant made after the Reset returns as usual; and the mark
// lasts until no return could give anything, not forever.
func testReturnAfterReset(t *testing.T, newStore NewStore, a sluice.Algorithm) {
	ctx := context.Background()
	clock, s, l, key := grantSetup(t, newStore, a, "reset")
	old, err := s.Grant(ctx, key, l, 10)
	if err != nil || old.Granted != 10 {
		t.Fatalf("grant = %+v, %v; want 10 granted", old, err)
	}
	// The Reset comes from a process whose clock is 20ms behind the
	// granter's: no clock is compared.
	clock.Advance(-20 * time.Millisecond)
	if err := s.Reset(ctx, key, l); err != nil {
		t.Fatal(err)
	}
	clock.Advance(30 * time.Millisecond)
	// After the Reset the key is fresh: 8 units are taken from it.
	if d, err := s.Take(ctx, key, l, 8); err != nil || !d.Allowed {
		t.Fatalf("take 8 after reset = %+v, %v", d, err)
	}
	clock.Advance(10 * time.Millisecond)
	if got, err := s.Return(ctx, key, l, old, 10); err != nil || got != 0 {
		t.Fatalf("return of a grant from before the reset = %d, %v; want 0", got, err)
	}
	checkPeek(t, s, key, l, 2)
	// A grant after the Reset returns as usual.
	g, err := s.Grant(ctx, key, l, 2)
	if err != nil || g.Granted != 2 {
		t.Fatalf("grant after reset = %+v, %v; want 2", g, err)
	}
	if got, err := s.Return(ctx, key, l, g, 2); err != nil || got != 2 {
		t.Fatalf("return of a grant from after the reset = %d, %v; want 2", got, err)
	}
	// A second Reset starts another epoch: the grant just made is of the
	// one before.
	g, err = s.Grant(ctx, key, l, 1)
	if err != nil || g.Granted != 1 {
		t.Fatalf("grant = %+v, %v; want 1", g, err)
	}
	if err := s.Reset(ctx, key, l); err != nil {
		t.Fatal(err)
	}
	if d, err := s.Take(ctx, key, l, 10); err != nil || !d.Allowed {
		t.Fatalf("take 10 after the second reset = %+v, %v", d, err)
	}
	if got, err := s.Return(ctx, key, l, g, 1); err != nil || got != 0 {
		t.Fatalf("return across a second reset = %d, %v; want 0", got, err)
	}
	// A Reset under a limit of a shorter horizon (a reload changed it)
	// keeps the epoch as long as the grant before it needs: the grant's
	// return still finds another epoch once the Reset's own horizon (2ms at
	// most) has passed, in real time too, for stores whose marks expire by
	// the server's clock.
	long := sluice.Limit{Rate: 10, Period: time.Second, Burst: 60}.WithAlgorithm(a)
	if a == sluice.FixedWindow || a == sluice.SlidingWindowCounter {
		long = sluice.PerMinute(600).WithAlgorithm(a)
	}
	short := sluice.Limit{Rate: 1, Period: time.Millisecond}.WithAlgorithm(a)
	reloaded := uniqueKey(t, "reset-reloaded")
	g, err = s.Grant(ctx, reloaded, long, 50)
	if err != nil || g.Granted != 50 {
		t.Fatalf("grant = %+v, %v; want 50", g, err)
	}
	if err := s.Reset(ctx, reloaded, short); err != nil {
		t.Fatal(err)
	}
	time.Sleep(30 * time.Millisecond)
	clock.Advance(30 * time.Millisecond)
	if d, err := s.Take(ctx, reloaded, long, 40); err != nil || !d.Allowed {
		t.Fatalf("take 40 after the reset = %+v, %v", d, err)
	}
	if got, err := s.Return(ctx, reloaded, long, g, 40); err != nil || got != 0 {
		t.Fatalf("return past the reset's shorter horizon = %d, %v; want 0", got, err)
	}
	// Resetting a key without state leaves no mark, and a mark ends: a
	// grant made after either returns.
	clock.Advance(sluice.ReturnHorizon(l) + time.Second)
	fresh := uniqueKey(t, "reset-fresh")
	if err := s.Reset(ctx, fresh, l); err != nil {
		t.Fatal(err)
	}
	g, err = s.Grant(ctx, fresh, l, 3)
	if err != nil || g.Granted != 3 {
		t.Fatalf("grant = %+v, %v; want 3", g, err)
	}
	if got, err := s.Return(ctx, fresh, l, g, 3); err != nil || got != 3 {
		t.Fatalf("return on a key reset while fresh = %d, %v; want 3", got, err)
	}
}

// testReturnForgedAt: a grant whose At is the caller's forgery, however
// far in the past (down to math.MinInt64, where the grant's age overflows
// an int64), is a grant too old to give anything back: by the return rule
// for the buckets and GCRA, its window gone for the window algorithms.
// Nothing is given back, the key is unchanged, and a Regrant still grants.
func testReturnForgedAt(t *testing.T, newStore NewStore, a sluice.Algorithm) {
	ctx := context.Background()
	_, s, l, key := grantSetup(t, newStore, a, "forged-at")
	for _, at := range []int64{math.MinInt64, math.MinInt64 + 1, -T0.UnixMicro(), -1 << 62, 0, T0.UnixMicro() - 1<<40} {
		g, err := s.Grant(ctx, key, l, 10)
		if err != nil || g.Granted != 10 {
			t.Fatalf("At %d: grant 10 = %+v, %v", at, g, err)
		}
		forged := g
		forged.At = at
		if got, err := s.Return(ctx, key, l, forged, 10); err != nil || got != 0 {
			t.Errorf("return of 10 with At %d = %d, %v; want 0", at, got, err)
		}
		checkPeek(t, s, key, l, 0)
		if rg, ok := s.(sluice.Regranter); ok {
			back, next, err := rg.Regrant(ctx, key, l, forged, 10, 1)
			if err != nil || back != 0 || next.Granted != 0 {
				t.Errorf("regrant of 10 with At %d = %d, %+v, %v; want 0 back, none granted", at, back, next, err)
			}
		}
		checkPeek(t, s, key, l, 0)
		// Give the grant back by its own At, for the next forgery.
		if got, err := s.Return(ctx, key, l, g, 10); err != nil || got != 10 {
			t.Fatalf("return of 10 with its own At = %d, %v; want 10", got, err)
		}
	}
}

// grantSetup returns a clock at T0, a granter on it, 10/s under a and a
// key of the test's own.
func grantSetup(t *testing.T, newStore NewStore, a sluice.Algorithm, name string) (*Clock, sluice.Granter, sluice.Limit, string) {
	clock := NewClock(T0)
	return clock, granter(t, newStore, clock), sluice.PerSecond(10).WithAlgorithm(a), uniqueKey(t, name)
}

func granter(t *testing.T, newStore NewStore, clock *Clock) sluice.Granter {
	t.Helper()
	g, ok := newStore(t, clock.Now).(sluice.Granter)
	if !ok {
		t.Fatal("the store is not a sluice.Granter")
	}
	return g
}

type grantStep struct {
	at      time.Duration // from T0
	n       int64
	granted int64
	remain  int64         // Remaining after the grant
	retry   time.Duration // RetryAfter when nothing was granted
}

// testGrantBucket walks 10/s (burst 10, a unit every 100ms): partial
// grants, a denial's retry, and the return rule: unused less one unit per
// interval begun since the grant.
func testGrantBucket(t *testing.T, newStore NewStore, a sluice.Algorithm) {
	ctx := context.Background()
	clock, s, l, key := grantSetup(t, newStore, a, "grant")
	var last sluice.Grant
	for i, st := range []grantStep{
		{at: 0, n: 4, granted: 4, remain: 6},
		{at: 0, n: 10, granted: 6, remain: 0},
		{at: 0, n: 1, granted: 0, remain: 0, retry: 100 * time.Millisecond},
		{at: 250 * time.Millisecond, n: 5, granted: 2, remain: 0},
		{at: 250 * time.Millisecond, n: 1, granted: 0, remain: 0, retry: 50 * time.Millisecond},
	} {
		clock.Set(T0.Add(st.at))
		g, err := s.Grant(ctx, key, l, st.n)
		if err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if g.Granted != st.granted || g.Remaining != st.remain || g.RetryAfter != st.retry {
			t.Fatalf("step %d: grant(%d) = %+v, want granted %d remaining %d retry %v", i, st.n, g, st.granted, st.remain, st.retry)
		}
		if g.Granted > 0 {
			last = g
		}
	}
	// At once, every unused unit goes back.
	if got, err := s.Return(ctx, key, l, last, 2); err != nil || got != 2 {
		t.Fatalf("return at age 0 = %d, %v; want 2", got, err)
	}
	checkPeek(t, s, key, l, 2)

	clock.Set(T0.Add(time.Hour))
	for _, step := range []struct {
		name         string
		age          time.Duration
		unused, want int64 // returned, and given back
		left         int64 // Peek's Remaining after
	}{
		// A full bucket's grant, returned 250ms later (3 intervals begun): 8
		// unused give back 5, beside the 2 refilled.
		{"rule", 250 * time.Millisecond, 8, 5, 7},
		// Returned after the bucket could have refilled: nothing comes back,
		// and the key is no fuller than fresh.
		{"late", 2 * time.Second, 10, 0, 10},
	} {
		key := uniqueKey(t, step.name)
		g, err := s.Grant(ctx, key, l, 10)
		if err != nil || g.Granted != 10 {
			t.Fatalf("%s: grant 10 = %+v, %v", step.name, g, err)
		}
		clock.Advance(step.age)
		if got, err := s.Return(ctx, key, l, g, step.unused); err != nil || got != step.want {
			t.Fatalf("%s: return %d at age %v = %d, %v; want %d", step.name, step.unused, step.age, got, err, step.want)
		}
		checkPeek(t, s, key, l, step.left)
	}

	// Into a key reset since the grant: nothing to give back into, and
	// nothing reported.
	key = uniqueKey(t, "reset")
	g, err := s.Grant(ctx, key, l, 5)
	if err != nil || g.Granted != 5 {
		t.Fatalf("reset: grant 5 = %+v, %v", g, err)
	}
	if err := s.Reset(ctx, key, l); err != nil {
		t.Fatal(err)
	}
	if got, err := s.Return(ctx, key, l, g, 5); err != nil || got != 0 {
		t.Fatalf("return of 5 into a reset key = %d, %v; want 0", got, err)
	}
	checkPeek(t, s, key, l, 10)
}

// testGrantWindow walks 10/s in windows of one second: grants up to the
// window's count, Window is the time to the window's end, and a return goes
// only into the grant's window.
func testGrantWindow(t *testing.T, newStore NewStore, a sluice.Algorithm) {
	t.Parallel()
	ctx := context.Background()
	clock := NewClock(T0.Add(500 * time.Millisecond))
	s := granter(t, newStore, clock)
	l := sluice.PerSecond(10).WithAlgorithm(a)
	key := uniqueKey(t, "grant")
	g, err := s.Grant(ctx, key, l, 4)
	if err != nil || g.Granted != 4 || g.Window != 500*time.Millisecond {
		t.Fatalf("grant 4 = %+v, %v; want 4 with Window 500ms", g, err)
	}
	g2, err := s.Grant(ctx, key, l, 10)
	if err != nil || g2.Granted != 6 || g2.Remaining != 0 {
		t.Fatalf("grant 10 = %+v, %v; want 6, remaining 0", g2, err)
	}
	if g3, err := s.Grant(ctx, key, l, 1); err != nil || g3.Granted != 0 || g3.RetryAfter <= 0 {
		t.Fatalf("grant 1 = %+v, %v; want none with a retry", g3, err)
	}
	clock.Advance(400 * time.Millisecond) // no age rule within the window
	if got, err := s.Return(ctx, key, l, g2, 3); err != nil || got != 3 {
		t.Fatalf("return 3 = %d, %v; want 3", got, err)
	}
	checkPeek(t, s, key, l, 3)

	// A grant taken in one window and returned in the next gives nothing to
	// the next window.
	key = uniqueKey(t, "next")
	g, err = s.Grant(ctx, key, l, 10)
	if err != nil || g.Granted != 10 || g.Window != 100*time.Millisecond {
		t.Fatalf("grant 10 = %+v, %v; want 10 with Window 100ms", g, err)
	}
	clock.Advance(time.Second) // the next window, as far into it
	before, err := s.Peek(ctx, key, l, 1)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Return(ctx, key, l, g, 10)
	if err != nil {
		t.Fatal(err)
	}
	after, err := s.Peek(ctx, key, l, 1)
	if err != nil {
		t.Fatal(err)
	}
	if a == sluice.FixedWindow && after.Remaining != before.Remaining {
		t.Errorf("after a return into a window gone by: %d left, want %d", after.Remaining, before.Remaining)
	}
	if want := after.Remaining - before.Remaining; got != want {
		t.Errorf("a return into a window gone by reported %d given back; a take could have %d more", got, want)
	}
}

func checkPeek(t *testing.T, s sluice.Store, key string, l sluice.Limit, want int64) {
	t.Helper()
	d, err := s.Peek(context.Background(), key, l, 1)
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != want {
		t.Errorf("Peek: Remaining = %d, want %d", d.Remaining, want)
	}
}

func testGrantBadInput(t *testing.T, newStore NewStore) {
	t.Parallel()
	ctx := context.Background()
	clock := NewClock(T0)
	s := granter(t, newStore, clock)
	l := sluice.PerSecond(10)
	key := uniqueKey(t, "bad")
	for _, c := range []struct {
		name string
		l    sluice.Limit
		n    int64
		want error
	}{
		{"zero", l, 0, sluice.ErrInvalidCost},
		{"above_capacity", l, 11, sluice.ErrCostExceedsBurst},
		{"log", l.WithAlgorithm(sluice.SlidingWindowLog), 1, sluice.ErrGrantUnsupported},
		{"bad_limit", sluice.Limit{Rate: 0, Period: time.Second}, 1, sluice.ErrInvalidLimit},
	} {
		if _, err := s.Grant(ctx, key, c.l, c.n); !errors.Is(err, c.want) {
			t.Errorf("%s: err = %v, want %v", c.name, err, c.want)
		}
	}
	g, err := s.Grant(ctx, key, l, 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, unused := range []int64{0, -1, 4} {
		if _, err := s.Return(ctx, key, l, g, unused); !errors.Is(err, sluice.ErrInvalidReturn) {
			t.Errorf("return %d of 3: err = %v, want ErrInvalidReturn", unused, err)
		}
	}
	if rg, ok := s.(sluice.Regranter); ok {
		// Either part's bad input refuses the whole call: the return, valid
		// on its own, is not made either.
		for _, c := range []struct {
			name      string
			l         sluice.Limit
			unused, n int64
			want      error
		}{
			{"unused_zero", l, 0, 1, sluice.ErrInvalidReturn},
			{"unused_above_granted", l, 4, 1, sluice.ErrInvalidReturn},
			{"n_zero", l, 3, 0, sluice.ErrInvalidCost},
			{"n_above_capacity", l, 3, 11, sluice.ErrCostExceedsBurst},
			{"log", l.WithAlgorithm(sluice.SlidingWindowLog), 3, 1, sluice.ErrGrantUnsupported},
		} {
			if _, _, err := rg.Regrant(ctx, key, c.l, g, c.unused, c.n); !errors.Is(err, c.want) {
				t.Errorf("regrant %s: err = %v, want %v", c.name, err, c.want)
			}
		}
	}
	checkPeek(t, s, key, l, 7) // nothing changed
}

// testRegrant replays one seeded history of takes, grants, lease spending,
// refills and Resets on two keys at the same instants: on one a refill is a
// Return and then a Grant, on the other a Regrant. Every answer, and each
// key's state after every step, must be the same. Instants are whole
// seconds under a per-minute limit, so that no key's state is within a
// second of expiring (Redis expires keys by its own clock).
func testRegrant(t *testing.T, newStore NewStore, a sluice.Algorithm) {
	ctx := context.Background()
	clock := NewClock(T0)
	s := granter(t, newStore, clock)
	rg, ok := s.(sluice.Regranter)
	if !ok {
		t.Skip("the store is not a sluice.Regranter")
	}
	l := sluice.PerMinute(10).WithAlgorithm(a)
	keys := [2]string{uniqueKey(t, "two-calls"), uniqueKey(t, "regrant")}
	var leases [2]sluice.Grant
	var unused int64 // the same on both keys
	r := rand.New(rand.NewPCG(uint64(a), 7))
	refills := 0
	for step := range 120 {
		clock.Advance(time.Duration(r.IntN(9)) * time.Second)
		switch op := r.IntN(10); {
		case op < 3: // an exact take
			cost := 1 + r.Int64N(3)
			d0, err0 := s.Take(ctx, keys[0], l, cost)
			d1, err1 := s.Take(ctx, keys[1], l, cost)
			if err0 != nil || err1 != nil || d0 != d1 {
				t.Fatalf("step %d: take %d: %+v, %v and %+v, %v", step, cost, d0, err0, d1, err1)
			}
		case op < 5 && unused > 0: // the lease spends
			unused -= 1 + r.Int64N(unused)
		case op == 5 && step%4 == 0:
			for _, k := range keys {
				if err := s.Reset(ctx, k, l); err != nil {
					t.Fatal(err)
				}
			}
		default: // a refill, or a first grant
			n := 1 + r.Int64N(l.Capacity())
			var back [2]int64
			var next [2]sluice.Grant
			var errs [2]error
			if unused > 0 {
				refills++
				back[0], errs[0] = s.Return(ctx, keys[0], l, leases[0], unused)
				if errs[0] == nil {
					next[0], errs[0] = s.Grant(ctx, keys[0], l, n)
				}
				back[1], next[1], errs[1] = rg.Regrant(ctx, keys[1], l, leases[1], unused, n)
			} else {
				next[0], errs[0] = s.Grant(ctx, keys[0], l, n)
				next[1], errs[1] = s.Grant(ctx, keys[1], l, n)
			}
			if errs[0] != nil || errs[1] != nil || back[0] != back[1] || next[0] != next[1] {
				t.Fatalf("step %d: %d unused, then %d asked: return %d and grant %+v (%v); regrant %d and %+v (%v)",
					step, unused, n, back[0], next[0], errs[0], back[1], next[1], errs[1])
			}
			leases, unused = next, next[0].Granted
		}
		for _, cost := range []int64{1, l.Capacity()} {
			p0, err0 := s.Peek(ctx, keys[0], l, cost)
			p1, err1 := s.Peek(ctx, keys[1], l, cost)
			if err0 != nil || err1 != nil || p0 != p1 {
				t.Fatalf("step %d: the keys differ: Peek(%d) = %+v, %v and %+v, %v", step, cost, p0, err0, p1, err1)
			}
		}
	}
	if refills < 20 {
		t.Fatalf("only %d refills in the history", refills)
	}
}
