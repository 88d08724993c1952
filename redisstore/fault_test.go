package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultDeadline: with Redis stopped or paused, no call outlives its
// context's deadline by more than 10 ms at p99 (and 100 ms at most), on
// clients built with go-redis's defaults (no ContextTimeoutEnabled: their
// reads wait out ReadTimeout, 3 s), batched or not, standalone or cluster.
// Calls run from 8 goroutines at staggered times, so that a stall of the
// whole machine costs one sample rather than eight.
//
// What is bounded is the time a call takes past the moment the runtime
// tells a bare waiter on the same context that it ended: on a starved
// machine (another test's processes on the same cores) the runtime itself
// wakes every waiter late, which no code can prevent. Both figures are
// logged.
func TestFaultDeadline(t *testing.T) {
	race.SkipTiming(t)
	const (
		deadline = 50 * time.Millisecond
		workers  = 8
		calls    = 30 // per worker: 240 samples per case
		p99Bound = 10 * time.Millisecond
		maxBound = 100 * time.Millisecond
	)
	type target struct {
		client redis.UniversalClient
		pause  func(*testing.T)
		stop   func()
	}
	targets := map[string]func(t *testing.T) target{
		"standalone": func(t *testing.T) target {
			srv := redistest.StartServer(t)
			c := srv.Client(t)
			return target{c, func(t *testing.T) { srv.Pause(t) }, srv.Stop}
		},
		"cluster": func(t *testing.T) target {
			cl := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 1})
			c := cl.Client(t)
			return target{c, func(t *testing.T) { cl.Nodes[0].Pause(t) }, cl.Nodes[0].Kill}
		},
	}
	for _, server := range []string{"standalone", "cluster"} {
		for _, fault := range []string{"paused", "stopped"} {
			for _, batch := range []int{0, 1} {
				if server == "cluster" && batch == 1 {
					continue // the same path as standalone's; the test stays within 15 s
				}
				t.Run(fmt.Sprintf("%s/%s/maxbatch=%d", server, fault, batch), func(t *testing.T) {
					tg := targets[server](t)
					s := redisstore.New(tg.client, &redisstore.Options{Prefix: redistest.Prefix(t), MaxBatch: batch})
					l := sluice.PerMinute(1000)
					// Warm: scripts cached, connections pooled.
					var wg sync.WaitGroup
					for w := range workers {
						wg.Go(func() {
							if _, err := s.Take(context.Background(), fmt.Sprint(w), l, 1); err != nil {
								t.Error(err)
							}
						})
					}
					wg.Wait()
					if fault == "paused" {
						tg.pause(t)
					} else {
						tg.stop()
					}
					var mu sync.Mutex
					var over, overAbs, bares []time.Duration // past the bare waiter; past the deadline; the bare waiter's
					for w := range workers {
						wg.Go(func() {
							for range calls {
								time.Sleep(time.Duration(rand.IntN(10_000)) * time.Microsecond)
								ctx, cancel := context.WithTimeout(context.Background(), deadline)
								end, _ := ctx.Deadline()
								woken := make(chan time.Duration, 1)
								go func() { <-ctx.Done(); woken <- time.Since(end) }()
								_, err := s.Take(ctx, fmt.Sprint(w), l, 1)
								late := time.Since(end)
								cancel()
								if err == nil {
									t.Errorf("take with Redis %s: no error", fault)
								}
								bare := max(0, <-woken) // negative: the call ended first, and cancel woke it
								mu.Lock()
								over = append(over, late-bare)
								overAbs = append(overAbs, late)
								bares = append(bares, bare)
								mu.Unlock()
							}
						})
					}
					wg.Wait()
					for _, d := range [][]time.Duration{over, overAbs, bares} {
						slices.Sort(d)
					}
					q := func(d []time.Duration, p int) time.Duration { return d[(len(d)-1)*p/100] }
					t.Logf("%d calls past their deadline by p50 %v, p99 %v, max %v; a bare waiter was woken p99 %v, max %v late; calls past it: p99 %v, max %v",
						len(over), q(overAbs, 50), q(overAbs, 99), q(overAbs, 100), q(bares, 99), q(bares, 100), q(over, 99), q(over, 100))
					if p99, worst := q(over, 99), q(over, 100); p99 > p99Bound || worst > maxBound {
						t.Errorf("calls outlived their deadline by p99 %v, max %v more than a bare waiter: want at most %v and %v", p99, worst, p99Bound, maxBound)
					}
				})
			}
		}
	}
}

