package lease_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/storetest"
)

// The simulated under-admission tests replay the arrivals of
// TestFleetLeaseUnderAdmission (underLimit, seeded Poisson, 80 % of them
// from process 0 of fleetProcs, costs weightedCost when weighted) on a
// memory store with one fake clock, through fleetProcs lease Stores (D =
// underD) and on the store exactly, each request decided at its arrival:
// deterministic, with no pause of the machine or round trip in them, what
// is left is the leases' own under-admission.

// arrival is a simulated request: at ns after the start, from proc.
type arrival struct {
	at   time.Duration
	proc int
	cost int64
}

// simArrivals draws underRun of arrivals offering load × underLimit's rate
// in units.
func simArrivals(seed uint64, load float64, weighted bool) []arrival {
	var out []arrival
	for p := range fleetProcs {
		rate := load * float64(underLimit.Rate) / underLimit.Period.Seconds()
		if weighted {
			rate /= 4.5
		}
		if p == 0 {
			rate *= 0.8
		} else {
			rate *= 0.2 / (fleetProcs - 1)
		}
		r := rand.New(rand.NewPCG(seed, uint64(p)))
		i := int64(0)
		for at := r.ExpFloat64() / rate; at < underRun.Seconds(); at += r.ExpFloat64() / rate {
			a := arrival{at: time.Duration(at * float64(time.Second)), proc: p, cost: 1}
			if weighted {
				a.cost = weightedCost(i)
			}
			out = append(out, a)
			i++
		}
	}
	slices.SortStableFunc(out, func(a, b arrival) int { return int(a.at - b.at) })
	return out
}

// simUnder replays arrivals and returns the units admitted by the leases
// and by the store exactly. layered: each leased request is a TakeAll with
// a check of one unit on a second key, exact and never denying.
func simUnder(t *testing.T, arrivals []arrival, layered bool) (leased, exact int64) {
	t.Helper()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	procs := make([]*lease.Store, fleetProcs)
	for p := range procs {
		s, err := lease.New(m, &lease.Options{Clock: clock.Now, FleetSize: func() int { return fleetProcs },
			For: func(key string, _ sluice.Limit) time.Duration {
				if key == "other" {
					return 0
				}
				return underD
			}})
		if err != nil {
			t.Fatal(err)
		}
		procs[p] = s
	}
	other := sluice.PerSecond(1_000_000)
	for _, a := range arrivals {
		clock.Set(storetest.T0.Add(a.at))
		if d, err := m.Take(ctx, "exact", underLimit, a.cost); err != nil {
			t.Fatal(err)
		} else if d.Allowed {
			exact += a.cost
		}
		if layered {
			ds, err := procs[a.proc].TakeAll(ctx, []sluice.Request{{Key: "leased", Limit: underLimit, Cost: a.cost}, {Key: "other", Limit: other, Cost: 1}})
			if err != nil {
				t.Fatal(err)
			}
			if ds[0].Allowed && ds[1].Allowed {
				leased += a.cost
			}
			continue
		}
		if take(t, procs[a.proc], "leased", underLimit, a.cost).Allowed {
			leased += a.cost
		}
	}
	return leased, exact
}

// Layered checks (TakeAll) admit what Take does on the same arrivals: a
// lease whose units are too few for a check spends them with the store's
// Take of the rest in both. With weighted requests at 1.5× they admitted
// 12.6–13.6 % fewer units than the exact store where Take admitted
// 0.7–2.8 % fewer: the lease was returned for a new grant, young, and at
// 400/s the return rule kept nearly all its units.
func TestSimUnderAdmissionLayered(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 3; seed++ {
		arrivals := simArrivals(seed, 1.5, true)
		took, exact := simUnder(t, arrivals, false)
		layered, _ := simUnder(t, arrivals, true)
		t.Logf("seed %d: exact %d units, Take %d (%.2f%% fewer), TakeAll %d (%.2f%% fewer)", seed, exact, took, short(took, exact), layered, short(layered, exact))
		if d := short(layered, exact) - short(took, exact); d > 0.5 {
			t.Errorf("seed %d: TakeAll admitted %.2f points fewer than Take; want at most 0.5", seed, d)
		}
	}
}

// short is how many percent fewer units got than exact.
func short(got, exact int64) float64 { return 100 * float64(exact-got) / float64(exact) }

// At an offered load equal to the limit (1.0×), where the exact limiter
// admits almost every unit, a lease that ends holding units strands a
// larger share of what is admitted. The README states what `sluice serve`
// admitted there (up to 6.0 % fewer units, weighted); the simulated fleet,
// without round trips or a busy machine, is held to that figure on every
// seed, and to 3 % at 1.5×. Measured over these 20 seeds: 0–3.9 % fewer
// (mean 1.0 %) at 1.0× weighted, 0–4.5 % (1.6 %) before leases were sized
// to three quarters of their demand when the store runs short (sizeFor);
// 0.3–2.3 % (1.2 %) at 1.5×, 0.5–2.9 % (1.5 %) before; with requests of
// one unit none at 1.0×, up to 1.2 % at 1.5×.
func TestSimUnderAdmission(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		load     float64
		weighted bool
		most     float64 // percent
	}{
		{1.0, true, 6.0},
		{1.0, false, 0.6},
		{1.5, true, 3},
		{1.5, false, 3},
	} {
		worst, sum := 0.0, 0.0
		for seed := uint64(1); seed <= 20; seed++ {
			leased, exact := simUnder(t, simArrivals(seed, c.load, c.weighted), false)
			s := short(leased, exact)
			worst, sum = max(worst, s), sum+s
			if s > c.most {
				t.Errorf("%.1f× weighted=%v seed %d: leases admitted %d units, the exact store %d: %.2f%% fewer, want at most %.1f%%", c.load, c.weighted, seed, leased, exact, s, c.most)
			}
		}
		t.Logf("%.1f× weighted=%v: at most %.2f%% fewer, %.2f%% on average", c.load, c.weighted, worst, sum/20)
	}
}
