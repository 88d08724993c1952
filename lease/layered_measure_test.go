//go:build measure

// Measurements, not checks: built with -tags measure (see each one).

package lease_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
)

// tally counts, per key, what a Redis store granted, took back (of what
// was given back) and took.
type tally struct {
	*redisstore.Store
	mu                                            sync.Mutex
	granted, returned, taken, grants, zero, given map[string]int64
	// ages counts returns per key by the age of their grant: under 10 ms,
	// under D (50 ms), older; each the returns, units given and taken back.
	ages  map[string]*[3][3]int64
	delay time.Duration // added to every call, as a slower round trip
}

func (c *tally) wait() {
	if c.delay > 0 {
		time.Sleep(c.delay)
	}
}

func (c *tally) age(key string, g sluice.Grant, unused, back int64) {
	if unused == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.ages[key]
	if a == nil {
		a = new([3][3]int64)
		c.ages[key] = a
	}
	i := 0
	switch age := time.Duration(time.Now().UnixMicro()-g.At) * time.Microsecond; {
	case age >= 50*time.Millisecond:
		i = 2
	case age >= 10*time.Millisecond:
		i = 1
	}
	a[i][0]++
	a[i][1] += unused
	a[i][2] += back
}

func newTally(s *redisstore.Store) *tally {
	return &tally{Store: s, granted: map[string]int64{}, returned: map[string]int64{}, taken: map[string]int64{}, grants: map[string]int64{}, zero: map[string]int64{}, given: map[string]int64{}, ages: map[string]*[3][3]int64{}}
}

func (c *tally) note(key string, granted, returned, given, taken int64, grant bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.granted[key] += granted
	c.returned[key] += returned
	c.given[key] += given
	c.taken[key] += taken
	if grant {
		c.grants[key]++
		if granted == 0 {
			c.zero[key]++
		}
	}
}

func (c *tally) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	c.wait()
	g, err := c.Store.Grant(ctx, key, l, n)
	c.note(key, g.Granted, 0, 0, 0, true)
	return g, err
}

func (c *tally) Return(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused int64) (int64, error) {
	c.wait()
	n, err := c.Store.Return(ctx, key, l, g, unused)
	c.note(key, 0, n, unused, 0, false)
	c.age(key, g, unused, n)
	return n, err
}

func (c *tally) Regrant(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	c.wait()
	back, next, err := c.Store.Regrant(ctx, key, l, g, unused, n)
	c.note(key, next.Granted, back, unused, 0, true)
	c.age(key, g, unused, back)
	return back, next, err
}

func (c *tally) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	c.wait()
	d, err := c.Store.Take(ctx, key, l, cost)
	if d.Allowed {
		c.note(key, 0, 0, 0, cost, false)
	}
	return d, err
}

func (c *tally) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	c.wait()
	ds, err := c.Store.TakeAll(ctx, reqs)
	all := err == nil
	for _, d := range ds {
		all = all && d.Allowed
	}
	if all {
		for _, r := range reqs {
			c.note(r.Key, 0, 0, 0, r.Cost, false)
		}
	}
	return ds, err
}

// fleetOver returns procs lease Stores over g, as a fleet's processes
// (FleetSize procs), leasing for 50 ms.
func fleetOver(t *testing.T, g sluice.Granter, procs int) []*lease.Store {
	stores := make([]*lease.Store, procs)
	for p := range stores {
		s, err := lease.New(g, &lease.Options{MaxStaleness: 50 * time.Millisecond, FleetSize: func() int { return procs }})
		if err != nil {
			t.Fatal(err)
		}
		stores[p] = s
	}
	return stores
}

// awaitPhase waits until SLUICE_LAYERED_PHASE ms into a fixed window, on
// this host's clock, where that is set.
func awaitPhase() {
	if ms, err := strconv.Atoi(os.Getenv("SLUICE_LAYERED_PHASE")); err == nil {
		into := time.Duration(ms) * time.Millisecond % time.Second
		time.Sleep((into - time.Duration(time.Now().UnixNano())%time.Second + time.Second) % time.Second)
	}
}