// failoverLimit never denies during a test, so that every take's count is
// Rate - Remaining and counts tell which server answered.
var failoverLimit = sluice.PerHour(1_000_000_000).WithAlgorithm(sluice.FixedWindow)

// underFailover runs redistest.UnderFailover on s's key.
func underFailover(t *testing.T, s *redisstore.Store, key string, fail func(), promoted func() time.Time) {
	t.Helper()
	l := failoverLimit
	redistest.UnderFailover(t, redistest.Failover{
		Take: func(ctx context.Context) (int64, error) {
			d, err := s.Take(ctx, key, l, 1)
			return l.Rate - d.Remaining, err
		},
		Counted: func() (int64, error) {
			d, err := s.Peek(context.Background(), key, l, 1)
			return l.Rate - d.Remaining, err
		},
		Fail:     fail,
		Promoted: promoted,
	})
}

// TestFaultClusterFailover: on a cluster client the caller built (go-redis
// defaults: its slot map is reloaded only every 60 s), with no failure
// policy, the hot key's master is killed under load; decisions succeed
// again within 3 s of its replica's promotion.
func TestFaultClusterFailover(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	c := cl.Client(t)
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	var told atomic.Int32
	s.OnFailover(func() { told.Add(1) })
	const key = "hot"
	master := cl.MasterOf(t, s.Keys(key, failoverLimit)[0])
	replicas := cl.ReplicasOf(t, master)
	underFailover(t, s, key, master.Kill, func() time.Time {
		_, at := cl.AwaitMaster(t, 10*time.Second, replicas...)
		return at
	})
	if s.ClusterReloads() == 0 {
		t.Error("no slot-map reload after the master died")
	}
	if told.Load() == 0 {
		t.Error("OnFailover's hook not called after the promotion")
	}
}

// TestFaultSentinelFailover: the same on a Sentinel failover client, one
// master, one replica and three Sentinels (quorum 2).
func TestFaultSentinelFailover(t *testing.T) {
	race.SkipTiming(t)
	set := redistest.StartSentinel(t, nil)
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    redistest.SentinelMaster,
		SentinelAddrs: set.SentinelAddrs(),
	})
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	underFailover(t, s, "hot", set.Master.Kill, func() time.Time {
		_, at := set.AwaitMaster(t, 10*time.Second, set.Replicas...)
		return at
	})
}

// TestFaultClusterFrozenShard: with one shard of a 3-master cluster frozen
// (its master and its replica stopped with SIGSTOP, so no failover comes;
// cluster-require-full-coverage no, so the other masters go on serving),
// calls for keys on the other masters keep succeeding within their 50 ms
// deadlines, at least 99% of them, while those of the frozen shard's key
// time out: a batched Store must not queue one master's calls behind
// another's.
func TestFaultClusterFrozenShard(t *testing.T) {
	race.SkipTiming(t)
	const (
		deadline  = 50 * time.Millisecond
		perKey    = 4 // goroutines
		healthy   = 500 * time.Millisecond
		frozenFor = 2500 * time.Millisecond
	)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1,
		Args: []string{"--cluster-require-full-coverage", "no"}})
	s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	l := failoverLimit

	// One key on each master; the first one's shard freezes.
	keys, masters := keyPerMaster(t, cl, s, l)
	for _, key := range keys {
		if _, err := s.Take(context.Background(), key, l, 1); err != nil {
			t.Fatal(err)
		}
	}

	type result struct {
		end time.Time
		ok  bool
	}
	var (
		mu      sync.Mutex
		results = make(map[string][]result)
		stop    = make(chan struct{})
		wg      sync.WaitGroup
	)
	for _, key := range keys {
		for range perKey {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					_, err := s.Take(ctx, key, l, 1)
					cancel()
					mu.Lock()
					results[key] = append(results[key], result{time.Now(), err == nil})
					mu.Unlock()
				}
			})
		}
	}
	time.Sleep(healthy)
	frozen := append([]*redistest.Node{masters[0]}, cl.ReplicasOf(t, masters[0])...)
	from := time.Now()
	for _, n := range frozen {
		n.Pause(t)
	}
	time.Sleep(frozenFor)
	until := time.Now()
	close(stop)
	wg.Wait()
	for _, n := range frozen {
		n.Resume(t)
	}

	for i, key := range keys {
		var ok, failed int
		for _, r := range results[key] {
			if r.end.Before(from) || r.end.After(until) {
				continue
			}
			if r.ok {
				ok++
			} else {
				failed++
			}
		}
		rate := float64(ok) / until.Sub(from).Seconds()
		if i == 0 {
			t.Logf("frozen shard's key %q: %d calls succeeded, %d failed", key, ok, failed)
			continue
		}
		t.Logf("key %q on a live master: %d calls succeeded (%.0f/s), %d failed while the other shard was frozen", key, ok, rate, failed)
		if failed*100 > ok+failed {
			t.Errorf("key %q on a live master: %d of %d calls failed while another shard was frozen, want at most 1%%", key, failed, ok+failed)
		}
		if rate < 100 {
			t.Errorf("key %q on a live master: %.0f calls/s succeeded while another shard was frozen, want at least 100/s", key, rate)
		}
	}
}

