package redisstore_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// A Store whose Cluster client was closed reads as closed
// (sluice.ErrStoreClosed) under deadlines shorter than go-redis's own
// 100–145 ms to fail a call on a closed Cluster client: resilient's
// default 50 ms cut every call first, so the Store never learnt it, and
// resilient answered by its failure policy. The first call fails at once
// too, rather than at its deadline. Nor does a deliberate Close start the
// slot-map reloads and their warning.
func TestClosedClusterShortDeadline(t *testing.T) {
	seed := redistest.ClusterClient(t)
	l := sluice.PerSecond(1_000_000)
	in := sluice.Concurrent(100, time.Minute)
	for _, tc := range []struct {
		name string
		opts redisstore.Options
	}{{"batched", redisstore.Options{}}, {"MaxBatch 1", redisstore.Options{MaxBatch: 1}}} {
		t.Run(tc.name, func(t *testing.T) {
			var log logtest.Log
			own := redis.NewClusterClient(seed.Options())
			opts := tc.opts
			opts.Prefix, opts.Logger = redistest.Prefix(t), log.Logger()
			store := redisstore.New(own, &opts)
			ctx := context.Background()
			if _, err := store.Take(ctx, "k", l, 1); err != nil {
				t.Fatal(err)
			}
			for _, h := range []string{"h0", "h1", "h2", "h3"} {
				if d, err := store.Acquire(ctx, "k", in, 1, h); err != nil || !d.Allowed {
					t.Fatal(d, err)
				}
			}
			own.Close()
			var took []time.Duration
			for i, call := range []func(context.Context) error{
				func(ctx context.Context) error { _, err := store.Take(ctx, "k", l, 1); return err },
				func(ctx context.Context) error { _, err := store.Release(ctx, "k", "h0"); return err },
				func(ctx context.Context) error { _, err := store.Take(ctx, "other", l, 1); return err },
				func(ctx context.Context) error { _, err := store.Release(ctx, "k", "h1"); return err },
				func(ctx context.Context) error { _, err := store.Acquire(ctx, "k", in, 1, "h9"); return err },
				func(ctx context.Context) error { _, err := store.Release(ctx, "k", "h2"); return err },
				func(ctx context.Context) error { _, err := store.Peek(ctx, "k", l, 1); return err },
				func(ctx context.Context) error { _, err := store.Release(ctx, "k", "h3"); return err },
			} {
				ctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
				start := time.Now()
				err := call(ctx)
				took = append(took, time.Since(start))
				cancel()
				if !errors.Is(err, sluice.ErrStoreClosed) {
					t.Errorf("call %d after Close, 50ms deadline: %v after %v, want sluice.ErrStoreClosed", i, err, took[i])
				}
				// The first too (it asks go-redis, which fails its first
				// try at once), though not by the recorded close.
				most := 10 * time.Millisecond
				if i == 0 {
					most = 25 * time.Millisecond
				}
				if took[i] > most {
					t.Errorf("call %d after Close took %v, want it to fail at once", i, took[i])
				}
			}
			t.Logf("calls after Close took %v", took)
			time.Sleep(300 * time.Millisecond) // a reload episode would have begun
			if strings.Contains(log.String(), "cluster calls failing") {
				t.Errorf("a closed client started the slot-map reloads:\n%s", log.String())
			}
			if n := store.ClusterReloads(); n != 0 {
				t.Errorf("ClusterReloads = %d after a Close, want 0", n)
			}
			if n := goroutines("(*reloader).poll"); n != 0 {
				t.Errorf("%d slot-map reload goroutines run after the Close, want none", n)
			}
		})
	}
}

// A Store whose calls were failing (a master stopped: its reloads run)
// reads as closed once its Cluster client is closed, and its reloads
// stop, rather than run on for a minute.
func TestClosedClusterStopsReloads(t *testing.T) {
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 2, NodeTimeout: 30 * time.Second})
	own := cl.Client(t)
	var log logtest.Log
	store := redisstore.New(own, &redisstore.Options{Prefix: redistest.Prefix(t), Logger: log.Logger(), ReloadInterval: 50 * time.Millisecond})
	l := sluice.PerSecond(1_000_000)
	ctx := context.Background()
	if _, err := store.Take(ctx, "k", l, 1); err != nil {
		t.Fatal(err)
	}
	down := cl.MasterOf(t, store.Keys("k", l)[0])
	down.Pause(t)
	t.Cleanup(func() { down.Resume(t) })
	// Its calls time out one after another, and past 500 ms of them the
	// episode begins (an isolated timeout starts none).
	for start := time.Now(); !strings.Contains(log.String(), "cluster calls failing"); {
		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err := store.Take(short, "k", l, 1)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Take on a stopped master = %v, want a deadline", err)
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("no reload episode began in 2s of timeouts:\n%s", log.String())
		}
	}
	own.Close()
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := store.Take(short, "k", l, 1)
	cancel()
	if !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("Take after Close, its master stopped = %v, want sluice.ErrStoreClosed", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for goroutines("(*reloader).poll") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the slot-map reloads run on 2s after the client was closed")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// goroutines counts the goroutines with fn in their stacks.
func goroutines(fn string) int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	count := 0
	for g := range strings.SplitSeq(string(buf), "\n\n") {
		if strings.Contains(g, fn) {
			count++
		}
	}
	return count
}

// CheckClosed tells a closed client, standalone or Cluster, with no round
// trip, and nothing for an open one.
func TestCheckClosed(t *testing.T) {
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 2})
	for name, c := range map[string]redis.UniversalClient{
		"standalone": redis.NewClient(&redis.Options{Addr: redistest.Addr(t)}),
		"cluster":    cl.Client(t),
	} {
		t.Run(name, func(t *testing.T) {
			store := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
			if _, err := store.Take(context.Background(), "k", sluice.PerSecond(10), 1); err != nil {
				t.Fatal(err)
			}
			if err := store.CheckClosed(); err != nil {
				t.Fatalf("CheckClosed on an open client = %v", err)
			}
			c.Close()
			if err := store.CheckClosed(); !errors.Is(err, sluice.ErrStoreClosed) {
				t.Errorf("CheckClosed on a closed client = %v, want sluice.ErrStoreClosed", err)
			}
		})
	}
}
