package resilient

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// sim is a fleet of n Stores on one injected clock: one shared memory
// store plays Redis, each process has its own fallback. The breaker never
// opens (every call during an outage tries the backend, fails and falls
// back), so that a switch happens exactly when the test says; the bound
// holds for any interleaving of backend and fallback answers.
type sim struct {
	t        *testing.T
	clk      *storetest.Clock
	backends []*flaky
	stores   []*Store
	redis    int   // admitted by the backend
	local    int   // admitted by fallbacks
	steps    []int // admitted at each step of run
}

func newSim(t *testing.T, n int, fleet *Fleet) *sim {
	clk := storetest.NewClock(t0)
	redis := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { redis.Close() })
	s := &sim{t: t, clk: clk}
	for range n {
		b := &flaky{Store: redis, stall: make(chan struct{})}
		fb := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
		t.Cleanup(func() { fb.Close() })
		o := &Options{
			Clock: clk.Now, Timeout: slow, Fallback: fb, DenyCacheSize: -1, Logger: discard,
			MinCalls: 1 << 30, DeadAfter: 1000 * time.Hour, Fleet: fleet,
		}
		if fleet == nil {
			o.Nodes = n
		}
		st := newStore(t, b, o)
		s.backends = append(s.backends, b)
		s.stores = append(s.stores, st)
	}
	return s
}

// up switches the backend on or off for every process.
func (s *sim) up(on bool) {
	mode := int32(1)
	if on {
		mode = 0
	}
	for _, b := range s.backends {
		b.mode.Store(mode)
	}
}

// greedy has every process take cost 1 from key until denied: the most the
// fleet admits at this instant.
func (s *sim) greedy(key string, lim sluice.Limit) {
	s.t.Helper()
	for _, st := range s.stores {
		for range 1_000_000 {
			d, err := st.Take(context.Background(), key, lim, 1)
			if err != nil {
				s.t.Fatal(err)
			}
			if !d.Allowed {
				break
			}
			if d.Source == sluice.SourceFallback {
				s.local++
			} else {
				s.redis++
			}
		}
	}
}

// run walks the clock from 0 to end in steps. At each step the fleet takes
// greedily with the backend as phases says: "down", "up", or both in turn
// at a switch ("up down": drained, then switched off, at one instant).
func (s *sim) run(key string, lim sluice.Limit, end, step time.Duration, phases func(time.Duration) string) {
	for at := time.Duration(0); at <= end; at += step {
		s.clk.Set(t0.Add(at))
		before := s.redis + s.local
		for _, p := range strings.Fields(phases(at)) {
			s.up(p == "up")
			s.greedy(key, lim)
		}
		s.steps = append(s.steps, s.redis+s.local-before)
	}
}

// episode is the schedule of one outage from 0 to d: the backend drained
// just before it, the fallback drained at both ends, the backend just after
// (flaps with no second outage).
func episode(d time.Duration) func(time.Duration) string { return flaps(d, math.MaxInt64) }

// The bucket algorithms over an interval of length T holding one fallback
// episode of length D: the fleet admits at most
//
//	(B + r·T) + B + min(B, r·D)
//
// (an exact limiter's B + r·T, plus the fallback's burst, plus what the
// backend's bucket refilled while unused), so the excess is at most 2·B
// whatever D. The schedule reaches it: the backend drained at 0, the
// fallback taken at the same instant and every time it admits, the backend
// back at D and drained again at that instant.
func TestFallbackBoundEpisode(t *testing.T) {
	t.Parallel()
	const (
		n = 4
		B = 40
		r = 1 // unit per second
	)
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		for _, D := range []int{8, 60, 600} {
			t.Run(fmt.Sprintf("%v/outage %ds", alg, D), func(t *testing.T) {
				t.Parallel()
				lim := sluice.Limit{Algorithm: alg, Rate: 60 * r, Period: time.Minute, Burst: B}
				s := newSim(t, n, nil)
				s.run("k", lim, time.Duration(D)*time.Second, time.Second, episode(time.Duration(D)*time.Second))
				exact := B + r*D
				want := exact + B + min(B, r*D)
				if got := s.redis + s.local; got != want {
					t.Errorf("admitted %d (backend %d, fallback %d), want the bound %d reached exactly (exact limiter %d)",
						got, s.redis, s.local, want, exact)
				}
				if excess := s.redis + s.local - exact; excess > 2*B {
					t.Errorf("excess %d over 2·burst %d", excess, 2*B)
				}
			})
		}
	}
}