// stoppableCluster starts a 3-master cluster whose live masters go on
// serving while one is stopped, none failed over within the test.
func stoppableCluster(t *testing.T) *redistest.Cluster {
	t.Helper()
	return redistest.StartCluster(t, &redistest.ClusterOptions{NodeTimeout: 30 * time.Second,
		Args: []string{"--cluster-require-full-coverage", "no"}})
}

// timedClient is a client bounding each command by its context's deadline
// (ContextTimeoutEnabled), as the fault tests' callers need, closed at
// cleanup.
func timedClient(t testing.TB, o redis.Options) *redis.Client {
	t.Helper()
	o.ContextTimeoutEnabled = true
	c := redis.NewClient(&o)
	t.Cleanup(func() { c.Close() })
	return c
}

// keyPerMaster returns a key served by each of cl's three masters under l,
// and those masters, in the same order.
func keyPerMaster(t *testing.T, cl *redistest.Cluster, s *redisstore.Store, l sluice.Limit) ([]string, []*redistest.Node) {
	t.Helper()
	var keys []string
	var masters []*redistest.Node
	for i := 0; len(keys) < 3; i++ {
		key := fmt.Sprint("k", i)
		m := cl.MasterOf(t, s.Keys(key, l)[0])
		if !slices.Contains(masters, m) {
			keys, masters = append(keys, key), append(masters, m)
		}
	}
	return keys, masters
}

