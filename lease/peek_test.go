package lease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/storetest"
)

// A Peek says what a Take at the same instant decides: random schedules of
// one process's requests, most Peeked and then Taken at once, on every
// algorithm that leases, with leases live, spent, too small, ended with
// units left (within their window and past it), and remembered denials.
func TestPeekAsTake(t *testing.T) {
	t.Parallel()
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket, sluice.FixedWindow, sluice.SlidingWindowCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			for seed := range uint64(300) {
				r := rand.New(rand.NewPCG(seed, uint64(alg)))
				l := sluice.Limit{Algorithm: alg, Rate: 2 + r.Int64N(10), Period: time.Second}
				if alg < sluice.FixedWindow && r.IntN(2) == 0 {
					l.Burst = 1 + r.Int64N(12)
				}
				clock := storetest.NewClock(storetest.T0)
				d := time.Duration(1+r.Int64N(l.Period.Microseconds()-1)) * time.Microsecond
				mem := newMemory(t, clock)
				s, err := lease.New(mem, &lease.Options{MaxStaleness: d, Size: r.Int64N(l.Capacity() + 1), Clock: clock.Now})
				if err != nil {
					t.Fatal(err)
				}
				iv := l.Interval()
				for step := range 60 {
					switch r.IntN(4) {
					case 0:
					case 1:
						clock.Advance(time.Duration(r.Int64N(iv.Microseconds()+1)) * time.Microsecond)
					case 2:
						clock.Advance(d + time.Duration(r.Int64N(3)-1)*time.Microsecond)
					default:
						clock.Advance(time.Duration(r.Int64N(l.Period.Microseconds()+1)) * time.Microsecond)
					}
					cost := int64(1)
					if r.IntN(3) == 0 {
						cost = 1 + r.Int64N(l.Capacity())
					}
					if r.IntN(8) == 0 {
						// Another process's doing (its units given back, a
						// Reset): the store has budget this one's remembered
						// denial does not know of, for Peek as for Take.
						if err := mem.Reset(ctx, "k", l); err != nil {
							t.Fatal(err)
						}
					}
					if r.IntN(4) == 0 { // a Take alone: its own refills
						take(t, s, "k", l, cost)
						continue
					}
					p, err := s.Peek(ctx, "k", l, cost)
					if err != nil {
						t.Fatal(err)
					}
					tk := take(t, s, "k", l, cost)
					if p.Allowed != tk.Allowed {
						t.Fatalf("seed %d, %v, D %v, step %d at %v: Peek(%d) = %+v, then Take(%d) = %+v", seed, l, d, step, clock.Now().Sub(storetest.T0), cost, p, cost, tk)
					}
				}
			}
		})
	}
}

// A lease that has ended holding units: the Take after a Peek gives them
// back before asking the store, so the Peek counts them too, as that Take
// would. It did not (it counted a live lease's alone), and denied what the
// Take then admitted: within the window for the fixed window, past it for
// the sliding window counter (the units weigh on the next window's
// estimate as the previous window's), under the return rule for GCRA.
func TestPeekCountsEndedLease(t *testing.T) {
	t.Parallel()
	checkPeekCountsEndedLease(t, func(t *testing.T, clock *storetest.Clock) sluice.Granter { return newMemory(t, clock) })
}

// checkPeekCountsEndedLease runs TestPeekCountsEndedLease on the granters
// that newGranter makes, each on its clock.
func checkPeekCountsEndedLease(t *testing.T, newGranter func(*testing.T, *storetest.Clock) sluice.Granter) {
	for _, c := range []struct {
		name    string
		l       sluice.Limit
		advance time.Duration // from the grant of 8 (7 left) at 100ms
		cost    int64
		back    int64 // what the store reports taken back
	}{
		// Ended at D, still in its window: 8 + 5 over 10, 1 + 5 not.
		{"fixed_window", sluice.PerSecond(10).WithAlgorithm(sluice.FixedWindow), 600 * time.Millisecond, 5, 7},
		// In the next window, 20% in: 8 × 0.8 + 5 over 10, 1 × 0.8 + 5
		// not; a take could have 6 more (⌊10 − 0.8⌋ − ⌊10 − 6.4⌋).
		{"sliding_window_counter", sluice.PerSecond(10).WithAlgorithm(sluice.SlidingWindowCounter), 1100 * time.Millisecond, 5, 6},
		// Ended at D and 1ms: 2 + 5 refilled in the bucket, and of the 7
		// unused one given back (less 6 intervals begun): 7 < 8 ≤ 7 + 1.
		{"gcra", sluice.PerSecond(10), 501 * time.Millisecond, 8, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(storetest.T0.Add(100 * time.Millisecond))
			g := newGranter(t, clock)
			s := newLease(t, g, clock, 500*time.Millisecond, 8)
			if d := take(t, s, "k", c.l, 1); !d.Allowed || d.Source != sluice.SourceBackend {
				t.Fatalf("first take = %+v; want a grant", d)
			}
			clock.Advance(c.advance)
			if d, err := g.Peek(ctx, "k", c.l, c.cost); err != nil || d.Allowed {
				t.Fatalf("the store alone: Peek(%d) = %+v, %v; want denied", c.cost, d, err)
			}
			p, err := s.Peek(ctx, "k", c.l, c.cost)
			if err != nil || !p.Allowed {
				t.Fatalf("Peek(%d) = %+v, %v; want allowed, as the Take after it", c.cost, p, err)
			}
			if st := s.Stats(); st.Returned != uint64(c.back) {
				t.Errorf("after the Peek: stats %+v; want %d units given back", st, c.back)
			}
			if d := take(t, s, "k", c.l, c.cost); !d.Allowed {
				t.Fatalf("Take(%d) after the Peek = %+v; want allowed", c.cost, d)
			}
			if st := s.Stats(); st.Returned != uint64(c.back) || st.Grants != 2 {
				t.Errorf("after the Take: stats %+v; want %d units given back once, 2 grants", st, c.back)
			}
		})
	}
}