// flaps is a schedule of outages of length down every period, from 0: at
// each switch the side losing the traffic is drained first.
func flaps(down, period time.Duration) func(time.Duration) string {
	return func(at time.Duration) string {
		switch in := at % period; {
		case in == 0:
			return "up down"
		case in < down:
			return "down"
		case in == down:
			return "down up"
		}
		return "up"
	}
}

// Flapping: with the fallback's state kept across breaker cycles, each
// side admits at most what an exact limiter would over any interval, so
// the fleet admits at most twice that however often the backend flaps.
// (A fresh fallback per flap would add a burst per flap: 40 every 4s here.)
func TestFallbackBoundFlaps(t *testing.T) {
	t.Parallel()
	const (
		n = 4
		B = 40
		r = 1 // unit per second
		T = 600
	)
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		for _, sched := range []struct{ down, period int }{{2, 4}, {1, 2}, {30, 60}, {50, 60}} {
			t.Run(fmt.Sprintf("%v/down %ds every %ds", alg, sched.down, sched.period), func(t *testing.T) {
				t.Parallel()
				lim := sluice.Limit{Algorithm: alg, Rate: 60 * r, Period: time.Minute, Burst: B}
				s := newSim(t, n, nil)
				s.run("k", lim, T*time.Second, time.Second, flaps(time.Duration(sched.down)*time.Second, time.Duration(sched.period)*time.Second))
				// Every interval [i, j] of whole seconds: at most 2·(B + r·(j-i)).
				worst := 0.0
				for i := range s.steps {
					sum := 0
					for j := i; j < len(s.steps); j++ {
						sum += s.steps[j]
						exact := B + r*(j-i)
						if sum > 2*exact {
							t.Fatalf("[%ds, %ds]: admitted %d, over twice the exact %d", i, j, sum, exact)
						}
						worst = max(worst, float64(sum)/float64(exact))
					}
				}
				t.Logf("admitted %d (backend %d, fallback %d) in %ds; worst interval %.3f× the exact limit", s.redis+s.local, s.redis, s.local, T, worst)
			})
		}
	}
}

// The window algorithms: a window holding a switch admits at most one
// extra limit (the backend's L and the fleet's fallback shares, L between
// them), and no more however often the backend flaps within it.
func TestFallbackBoundWindows(t *testing.T) {
	t.Parallel()
	const (
		n = 4
		L = 40 // per minute
	)
	for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowLog, sluice.SlidingWindowCounter} {
		for _, sched := range []struct {
			name   string
			phases func(time.Duration) string
		}{
			{"one episode", episode(30 * time.Second)},
			{"flaps every 4s", flaps(2*time.Second, 4*time.Second)},
			{"flaps every 7s", flaps(3*time.Second, 7*time.Second)},
		} {
			t.Run(fmt.Sprintf("%v/%s", alg, sched.name), func(t *testing.T) {
				t.Parallel()
				lim := sluice.Limit{Algorithm: alg, Rate: L, Period: time.Minute}
				s := newSim(t, n, nil)
				s.run("k", lim, 10*time.Minute, time.Second, sched.phases)
				if got, want := sum(s.steps[:60]), 2*L; got != want {
					t.Errorf("first window admitted %d, want %d: the bound reached exactly", got, want)
				}
				// Every window of 60 whole seconds: sliding for the log;
				// the limit's own windows for the others, which even
				// exact admit 2·L across a window's edge.
				stride := 60
				if alg == sluice.SlidingWindowLog {
					stride = 1
				}
				for i := 0; i+60 <= len(s.steps); i += stride {
					if got := sum(s.steps[i : i+60]); got > 2*L {
						t.Errorf("[%ds, %ds): admitted %d, over 2×%d", i, i+60, got, L)
					}
				}
			})
		}
	}
}

func sum(xs []int) int {
	total := 0
	for _, x := range xs {
		total += x
	}
	return total
}