// TestFaultClusterStoppedMasterScriptReload: on a 3-master cluster with one
// master stopped (SIGSTOP), the other masters' takes keep succeeding within
// their 40 ms deadlines while their scripts must be loaded again (their
// caches flushed): a batch that meets NOSCRIPT loads its scripts on its own
// master. Loading them on every node, the stopped one's included, held
// the batch, its callers and its lane's slot for go-redis's read timeout,
// and nearly every take on a live master failed. Three rounds, each with
// another master stopped; a live key's takes may fail at most twice in a
// round (a loaded machine may miss a 40 ms deadline).
func TestFaultClusterStoppedMasterScriptReload(t *testing.T) {
	race.SkipTiming(t)
	const (
		deadline = 40 * time.Millisecond
		workers  = 4
		takes    = 40 // per worker and round
		maxFails = 2  // per live key and round
	)
	ctx := context.Background()
	// A node timeout longer than a round: no node is flagged as failing, so
	// a round's stop never leaves the next one's live masters in a minority
	// (CLUSTERDOWN).
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{NodeTimeout: 5 * time.Second,
		Args: []string{"--cluster-require-full-coverage", "no"}})
	// One batch in flight per master: a batch held up holds up every call
	// of its master, so each round shows it.
	s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t), MaxInFlight: 1})
	l := sluice.PerSecond(100000)
	keys, masters := keyPerMaster(t, cl, s, l)
	// A client's first calls load go-redis's command table from a node
	// at random, which may be the one stopped: not what this test is for.
	for _, key := range keys {
		if _, err := s.Take(ctx, key, l, 1); err != nil {
			t.Fatal(err)
		}
	}
	for round, down := range masters {
		for i, m := range masters {
			if m == down {
				continue
			}
			c := redis.NewClient(&redis.Options{Addr: m.Addr})
			err := c.ScriptFlush(ctx).Err()
			c.Close()
			if err != nil {
				t.Fatalf("SCRIPT FLUSH on the master of %q: %v", keys[i], err)
			}
		}
		down.Pause(t)
		var (
			mu    sync.Mutex
			fails = make(map[string]int)
			errs  = make(map[string]error)
			wg    sync.WaitGroup
		)
		for range workers {
			wg.Go(func() {
				for range takes {
					for _, key := range keys { // the stopped master's key too
						ctx, cancel := context.WithTimeout(ctx, deadline)
						_, err := s.Take(ctx, key, l, 1)
						cancel()
						if err != nil {
							mu.Lock()
							fails[key]++
							errs[key] = err
							mu.Unlock()
						}
					}
				}
			})
		}
		wg.Wait()
		down.Resume(t)
		for i, key := range keys {
			if masters[i] == down {
				t.Logf("round %d: stopped master's key %q: %d of %d takes failed", round, key, fails[key], workers*takes)
				continue
			}
			t.Logf("round %d: live key %q: %d of %d takes failed", round, key, fails[key], workers*takes)
			if fails[key] > maxFails {
				t.Errorf("round %d: live key %q: %d of %d takes failed (last: %v) while another master was stopped, want at most %d",
					round, key, fails[key], workers*takes, errs[key], maxFails)
			}
		}
		// The next round starts with every master answering.
		for _, key := range keys {
			for try := 0; ; try++ {
				ctx, cancel := context.WithTimeout(ctx, time.Second)
				_, err := s.Take(ctx, key, l, 1)
				cancel()
				if err == nil {
					break
				}
				if try == 10 {
					t.Fatalf("round %d: %q still failing after its master resumed: %v", round, key, err)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
	}
}

// TestFaultEveryCallDeadline: every exported call that talks to Redis,
// Check, CheckAccess and Membership's included, returns within its
// context's deadline plus a slack, with an error wrapping
// context.DeadlineExceeded (never a success past the deadline), while
// Redis holds its commands: paused by CLIENT PAUSE ALL or stopped by
// SIGSTOP. Clients have go-redis's defaults (no ContextTimeoutEnabled),
// whose reads would wait out the fault. Each fault lasts faultFor, well
// past maxLate, so a call that waits for Redis fails the bound.
func TestFaultEveryCallDeadline(t *testing.T) {
	race.SkipTiming(t)
	const (
		deadline = 50 * time.Millisecond
		faultFor = 800 * time.Millisecond
		rounds   = 3
		pLate    = 100 * time.Millisecond // at the 90th percentile
		maxLate  = 300 * time.Millisecond
	)
	ctx := context.Background()
	rate := sluice.PerMinute(1000)
	swl := rate.WithAlgorithm(sluice.SlidingWindowLog)
	slots := sluice.Concurrent(100, time.Hour)
	type env struct {
		s     *redisstore.Store
		c     redis.UniversalClient
		m     *redisstore.Membership
		round int
		grant sluice.Grant
	}
	calls := []struct {
		name string
		call func(ctx context.Context, e *env) error
	}{
		{"Check", func(ctx context.Context, e *env) error { _, err := redisstore.Check(ctx, e.c); return err }},
		{"CheckAccess", func(ctx context.Context, e *env) error { return e.s.CheckAccess(ctx) }},
		{"Membership.Heartbeat", func(ctx context.Context, e *env) error { _, err := e.m.Heartbeat(ctx, "me", time.Minute); return err }},
		{"Membership.Roster", func(ctx context.Context, e *env) error { _, _, err := e.m.Roster(ctx, "me", time.Minute); return err }},
		{"Membership.Leave", func(ctx context.Context, e *env) error { return e.m.Leave(ctx, "gone", time.Minute) }},
		{"Take", func(ctx context.Context, e *env) error { _, err := e.s.Take(ctx, "k", rate, 1); return err }},
		{"Peek", func(ctx context.Context, e *env) error { _, err := e.s.Peek(ctx, "k", rate, 1); return err }},
		{"Reset", func(ctx context.Context, e *env) error { return e.s.Reset(ctx, "r", rate) }},
		{"Reset (sliding window log)", func(ctx context.Context, e *env) error { return e.s.Reset(ctx, "r", swl) }},
		{"TakeAll", func(ctx context.Context, e *env) error {
			_, err := e.s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: rate, Cost: 1}, {Key: "b", Limit: rate, Cost: 1}})
			return err
		}},
		{"Grant", func(ctx context.Context, e *env) error { _, err := e.s.Grant(ctx, "g", rate, 2); return err }},
		{"Return", func(ctx context.Context, e *env) error { _, err := e.s.Return(ctx, "g", rate, e.grant, 1); return err }},
		{"Regrant", func(ctx context.Context, e *env) error {
			_, _, err := e.s.Regrant(ctx, "g", rate, e.grant, 1, 2)
			return err
		}},
		{"Acquire", func(ctx context.Context, e *env) error { _, err := e.s.Acquire(ctx, "s", slots, 1, "new"); return err }},
		{"Extend", func(ctx context.Context, e *env) error { _, err := e.s.Extend(ctx, "s", slots, "held"); return err }},
		{"Release (young holder)", func(ctx context.Context, e *env) error {
			_, err := e.s.Release(ctx, "s", fmt.Sprint("young", e.round))
			return err
		}},
		{"ReleaseOnce", func(ctx context.Context, e *env) error {
			_, _, err := e.s.ReleaseOnce(ctx, "s", "held", time.Minute)
			return err
		}},
	}
	type fault struct{ start, stop func(t testing.TB) }
	targets := []struct {
		name  string
		setUp func(t *testing.T) (redis.UniversalClient, fault)
	}{
		{"standalone/client pause", func(t *testing.T) (redis.UniversalClient, fault) {
			srv := redistest.StartServer(t)
			admin := srv.Client(t)
			pause := func(t testing.TB) {
				if err := admin.Do(ctx, "client", "pause", faultFor.Milliseconds(), "all").Err(); err != nil {
					t.Fatal(err)
				}
			}
			return srv.Client(t), fault{pause, func(testing.TB) {}} // the pause ends by itself
		}},
		{"standalone/sigstop/ContextTimeoutEnabled", func(t *testing.T) (redis.UniversalClient, fault) {
			// go-redis ends the read itself at the deadline, racing the
			// context's own timer: the error must still be the context's.
			srv := redistest.StartServer(t)
			c := timedClient(t, redis.Options{Addr: srv.Addr})
			return c, fault{srv.Pause, srv.Resume}
		}},
		{"standalone/sigstop", func(t *testing.T) (redis.UniversalClient, fault) {
			srv := redistest.StartServer(t)
			return srv.Client(t), fault{srv.Pause, srv.Resume}
		}},
		{"cluster/sigstop", func(t *testing.T) (redis.UniversalClient, fault) {
			cl := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 1})
			return cl.Client(t), fault{cl.Nodes[0].Pause, cl.Nodes[0].Resume}
		}},
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			c, f := tg.setUp(t)
			s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
			e := &env{s: s, c: c, m: s.Membership()}
			late := map[string][]time.Duration{}
			var all []time.Duration
			for round := range rounds {
				e.round = round
				// Warm: scripts cached, connections pooled, state to act on.
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				for _, tc := range calls {
					var err error
					if e.grant, err = s.Grant(wctx, "g", rate, 2); err != nil { // one for each return
						t.Fatal(err)
					}
					if err := tc.call(wctx, e); err != nil {
						t.Fatalf("%s before the fault: %v", tc.name, err)
					}
				}
				var err error
				if e.grant, err = s.Grant(wctx, "g", rate, 2); err != nil {
					t.Fatal(err)
				}
				for _, h := range []string{"held", fmt.Sprint("young", round)} {
					if _, err := s.Acquire(wctx, "s", slots, 1, h); err != nil {
						t.Fatal(err)
					}
				}
				cancel()

				f.start(t)
				faultEnd := time.Now().Add(faultFor)
				var mu sync.Mutex
				var wg sync.WaitGroup
				for _, tc := range calls {
					wg.Go(func() {
						// Staggered, so that one stall of the machine costs
						// a few samples, not all of a round's.
						time.Sleep(time.Duration(rand.IntN(20_000)) * time.Microsecond)
						cctx, cancel := context.WithTimeout(ctx, deadline)
						defer cancel()
						end, _ := cctx.Deadline()
						err := tc.call(cctx, e)
						d := time.Since(end)
						if !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("round %d: %s during the fault returned %v after %v past its deadline; want an error wrapping context.DeadlineExceeded",
								round, tc.name, err, d.Round(time.Millisecond))
						}
						mu.Lock()
						late[tc.name] = append(late[tc.name], d)
						all = append(all, d)
						mu.Unlock()
					})
				}
				// The fault ends on time even for calls that wait for it.
				time.Sleep(time.Until(faultEnd))
				f.stop(t)
				wg.Wait()
				waitAnswers(t, c)
			}
			for _, tc := range calls {
				d := late[tc.name]
				if worst := slices.Max(d); worst > maxLate {
					t.Errorf("%s returned %v past its deadline (samples %v): want at most %v", tc.name, worst, d, maxLate)
				}
			}
			slices.Sort(all)
			p := all[(len(all)-1)*90/100]
			t.Logf("%d calls past their deadline by p50 %v, p90 %v, max %v", len(all), all[len(all)/2], p, all[len(all)-1])
			if p > pLate {
				t.Errorf("calls returned p90 %v past their deadline: want at most %v", p, pLate)
			}
		})
	}
}

