package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestFaultClusterPlannedFailover: a planned failover (CLUSTER FAILOVER on
// a replica) fails no call, so no reload episode starts; the Store still
// tells it, one line and one OnFailover call, once go-redis's slot map
// names the promoted replica: a store under calls (go-redis reloads its
// map on the MOVED the demoted master answers) and one that only runs
// CheckAccess every 250 ms, as sluice serve's check does. It was told
// only at the next failure episode, and never without one. The lag rides
// on go-redis's reload, not on a timer of the Store's, so the test only
// requires it within a generous maximum, each master failed over in turn.
func TestFaultClusterPlannedFailover(t *testing.T) {
	race.SkipTiming(t)
	const within = 5 * time.Second
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	l := failoverLimit
	names := []string{"calls", "checks"}
	var (
		mu   sync.Mutex
		told = map[string][]time.Time{}
		logs = map[string]*syncBuffer{}
	)
	stores := map[string]*redisstore.Store{}
	for _, name := range names {
		logs[name] = &syncBuffer{}
		s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t),
			Logger: slog.New(slog.NewTextHandler(logs[name], nil))})
		s.OnFailover(func() {
			mu.Lock()
			told[name] = append(told[name], time.Now())
			mu.Unlock()
		})
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
	defer func() { close(done); wg.Wait() }()
	time.Sleep(500 * time.Millisecond)

	for i, m := range masters {
		replica := cl.ReplicasOf(t, m)[0]
		c := redis.NewClient(&redis.Options{Addr: replica.Addr})
		err := c.Do(context.Background(), "cluster", "failover").Err()
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