// failingReturn is a granter whose returns fail with err.
type failingReturn struct {
	sluice.Granter
	err     error
	returns atomic.Int64
}

func (f *failingReturn) Return(context.Context, string, sluice.Limit, sluice.Grant, int64) (int64, error) {
	f.returns.Add(1)
	return 0, f.err
}

// A Peek whose return of an ended lease's units fails sends it once, as a
// Take's refill would, and never again: the units stay out of the store.
// Held back or failed under a failure policy (resilient.ErrNoGrant), the
// store still answers the Peek; another error is the Peek's.
func TestPeekEndedLeaseReturnFails(t *testing.T) {
	t.Parallel()
	errDown := errors.New("redis: connection reset")
	for _, c := range []struct {
		name string
		err  error
		want error // the Peek's error
	}{
		{"policy", fmt.Errorf("%w: timed out", resilient.ErrNoGrant), nil},
		{"error", errDown, errDown},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			clock := storetest.NewClock(storetest.T0)
			m := newMemory(t, clock)
			f := &failingReturn{Granter: m, err: c.err}
			s := newLease(t, f, clock, 300*time.Millisecond, 10)
			l := sluice.PerSecond(10).WithAlgorithm(sluice.FixedWindow)
			take(t, s, "k", l, 1) // a lease of 10, 9 left
			clock.Advance(400 * time.Millisecond)
			for i := range 2 {
				d, err := s.Peek(ctx, "k", l, 1)
				wantErr := i == 0 && c.want != nil // the second has nothing to give back
				if (err != nil) != wantErr || wantErr && !errors.Is(err, c.want) {
					t.Fatalf("Peek %d = %+v, %v; want error %v", i, d, err, wantErr)
				}
				if err == nil && (d.Allowed || d.Remaining != 0) {
					t.Fatalf("Peek %d = %+v; want the store's: none left (the 9 unused out of it)", i, d)
				}
			}
			if got := f.returns.Load(); got != 1 {
				t.Errorf("%d returns sent, want 1", got)
			}
			if st := s.Stats(); st.Returned != 0 {
				t.Errorf("stats %+v; want nothing returned", st)
			}
		})
	}
}

// A windowed lease's last units, too few for a request, are spent with the
// store's Take of the rest, as the buckets' are: given back whole, they
// went back into nothing once another process had reset the key (a new
// epoch), so a Peek that counted them said allowed and the Take at the
// same instant was denied.
func TestPeekAsTakeAfterResetElsewhere(t *testing.T) {
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := storetest.NewClock(storetest.T0)
			mem := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
			defer mem.Close()
			l := sluice.Limit{Algorithm: alg, Rate: 4, Period: time.Second}
			a, _ := lease.New(mem, &lease.Options{MaxStaleness: 900 * time.Millisecond, Size: 2, Clock: clock.Now})
			b, _ := lease.New(mem, &lease.Options{MaxStaleness: 900 * time.Millisecond, Clock: clock.Now})

			if d, _ := a.Take(ctx, "k", l, 1); !d.Allowed { // A leases 2, spends 1: 1 left in A's lease
				t.Fatal(d)
			}
			if err := b.Reset(ctx, "k", l); err != nil { // another process resets the key
				t.Fatal(err)
			}
			if d, _ := b.Take(ctx, "k", l, 1); !d.Allowed { // and takes 1: the store has 3
				t.Fatal(d)
			}
			p, _ := a.Peek(ctx, "k", l, 4)
			d, _ := a.Take(ctx, "k", l, 4)
			t.Logf("A.Peek(4) = allowed %v remaining %d; A.Take(4) = allowed %v remaining %d source %v", p.Allowed, p.Remaining, d.Allowed, d.Remaining, d.Source)
			if p.Allowed != d.Allowed {
				t.Errorf("Peek(4) allowed=%v, Take(4) at the same instant allowed=%v", p.Allowed, d.Allowed)
			}
		})
	}
}

// A denied request that a lease's last units would have gone with: Peek
// and Take give the same wait (for the fixed window the window's end, not
// one Interval more per unit, which only the buckets need).
func TestPeekAsTakeStrandedDenialWait(t *testing.T) {
	t.Parallel()
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowCounter, sluice.GCRA} {
		t.Run(alg.String(), func(t *testing.T) {
			clock := storetest.NewClock(storetest.T0)
			mem := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
			defer mem.Close()
			l := sluice.Limit{Algorithm: alg, Rate: 4, Period: time.Second}
			a, err := lease.New(mem, &lease.Options{MaxStaleness: 900 * time.Millisecond, Size: 2, Clock: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			if d, _ := a.Take(ctx, "k", l, 1); !d.Allowed || d.Source != sluice.SourceLease && d.Source != sluice.SourceBackend {
				t.Fatal(d)
			}
			if d, _ := mem.Take(ctx, "k", l, 2); !d.Allowed { // another process takes the rest
				t.Fatal(d)
			}
			p, _ := a.Peek(ctx, "k", l, 2)
			d, _ := a.Take(ctx, "k", l, 2)
			if p.Allowed || d.Allowed || p.RetryAfter != d.RetryAfter {
				t.Errorf("Peek(2) = %+v, Take(2) = %+v; want both denied with one wait", p, d)
			}
		})
	}
}