// waitAnswers waits until Redis answers a PING again after a fault.
func waitAnswers(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("Redis does not answer after the fault: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFaultClusterFailoverFrozen: when a master hangs (SIGSTOP: its port
// accepts connections, nothing answers) rather than dies, Store.OnFailover
// still follows its replica's promotion within 700 ms. go-redis asks one
// node at a time for the slot map, so a reload that asks the hung node
// first waits out its deadline. Each shard's master in turn is frozen and
// left frozen: at the third failover half the cluster's nodes hang.
func TestFaultClusterFailoverFrozen(t *testing.T) {
	race.SkipTiming(t)
	const bound = 700 * time.Millisecond
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	// go-redis's defaults: a read waits out ReadTimeout (3 s) whatever the
	// context; and ContextTimeoutEnabled, as sluice serve builds it.
	timed := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { timed.Close() })
	clients := map[string]*redis.ClusterClient{"defaults": cl.Client(t), "ContextTimeoutEnabled": timed}
	names := []string{"defaults", "ContextTimeoutEnabled"}
	l := failoverLimit
	var (
		mu     sync.Mutex
		stores = map[string]*redisstore.Store{}
		told   = map[string][]time.Time{}
	)
	for _, name := range names {
		s := redisstore.New(clients[name], &redisstore.Options{Prefix: redistest.Prefix(t)})
		noteFailovers(s, &mu, told, name)
		stores[name] = s
	}
	s := stores[names[0]]

	// One key on each master: calls for the frozen one's fail and start
	// the Store's reloads.
	keys, masters := keyPerMaster(t, cl, s, l)
	for _, s := range stores {
		defer takeEach(s, keys, l, 10*time.Millisecond)()
	}
	time.Sleep(300 * time.Millisecond)

	var lags []time.Duration
	for i, m := range masters {
		replicas := cl.ReplicasOf(t, m)
		frozeAt := time.Now()
		m.Pause(t)
		_, at := cl.AwaitMaster(t, 10*time.Second, replicas...)
		for _, name := range names {
			var lag time.Duration
			for deadline := at.Add(3 * time.Second); ; time.Sleep(5 * time.Millisecond) {
				mu.Lock()
				k := slices.IndexFunc(told[name], frozeAt.Before)
				if k >= 0 {
					lag = told[name][k].Sub(at)
				}
				mu.Unlock()
				if k >= 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("failover %d, %s: OnFailover not called within 3 s of the promotion", i+1, name)
				}
			}
			t.Logf("failover %d (%d of 6 nodes hung), client with %s: promoted %v after the freeze; OnFailover %v after the promotion",
				i+1, i+1, name, at.Sub(frozeAt).Round(time.Millisecond), lag.Round(time.Millisecond))
			if lag > bound {
				t.Errorf("failover %d, client with %s: OnFailover %v after the promotion, want within %v", i+1, name, lag, bound)
			}
			lags = append(lags, lag)
		}
	}
	slices.Sort(lags)
	t.Logf("OnFailover after the promotion: %v", lags)
}