// The fallback's state is kept in units of the whole limit, so a change of
// fleet size changes each process's share of what is left, never refills
// it (dividing the limit instead read the key's state under another limit).
func TestFallbackKeepsStateAcrossFleetChanges(t *testing.T) {
	t.Parallel()
	const B = 40
	for _, alg := range sluice.Algorithms() {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			reg := &script{answers: []int{2}}
			// The fleet's own clock: the stores' stands still, so that
			// nothing refills.
			fclk := storetest.NewClock(t0)
			f, err := NewFleet(reg, &FleetOptions{Refresh: time.Hour, TTL: 2 * time.Hour, Shrink: time.Second, Clock: fclk.Now, Logger: discard})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { f.Close() })
			s := newSim(t, 2, f)
			s.up(false)
			lim := sluice.Limit{Algorithm: alg, Rate: B, Period: time.Minute}
			admitted := func() int {
				before := s.local
				s.greedy("k", lim)
				return s.local - before
			}
			if got, want := admitted(), B; got != want {
				t.Errorf("two processes with a size of 2 admitted %d, want %d", got, want)
			}
			for _, n := range []int{4, 1, 1} {
				reg.answers = append(reg.answers, n)
				f.beat(fclk.Now())
				if got := admitted(); got != 0 {
					t.Errorf("after the size became %d: admitted %d more at once, want 0", f.Size(), got)
				}
				fclk.Advance(time.Second) // the last count shrinks the size to 1
			}
			if got, want := f.Size(), 1; got != want {
				t.Fatalf("size %d, want %d", got, want)
			}
		})
	}
}

// drain has process i take cost 1 from key until denied, through its
// backend (up) or its fallback.
func (s *sim) drain(i int, up bool, key string, lim sluice.Limit) {
	s.t.Helper()
	mode := int32(1)
	if up {
		mode = 0
	}
	s.backends[i].mode.Store(mode)
	for range 1_000_000 {
		d, err := s.stores[i].Take(context.Background(), key, lim, 1)
		if err != nil {
			s.t.Fatal(err)
		}
		if !d.Allowed {
			return
		}
		if d.Source == sluice.SourceFallback {
			s.local++
		} else {
			s.redis++
		}
	}
}

// runStaggered is one outage from 0 that every process is in until d,
// process i back on the backend at d + i·lag: the stagger of breakers that
// close one after another once Redis answers again. Each process drains
// the side it leaves at its switch, then the one it joins.
func (s *sim) runStaggered(key string, lim sluice.Limit, end, d, lag time.Duration) {
	for at := time.Duration(0); at <= end; at += time.Second {
		s.clk.Set(t0.Add(at))
		for i := range s.stores {
			back := d + time.Duration(i)*lag
			switch {
			case at == 0:
				s.drain(i, true, key, lim)
				s.drain(i, false, key, lim)
			case at < back:
				s.drain(i, false, key, lim)
			case at == back:
				s.drain(i, false, key, lim)
				s.drain(i, true, key, lim)
			default:
				s.drain(i, true, key, lim)
			}
		}
	}
}

// While breakers close one after another, the processes back on Redis
// take its full rate and those still on their fallbacks their shares of
// it: the one-episode bound grows by r times the mean time a process
// stays on its fallback after the first is back,
//
//	(B + r·T) + B + min(B, r·D) + r·(ΣS_i)/n  ≤  … + r·S
//
// (D the time every process is on its fallback, S_i process i's lag
// behind the first, S the longest). The schedule reaches it: everything
// drained at 0 and at every step, each process switching back in turn.
func TestFallbackBoundStaggered(t *testing.T) {
	t.Parallel()
	const (
		n = 4
		B = 40
		r = 4 // units per second: a fallback's share is 1 a second
	)
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		for _, c := range []struct{ D, lag int }{{8, 1}, {8, 3}, {60, 2}} {
			t.Run(fmt.Sprintf("%v/outage %ds, lag %ds", alg, c.D, c.lag), func(t *testing.T) {
				t.Parallel()
				lim := sluice.Limit{Algorithm: alg, Rate: 60 * r, Period: time.Minute, Burst: B}
				s := newSim(t, n, nil)
				T := c.D + (n-1)*c.lag + 5
				s.runStaggered("k", lim, time.Duration(T)*time.Second, time.Duration(c.D)*time.Second, time.Duration(c.lag)*time.Second)
				exact := B + r*T
				lags := 0
				for i := range n {
					lags += i * c.lag
				}
				want := exact + B + min(B, r*c.D) + r*lags/n
				if got := s.redis + s.local; got != want {
					t.Errorf("admitted %d (backend %d, fallback %d), want the bound %d reached exactly (exact limiter %d)",
						got, s.redis, s.local, want, exact)
				}
				if S := (n - 1) * c.lag; s.redis+s.local-exact > 2*B+r*S {
					t.Errorf("excess %d over 2·B + r·S = %d", s.redis+s.local-exact, 2*B+r*S)
				}
			})
		}
	}
}
