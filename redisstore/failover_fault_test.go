package redisstore_test

import (
	"context"
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