// noteFailovers appends to told[name], under mu, the time of each
// OnFailover call of s.
func noteFailovers(s *redisstore.Store, mu *sync.Mutex, told map[string][]time.Time, name string) {
	s.OnFailover(func() {
		mu.Lock()
		told[name] = append(told[name], time.Now())
		mu.Unlock()
	})
}

// takeEach takes a unit of each key from s every interval, each call
// bounded by 100 ms, until the returned stop is called.
func takeEach(s *redisstore.Store, keys []string, l sluice.Limit, every time.Duration) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(every):
				}
				ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
				_, _ = s.Take(ctx, key, l, 1)
				cancel()
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// TestFaultClusterPlannedFailover: a planned failover (CLUSTER FAILOVER on
// a replica) fails no call, so no reload episode starts; the Store still
// tells it, one line and one OnFailover call, once go-redis's slot map
// names the promoted replica: a store under calls (go-redis reloads its
// map on the MOVED the demoted master answers) and one that only runs
// CheckAccess every 250 ms, as sluice serve's check does. It was told
// only at the next failure episode, and never without one. The test only
// requires it within a generous maximum, each master failed over in turn
// (TestFaultClusterPlannedFailoverIdle holds the watch to its bound).
//
// A third store is called once a second, on the failed-over master's key:
// its first call after the promotion is redirected and succeeds before
// go-redis's reload of its map lands, so a look right after that call
// finds nothing, and it was told at its next call, 1.0–1.6 s after the
// promotion. The look a call schedules lookEvery later tells it; the
// test requires it within sparseWithin of the first MOVED its client met.
// The store's watch often reloads the map before that call, which then
// meets no MOVED.
func TestFaultClusterPlannedFailover(t *testing.T) {
	race.SkipTiming(t)
	const (
		within       = 5 * time.Second
		sparseWithin = 500 * time.Millisecond
	)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	l := failoverLimit
	names := []string{"calls", "checks", "sparse"}
	var (
		mu   sync.Mutex
		told = map[string][]time.Time{}
		logs = map[string]*logtest.Log{}
	)
	// The sparse store's client notes each MOVED its nodes answer.
	var moved movedLog
	sparse := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), NewClient: func(o *redis.Options) *redis.Client {
		c := redis.NewClient(o)
		c.AddHook(redistest.AfterEach(func(_ redis.Cmder, err error) { moved.note(err) }))
		return c
	}})
	t.Cleanup(func() { sparse.Close() })
	stores := map[string]*redisstore.Store{}
	for _, name := range names {
		logs[name] = &logtest.Log{}
		client := cl.Client(t)
		if name == "sparse" {
			client = sparse
		}
		s := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t),
			Logger: logs[name].TextLogger()})
		noteFailovers(s, &mu, told, name)
		stores[name] = s
	}
	keys, masters := keyPerMaster(t, cl, stores["calls"], l)
	defer takeEach(stores["calls"], keys, l, 10*time.Millisecond)()
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = stores["checks"].CheckAccess(ctx)
			cancel()
			select {
			case <-done:
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	})
	// One call a second, on the key of the master failed over next.
	var next atomic.Int32
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = stores["sparse"].Take(ctx, keys[next.Load()], l, 1)
			cancel()
		}
	})
	defer func() { close(done); wg.Wait() }()
	time.Sleep(1500 * time.Millisecond)

	var sparseLags []time.Duration
	for i, m := range masters {
		next.Store(int32(i))
		time.Sleep(1100 * time.Millisecond) // the sparse store has called the key once
		replica := cl.ReplicasOf(t, m)[0]
		// The promoted replica has the scripts, as one that served before
		// does: a redirected call that met NOSCRIPT took a round trip
		// more, often enough for go-redis's reload to land first.
		rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
		err := redisstore.New(rc, nil).Warm(context.Background())
		rc.Close()
		if err != nil {
			t.Fatalf("failover %d: loading the scripts on %s: %v", i+1, replica.Addr, err)
		}
		sent := time.Now()
		c := redis.NewClient(&redis.Options{Addr: replica.Addr})
		err = c.Do(context.Background(), "cluster", "failover").Err()
		c.Close()
		if err != nil {
			t.Fatalf("failover %d: CLUSTER FAILOVER on %s: %v", i+1, replica.Addr, err)
		}
		_, at := cl.AwaitMaster(t, 10*time.Second, replica)
		for _, name := range names {
			for deadline := at.Add(within); ; time.Sleep(5 * time.Millisecond) {
				mu.Lock()
				n := len(told[name])
				var last time.Time
				if n > 0 {
					last = told[name][n-1]
				}
				mu.Unlock()
				if n == i+1 {
					t.Logf("failover %d, store under %s: OnFailover %v after the test saw the promotion", i+1, name, last.Sub(at).Round(time.Millisecond))
					if name != "sparse" {
						break
					}
					first, ok := moved.firstAfter(sent)
					if !ok || first.After(last) {
						t.Logf("failover %d: the sparse store's client met no MOVED before it was told", i+1)
						break
					}
					lag := last.Sub(first)
					t.Logf("failover %d, store under one call a second: OnFailover %v after its first MOVED", i+1, lag.Round(time.Millisecond))
					if lag > sparseWithin {
						t.Errorf("failover %d, store under one call a second: OnFailover %v after its first MOVED, want within %v", i+1, lag.Round(time.Millisecond), sparseWithin)
					}
					sparseLags = append(sparseLags, lag)
					break
				}
				if n > i+1 {
					t.Fatalf("failover %d, store under %s: OnFailover called %d times in all, want %d", i+1, name, n, i+1)
				}
				if time.Now().After(deadline) {
					t.Fatalf("failover %d, store under %s: OnFailover not called within %v of the promotion", i+1, name, within)
				}
			}
		}
	}
	t.Logf("the sparse store's client met a MOVED before it was told in %d of %d failovers", len(sparseLags), len(masters))
	time.Sleep(time.Second) // a second call for one failover would show by now
	for _, name := range names {
		mu.Lock()
		n := len(told[name])
		mu.Unlock()
		lines := strings.Count(logs[name].String(), "cluster masters changed")
		if n != len(masters) || lines != len(masters) {
			t.Errorf("store under %s: OnFailover called %d times, %d lines, for %d failovers; log:\n%s", name, n, lines, len(masters), logs[name])
		}
	}
}

