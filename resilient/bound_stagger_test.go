package resilient

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

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
