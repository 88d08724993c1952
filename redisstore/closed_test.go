package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// Every call on a Store whose client was closed fails with an error that
// is sluice.ErrStoreClosed (and still redis.ErrClosed), so that background
// releases, and any caller, stop on it: decisions, TakeAll, lease grants,
// in-flight slots, Reset, the checks and the fleet registry's calls, with
// and without batching.
func TestClosedClientIsErrStoreClosed(t *testing.T) {
	redistest.Each(t, func(t *testing.T, c redis.UniversalClient) {
		for _, tc := range []struct {
			name string
			opts redisstore.Options
		}{{"batched", redisstore.Options{}}, {"MaxBatch 1", redisstore.Options{MaxBatch: 1}}} {
			t.Run(tc.name, func(t *testing.T) {
				closedStore(t, c, tc.opts)
			})
		}
	})
}

func closedStore(t *testing.T, c redis.UniversalClient, opts redisstore.Options) {
	ctx := context.Background()
	opts.Prefix = redistest.Prefix(t)
	// A client of its own to close, built as c.
	var own redis.UniversalClient
	switch c := c.(type) {
	case *redis.ClusterClient:
		own = redis.NewClusterClient(c.Options())
	case *redis.Client:
		own = redis.NewClient(c.Options())
	}
	store := redisstore.New(own, &opts)
	l, swl := sluice.PerSecond(5), sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 5, Period: time.Second}
	in := sluice.Concurrent(2, time.Minute)
	if d, err := store.Acquire(ctx, "k", in, 1, "h"); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	g, err := store.Grant(ctx, "g", l, 2)
	if err != nil {
		t.Fatal(err)
	}
	fleet := store.Membership()
	if _, err := fleet.Heartbeat(ctx, "m", time.Minute); err != nil {
		t.Fatal(err)
	}
	own.Close()

	for _, call := range []struct {
		name string
		err  func() error
	}{
		{"Take", func() error { _, err := store.Take(ctx, "k", l, 1); return err }},
		{"Peek", func() error { _, err := store.Peek(ctx, "k", l, 1); return err }},
		{"Reset", func() error { return store.Reset(ctx, "k", l) }},
		{"Reset sliding window log", func() error { return store.Reset(ctx, "k", swl) }},
		{"TakeAll", func() error {
			_, err := store.TakeAll(ctx, []sluice.Request{{Key: "{t}a", Limit: l, Cost: 1}, {Key: "{t}b", Limit: l, Cost: 1}})
			return err
		}},
		{"TakeAll across slots", func() error {
			_, err := store.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 1}})
			return err
		}},
		{"Grant", func() error { _, err := store.Grant(ctx, "g", l, 1); return err }},
		{"Return", func() error { _, err := store.Return(ctx, "g", l, g, 1); return err }},
		{"Regrant", func() error { _, _, err := store.Regrant(ctx, "g", l, g, 1, 1); return err }},
		{"Acquire", func() error { _, err := store.Acquire(ctx, "k", in, 1, "h2"); return err }},
		{"Extend", func() error { _, err := store.Extend(ctx, "k", in, "h"); return err }},
		{"Release", func() error { _, err := store.Release(ctx, "k", "h"); return err }},
		{"ReleaseOnce", func() error { _, _, err := store.ReleaseOnce(ctx, "k", "h", time.Minute); return err }},
		{"CheckAccess", func() error { return store.CheckAccess(ctx) }},
		{"Check", func() error { _, err := redisstore.Check(ctx, own); return err }},
		{"Heartbeat", func() error { _, err := fleet.Heartbeat(ctx, "m", time.Minute); return err }},
		{"Roster", func() error { _, _, err := fleet.Roster(ctx, "m", time.Minute); return err }},
		{"Leave", func() error { return fleet.Leave(ctx, "m", time.Minute) }},
	} {
		start := time.Now()
		err := call.err()
		if !errors.Is(err, sluice.ErrStoreClosed) || !errors.Is(err, redis.ErrClosed) {
			t.Errorf("%s after Close = %v, want sluice.ErrStoreClosed and redis.ErrClosed", call.name, err)
		}
		if d := time.Since(start); d > 100*time.Millisecond {
			t.Logf("%s after Close took %v", call.name, d)
		}
	}
}

// TestClosedClusterFailsAtOnce: calls on a Store whose Cluster client was
// closed fail with sluice.ErrStoreClosed at once, used before the Close or
// not. go-redis, holding a slot map, tried each call again three times
// after its retry backoff: 100–145 ms each. The first call after the Close
// still pays that once (nothing cheaper tells a closed Cluster client).
func TestClosedClusterFailsAtOnce(t *testing.T) {
	race.SkipTiming(t)
	seed := redistest.ClusterClient(t)
	l := sluice.PerSecond(1_000_000)
	for _, tc := range []struct {
		name string
		opts redisstore.Options
		used bool
	}{
		{"batched", redisstore.Options{}, true},
		{"MaxBatch 1", redisstore.Options{MaxBatch: 1}, true},
		{"batched, unused", redisstore.Options{}, false},
		{"MaxBatch 1, unused", redisstore.Options{MaxBatch: 1}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			own := redis.NewClusterClient(seed.Options())
			opts := tc.opts
			opts.Prefix = redistest.Prefix(t)
			store := redisstore.New(own, &opts)
			if tc.used {
				if _, err := store.Take(context.Background(), "k", l, 1); err != nil {
					t.Fatal(err)
				}
			}
			own.Close()
			start := time.Now()
			if _, err := store.Take(context.Background(), "first", l, 1); !errors.Is(err, sluice.ErrStoreClosed) {
				t.Fatalf("Take after Close = %v, want sluice.ErrStoreClosed", err)
			}
			first := time.Since(start)
			took := make([]time.Duration, 100)
			for i := range took {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				start := time.Now()
				_, err := store.Take(ctx, fmt.Sprint("k", i), l, 1)
				took[i] = time.Since(start)
				cancel()
				if !errors.Is(err, sluice.ErrStoreClosed) {
					t.Fatalf("Take after Close = %v, want sluice.ErrStoreClosed", err)
				}
			}
			slices.Sort(took)
			p99 := took[98]
			t.Logf("first call after Close %v; the 100 next: p50 %v, p99 %v, max %v", first, took[49], p99, took[99])
			if p99 > time.Millisecond {
				t.Errorf("calls after Close took p99 %v, want under 1ms", p99)
			}
		})
	}
}