// movedLog notes when a node answers MOVED, hooked on a cluster's node
// clients.
type movedLog struct {
	mu sync.Mutex
	at []time.Time
}

func (l *movedLog) note(err error) {
	if err != nil && strings.HasPrefix(err.Error(), "MOVED ") {
		l.mu.Lock()
		l.at = append(l.at, time.Now())
		l.mu.Unlock()
	}
}

// firstAfter returns the time of the first MOVED after t.
func (l *movedLog) firstAfter(t time.Time) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, at := range l.at {
		if at.After(t) {
			return at, true
		}
	}
	return time.Time{}, false
}

// TestFaultClusterPlannedFailoverIdle: a store that made one call and then
// none, and runs no CheckAccess, tells a planned failover within
// idleWithin of the promotion: its watch asks a node for the slot map every
// second and reloads the client's map when they differ. It was told only
// at go-redis's own reload of its map (ClusterStateReloadInterval, a
// minute), or at a later call the demoted master redirected. A store
// called only on the other masters' keys (no call meets a MOVED) is told
// as soon.
func TestFaultClusterPlannedFailoverIdle(t *testing.T) {
	race.SkipTiming(t)
	const idleWithin = 2500 * time.Millisecond
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	l := failoverLimit
	names := []string{"idle", "others"}
	var (
		mu   sync.Mutex
		told = map[string][]time.Time{}
		logs = map[string]*logtest.Log{}
	)
	stores := map[string]*redisstore.Store{}
	for _, name := range names {
		logs[name] = &logtest.Log{}
		s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t),
			Logger: logs[name].TextLogger()})
		noteFailovers(s, &mu, told, name)
		stores[name] = s
	}
	keys, masters := keyPerMaster(t, cl, stores["idle"], l)
	for _, name := range names {
		if _, err := stores[name].Take(context.Background(), keys[0], l, 1); err != nil {
			t.Fatal(err)
		}
	}
	// The other store is called on the keys of the masters not failed over.
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer func() { close(done); wg.Wait() }()
	wg.Go(func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_, _ = stores["others"].Take(ctx, keys[1], l, 1)
			_, _ = stores["others"].Take(ctx, keys[2], l, 1)
			cancel()
		}
	})
	time.Sleep(1500 * time.Millisecond) // the watches have started
	replica := cl.ReplicasOf(t, masters[0])[0]
	c := redis.NewClient(&redis.Options{Addr: replica.Addr})
	err := c.Do(context.Background(), "cluster", "failover").Err()
	c.Close()
	if err != nil {
		t.Fatalf("CLUSTER FAILOVER on %s: %v", replica.Addr, err)
	}
	_, at := cl.AwaitMaster(t, 10*time.Second, replica)
	for _, name := range names {
		for deadline := at.Add(idleWithin); ; time.Sleep(5 * time.Millisecond) {
			mu.Lock()
			n := len(told[name])
			var first time.Time
			if n > 0 {
				first = told[name][0]
			}
			mu.Unlock()
			if n > 0 {
				t.Logf("store %s: OnFailover %v after the test saw the promotion", name, first.Sub(at).Round(time.Millisecond))
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("store %s: OnFailover not called within %v of the promotion; log:\n%s", name, idleWithin, logs[name])
			}
		}
	}
	time.Sleep(1500 * time.Millisecond) // a second call for the failover would show by now
	for _, name := range names {
		mu.Lock()
		n := len(told[name])
		mu.Unlock()
		lines := strings.Count(logs[name].String(), "cluster masters changed")
		if n != 1 || lines != 1 {
			t.Errorf("store %s: OnFailover called %d times, %d lines, for one failover; log:\n%s", name, n, lines, logs[name])
		}
	}
}