// TestLayeredClosedLoop measures layered checks under closed-loop
// overload: 3 lease Stores over one Redis (SLUICE_REDIS_ADDR), each with
// SLUICE_LAYERED_CLIENTS goroutines sending TakeAlls of a GCRA 200/s and
// a fixed window 300/s check, both leased at 50 ms, costs 1-8, for 5 s,
// beside as many on the store exactly. It logs the units each admitted,
// what denied, and per key what the store granted, took back and took.
// SLUICE_LAYERED_ONLY=g or f sends that check alone. SLUICE_LAYERED_PHASE=ms
// starts the run that far into a fixed window (on this host's clock, which a
// local Redis's TIME reads): 0 starts with a window, where the fixed window
// is spent about halfway through the first second and then denies.
//
//	SLUICE_REDIS_ADDR=127.0.0.1:6379 SLUICE_LAYERED_CLIENTS=2 go test -tags measure -run TestLayeredClosedLoop -v ./lease/
func TestLayeredClosedLoop(t *testing.T) {
	clients, _ := strconv.Atoi(os.Getenv("SLUICE_LAYERED_CLIENTS"))
	if clients <= 0 {
		t.Skip("SLUICE_LAYERED_CLIENTS not set")
	}
	addr := os.Getenv("SLUICE_REDIS_ADDR")
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 200})
	defer client.Close()
	prefix := "layered:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	const procs = 3
	gcra := sluice.PerSecond(200)
	fw := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 300, Period: time.Second}
	run := 5 * time.Second
	counted := newTally(redisstore.New(client, &redisstore.Options{Prefix: prefix}))
	stores := fleetOver(t, counted, procs)
	exact := redisstore.New(client, &redisstore.Options{Prefix: prefix + "exact:"})
	var leasedUnits, exactUnits, leasedReqs, exactReqs atomic.Int64
	var deniedG, deniedF, deniedBoth [8]atomic.Int64
	var leasedPerSec, exactPerSec [6]atomic.Int64 // units admitted in each second of the run
	awaitPhase()
	start := time.Now()
	var wg sync.WaitGroup
	for p := range procs {
		for c := range clients {
			for _, leased := range []bool{true, false} {
				wg.Go(func() {
					r := rand.New(rand.NewPCG(uint64(p), uint64(c)<<1|map[bool]uint64{true: 1}[leased]))
					var st sluice.MultiStore = exact
					if leased {
						st = stores[p]
					}
					for time.Since(start) < run {
						cost := 1 + r.Int64N(8)
						reqs := []sluice.Request{{Key: "g", Limit: gcra, Cost: cost}, {Key: "f", Limit: fw, Cost: cost}}
						switch os.Getenv("SLUICE_LAYERED_ONLY") {
						case "g":
							reqs = reqs[:1]
						case "f":
							reqs = reqs[1:]
						}
						ds, err := st.TakeAll(ctx, reqs)
						if err != nil {
							t.Error(err)
							return
						}
						if !leased {
							exactReqs.Add(1)
							if ds[0].Allowed && ds[len(ds)-1].Allowed {
								exactUnits.Add(cost)
								exactPerSec[min(int(time.Since(start)/time.Second), 5)].Add(cost)
							}
							continue
						}
						leasedReqs.Add(1)
						if len(ds) == 1 {
							ds = append(ds, ds[0])
						}
						switch {
						case ds[0].Allowed && ds[1].Allowed:
							leasedUnits.Add(cost)
							leasedPerSec[min(int(time.Since(start)/time.Second), 5)].Add(cost)
						case !ds[0].Allowed && !ds[1].Allowed:
							deniedBoth[ds[0].Source].Add(1)
						case !ds[0].Allowed:
							deniedG[ds[0].Source].Add(1)
						default:
							deniedF[ds[1].Source].Add(1)
						}
					}
				})
			}
		}
	}
	wg.Wait()
	l, e := leasedUnits.Load(), exactUnits.Load()
	t.Logf("started %v into a fixed window", time.Duration(start.UnixNano())%time.Second)
	t.Logf("%d clients per store: leased %d units in %d requests, exact %d in %d: %.1f%% fewer", clients, l, leasedReqs.Load(), e, exactReqs.Load(), 100*float64(e-l)/float64(e))
	for i := range 5 {
		t.Logf("  second %d: leased %d units, exact %d", i, leasedPerSec[i].Load(), exactPerSec[i].Load())
	}
	for src := range 8 {
		if n := deniedG[src].Load() + deniedF[src].Load() + deniedBoth[src].Load(); n > 0 {
			t.Logf("  source %v: denied by GCRA only %d, by FW only %d, both %d", sluice.Source(src), deniedG[src].Load(), deniedF[src].Load(), deniedBoth[src].Load())
		}
	}
	for p, s := range stores {
		t.Logf("  store %d: %+v", p, s.Stats())
	}
	for _, st := range stores {
		st.Close(ctx)
	}
	for _, k := range []string{"g", "f"} {
		t.Logf("  key %s: %d grants (%d of nothing) granted %d, %d returned of %d given back, %d taken exactly: %d used of the store's, %d admitted",
			k, counted.grants[k], counted.zero[k], counted.granted[k], counted.returned[k], counted.given[k], counted.taken[k], counted.granted[k]-counted.returned[k]+counted.taken[k], l)
	}
}

