package redisstore_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
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
		s.OnFailover(func() {
			mu.Lock()
			told[name] = append(told[name], time.Now())
			mu.Unlock()
		})
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
