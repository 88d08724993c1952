package redisstore_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultIsolatedTimeoutsNoReloads: a Cluster master that stops
// answering for 80 ms every 600 ms (CLIENT PAUSE: a busy host, not a
// failed node) times out some of its 50 ms calls and answers the calls
// around them. Those timeouts are isolated: no reload episode starts, or
// one ends within recoveredAfter (5 s) of the last pause. Each timeout
// started an episode or pushed its end 5 s further away: over 6 s of
// pauses the episode never ended and reloaded the slot map 4 times a
// second.
func TestFaultIsolatedTimeoutsNoReloads(t *testing.T) {
	race.SkipTiming(t)
	const (
		deadline = 50 * time.Millisecond
		pause    = 80 * time.Millisecond
		every    = 600 * time.Millisecond
		pauses   = 10
		// An episode reloads every 250 ms for at least 5 s.
		maxReloads = 8
	)
	s, logs, keys, admin := clusterTaken(t, nil)

	var timeouts, calls atomic.Int64
	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, key := range keys {
		for range 2 {
			wg.Go(func() {
				for {
					select {
					case <-done:
						return
					case <-time.After(5 * time.Millisecond):
					}
					ctx, cancel := context.WithTimeout(context.Background(), deadline)
					_, err := s.Take(ctx, key, failoverLimit, 1)
					cancel()
					calls.Add(1)
					if err != nil {
						timeouts.Add(1)
					}
				}
			})
		}
	}
	stop := func() { close(done); wg.Wait() }
	defer func() {
		if done != nil {
			stop()
		}
	}()

	for range pauses {
		time.Sleep(every - pause)
		if err := admin.ClientPause(context.Background(), pause).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(pause)
	}
	last := time.Now()
	// An episode, if one started, ends within recoveredAfter of the last
	// timeout, at a call that succeeds.
	for !episodeOver(logs.String()) && time.Since(last) < 7*time.Second {
		time.Sleep(50 * time.Millisecond)
	}
	stop()
	done = nil

	out := logs.String()
	started := strings.Count(out, "cluster calls failing")
	t.Logf("%d of %d calls failed over %d pauses; %d episodes, %d slot-map reloads",
		timeouts.Load(), calls.Load(), pauses, started, s.ClusterReloads())
	if timeouts.Load() == 0 {
		t.Fatal("no call timed out: the pauses did not show")
	}
	if !episodeOver(out) {
		t.Errorf("the reload episode still ran %v after the last pause:\n%s", time.Since(last).Round(time.Millisecond), out)
	}
	if n := s.ClusterReloads(); n > maxReloads {
		t.Errorf("%d slot-map reloads for isolated timeouts, want at most %d:\n%s", n, maxReloads, out)
	}
}

// TestFaultTimeoutRunReloads: a master that times out call after call (a
// hung host, a partition: CLIENT PAUSE here, so that no failover comes)
// still starts the reloads, once its calls have timed out for 500 ms with
// none answered; within a second of the stop.
func TestFaultTimeoutRunReloads(t *testing.T) {
	race.SkipTiming(t)
	const (
		deadline = 50 * time.Millisecond
		hang     = 1500 * time.Millisecond
		within   = time.Second
	)
	// A node timeout longer than the hang: the master is never flagged.
	s, logs, keys, admin := clusterTaken(t, &redistest.ClusterOptions{NodeTimeout: 5 * time.Second})

	done := make(chan struct{})
	var wg sync.WaitGroup
	for _, key := range keys {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(5 * time.Millisecond):
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				_, _ = s.Take(ctx, key, failoverLimit, 1)
				cancel()
			}
		})
	}
	defer func() { close(done); wg.Wait() }()
	time.Sleep(200 * time.Millisecond)
	if strings.Contains(logs.String(), "cluster calls failing") {
		t.Fatalf("an episode before the hang:\n%s", logs.String())
	}
	start := time.Now()
	if err := admin.ClientPause(context.Background(), hang).Err(); err != nil {
		t.Fatal(err)
	}
	for !strings.Contains(logs.String(), "cluster calls failing") {
		if time.Since(start) > hang {
			t.Fatalf("no reload episode %v into a master's hang:\n%s", hang, logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	took := time.Since(start)
	t.Logf("reload episode started %v into the hang", took.Round(time.Millisecond))
	if took > within {
		t.Errorf("reload episode started %v into the hang, want within %v", took, within)
	}
}

// episodeOver reports whether every reload episode the log shows ended.
func episodeOver(log string) bool {
	return strings.Count(log, "cluster calls failing") == strings.Count(log, "cluster calls succeeding again")
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// clusterTaken starts a Cluster and a Store on it that logs to logs, with
// one key per master (keys, each taken once, in masters' order) and a
// client of the first master (admin).
func clusterTaken(t *testing.T, opts *redistest.ClusterOptions) (*redisstore.Store, *syncBuffer, []string, *redis.Client) {
	t.Helper()
	cl := redistest.StartCluster(t, opts)
	logs := &syncBuffer{}
	s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t),
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	keys, masters := keyPerMaster(t, cl, s, failoverLimit)
	for _, key := range keys {
		if _, err := s.Take(context.Background(), key, failoverLimit, 1); err != nil {
			t.Fatal(err)
		}
	}
	admin := redis.NewClient(&redis.Options{Addr: masters[0].Addr})
	t.Cleanup(func() { admin.Close() })
	return s, logs, keys, admin
}