// TestLayeredMixedClosedLoop measures a GCRA key that layered checks and
// single ones share: 4 lease Stores over one Redis (SLUICE_REDIS_ADDR),
// each with SLUICE_LAYERED_MIXED paced goroutines (one request per 4 ms
// at most) sending TakeAlls of a GCRA 1000/s burst 100 and a fixed window
// 300/s check, both leased at 50 ms, and as many sending Takes of the
// GCRA check alone, costs 1 to SLUICE_LAYERED_COST (1), for 5 s, beside
// as many on the store exactly. It logs the GCRA units each admitted per
// second and per key what the store granted, took back and took.
// SLUICE_LAYERED_PHASE as for TestLayeredClosedLoop.
//
//	SLUICE_REDIS_ADDR=127.0.0.1:6379 SLUICE_LAYERED_MIXED=8 go test -tags measure -run TestLayeredMixedClosedLoop -v ./lease/
func TestLayeredMixedClosedLoop(t *testing.T) {
	clients, _ := strconv.Atoi(os.Getenv("SLUICE_LAYERED_MIXED"))
	if clients <= 0 {
		t.Skip("SLUICE_LAYERED_MIXED not set")
	}
	maxCost, _ := strconv.ParseInt(os.Getenv("SLUICE_LAYERED_COST"), 10, 64)
	maxCost = max(maxCost, 1)
	addr := os.Getenv("SLUICE_REDIS_ADDR")
	client := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 200})
	defer client.Close()
	prefix := "mixed:" + strconv.FormatInt(time.Now().UnixNano(), 36) + ":"
	const procs, pace = 4, 4 * time.Millisecond
	gcra := sluice.PerSecond(1000).WithBurst(100)
	fw := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 300, Period: time.Second}
	run := 5 * time.Second
	counted := newTally(redisstore.New(client, &redisstore.Options{Prefix: prefix}))
	counted.delay, _ = time.ParseDuration(os.Getenv("SLUICE_LAYERED_DELAY"))
	stores := fleetOver(t, counted, procs)
	exact := newTally(redisstore.New(client, &redisstore.Options{Prefix: prefix + "exact:"}))
	exact.delay = counted.delay
	// [leased][layered][second]: GCRA units admitted
	var perSec [2][2][6]atomic.Int64
	var denied [2][2][8]atomic.Int64 // [leased][layered][source]: requests denied
	awaitPhase()
	start := time.Now()
	var wg sync.WaitGroup
	for p := range procs {
		for c := range clients {
			for _, leased := range []int{0, 1} {
				for _, layered := range []int{0, 1} {
					wg.Go(func() {
						r := rand.New(rand.NewPCG(uint64(p), uint64(c)<<2|uint64(leased)<<1|uint64(layered)))
						var st sluice.MultiStore = exact
						if leased == 1 {
							st = stores[p]
						}
						next := time.Now()
						for time.Since(start) < run {
							cost := 1 + r.Int64N(maxCost)
							var ok bool
							var src sluice.Source
							if layered == 1 {
								ds, err := st.TakeAll(ctx, []sluice.Request{{Key: "g", Limit: gcra, Cost: cost}, {Key: "f", Limit: fw, Cost: cost}})
								if err != nil {
									t.Error(err)
									return
								}
								ok = ds[0].Allowed && ds[1].Allowed
								src = ds[0].Source
								if ds[0].Allowed {
									src = ds[1].Source
								}
							} else {
								d, err := st.Take(ctx, "g", gcra, cost)
								if err != nil {
									t.Error(err)
									return
								}
								ok, src = d.Allowed, d.Source
							}
							if ok {
								perSec[leased][layered][min(int(time.Since(start)/time.Second), 5)].Add(cost)
							} else {
								denied[leased][layered][src].Add(1)
							}
							next = next.Add(pace)
							if wait := time.Until(next); wait > 0 {
								time.Sleep(wait)
							} else {
								next = time.Now()
							}
						}
					})
				}
			}
		}
	}
	wg.Wait()
	t.Logf("started %v into a fixed window; %d clients of each kind per store, costs 1-%d", time.Duration(start.UnixNano())%time.Second, clients, maxCost)
	var full [2]int64
	for i := range 5 {
		var sum [2]int64
		for leased := range 2 {
			sum[leased] = perSec[leased][0][i].Load() + perSec[leased][1][i].Load()
			if i >= 1 {
				full[leased] += sum[leased]
			}
		}
		t.Logf("  second %d: GCRA units leased %d (layered %d, single %d), exact %d (layered %d, single %d)", i,
			sum[1], perSec[1][1][i].Load(), perSec[1][0][i].Load(), sum[0], perSec[0][1][i].Load(), perSec[0][0][i].Load())
	}
	var all [2]int64
	for leased := range 2 {
		for layered := range 2 {
			for i := range 6 {
				all[leased] += perSec[leased][layered][i].Load()
			}
		}
	}
	t.Logf("seconds 1-4: leased %d, exact %d: %.1f%% fewer; whole run: leased %d, exact %d", full[1], full[0], 100*float64(full[0]-full[1])/float64(full[0]), all[1], all[0])
	for leased := range 2 {
		for layered := range 2 {
			for src := range 8 {
				if n := denied[leased][layered][src].Load(); n > 0 {
					t.Logf("  leased %v layered %v: %d denied by %v", leased == 1, layered == 1, n, sluice.Source(src))
				}
			}
		}
	}
	var sum lease.Stats
	for _, s := range stores {
		sum = addStats(sum, s.Stats())
	}
	t.Logf("  stores: %+v", sum)
	for _, st := range stores {
		st.Close(ctx)
	}
	for _, k := range []string{"g", "f"} {
		t.Logf("  key %s: %d grants (%d of nothing) granted %d, %d returned of %d given back, %d taken exactly: %d used of the store's",
			k, counted.grants[k], counted.zero[k], counted.granted[k], counted.returned[k], counted.given[k], counted.taken[k], counted.granted[k]-counted.returned[k]+counted.taken[k])
		if a := counted.ages[k]; a != nil {
			t.Logf("    returns by age (count, given, taken back): <10ms %v, <50ms %v, older %v", a[0], a[1], a[2])
		}
	}
}
