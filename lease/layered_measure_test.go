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
}

func newTally(s *redisstore.Store) *tally {
	return &tally{Store: s, granted: map[string]int64{}, returned: map[string]int64{}, taken: map[string]int64{}, grants: map[string]int64{}, zero: map[string]int64{}, given: map[string]int64{}}
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
	g, err := c.Store.Grant(ctx, key, l, n)
	c.note(key, g.Granted, 0, 0, 0, true)
	return g, err
}

func (c *tally) Return(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused int64) (int64, error) {
	n, err := c.Store.Return(ctx, key, l, g, unused)
	c.note(key, 0, n, unused, 0, false)
	return n, err
}

func (c *tally) Regrant(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	back, next, err := c.Store.Regrant(ctx, key, l, g, unused, n)
	c.note(key, next.Granted, back, unused, 0, true)
	return back, next, err
}

func (c *tally) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	d, err := c.Store.Take(ctx, key, l, cost)
	if d.Allowed {
		c.note(key, 0, 0, 0, cost, false)
	}
	return d, err
}

func (c *tally) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
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
	stores := make([]*lease.Store, procs)
	counted := newTally(redisstore.New(client, &redisstore.Options{Prefix: prefix}))
	for p := range stores {
		s, err := lease.New(counted, &lease.Options{MaxStaleness: 50 * time.Millisecond, FleetSize: func() int { return procs }})
		if err != nil {
			t.Fatal(err)
		}
		stores[p] = s
	}
	exact := redisstore.New(client, &redisstore.Options{Prefix: prefix + "exact:"})
	var leasedUnits, exactUnits, leasedReqs, exactReqs atomic.Int64
	var deniedG, deniedF, deniedBoth [8]atomic.Int64
	var leasedPerSec, exactPerSec [6]atomic.Int64 // units admitted in each second of the run
	if ms, err := strconv.Atoi(os.Getenv("SLUICE_LAYERED_PHASE")); err == nil {
		into := time.Duration(ms) * time.Millisecond % time.Second
		now := time.Now()
		wait := (into - time.Duration(now.UnixNano())%time.Second + time.Second) % time.Second
		time.Sleep(wait)
	}
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
