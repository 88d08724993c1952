package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
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
// still pays that once when its context can never end, as here (its send
// runs on the caller's goroutine, in go-redis's backoff); one that can
// end fails at once (TestClosedClusterShortDeadline).
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

// A nil *Store behaves as a zero Store: every call that would reach Redis
// is refused with ErrNoClient, the others answer as for an empty prefix,
// and none panics.
func TestNilStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limit := sluice.PerSecond(10)
	slot := sluice.InFlightLimit{Max: 1, Hold: time.Second}
	for _, tc := range []struct {
		name string
		s    *redisstore.Store
	}{{"nil", nil}, {"zero", &redisstore.Store{}}} {
		s := tc.s
		if _, err := s.Take(ctx, "k", limit, 1); !errors.Is(err, redisstore.ErrNoClient) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("%s: Take err = %v, want ErrNoClient, a sluice.ErrStoreNotBuilt", tc.name, err)
		}
		if _, err := s.Peek(ctx, "k", limit, 1); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: Peek err = %v, want ErrNoClient", tc.name, err)
		}
		if err := s.Reset(ctx, "k", limit); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: Reset err = %v, want ErrNoClient", tc.name, err)
		}
		for n := range 4 {
			reqs := make([]sluice.Request, n)
			for i := range reqs {
				reqs[i] = sluice.Request{Key: string(rune('a' + i)), Limit: limit, Cost: 1}
			}
			ds, err := s.TakeAll(ctx, reqs)
			if n == 0 && (err != nil || len(ds) != 0) || n > 0 && !errors.Is(err, redisstore.ErrNoClient) {
				t.Errorf("%s: TakeAll of %d: %v, %v; want ErrNoClient (none for 0)", tc.name, n, ds, err)
			}
		}
		if _, err := s.Grant(ctx, "k", limit, 1); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: Grant err = %v, want ErrNoClient", tc.name, err)
		}
		if _, err := s.Return(ctx, "k", limit, sluice.Grant{Granted: 1}, 1); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: Return err = %v, want ErrNoClient", tc.name, err)
		}
		if _, _, err := s.Regrant(ctx, "k", limit, sluice.Grant{Granted: 1}, 1, 1); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: Regrant err = %v, want ErrNoClient", tc.name, err)
		}
		if _, err := s.Acquire(ctx, "k", slot, 1, "h"); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: Acquire err = %v, want ErrNoClient", tc.name, err)
		}
		if _, err := s.Extend(ctx, "k", slot, "h"); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: Extend err = %v, want ErrNoClient", tc.name, err)
		}
		if _, err := s.Release(ctx, "k", "h"); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: Release err = %v, want ErrNoClient", tc.name, err)
		}
		if err := s.CheckAccess(ctx); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: CheckAccess err = %v, want ErrNoClient", tc.name, err)
		}
		m := s.Membership()
		if _, err := m.Heartbeat(ctx, "me", time.Second); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: Membership().Heartbeat err = %v, want ErrNoClient", tc.name, err)
		}
		if got, want := m.Key(), "{fleet}"; got != want {
			t.Errorf("%s: Membership().Key() = %q, want %q", tc.name, got, want)
		}
		if got, want := s.Keys("k", limit), []string{"{k}:gcra"}; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: Keys = %q, want %q", tc.name, got, want)
		}
		if got, want := s.SlotKeys("k"), []string{"{k}:if2"}; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: SlotKeys = %q, want %q", tc.name, got, want)
		}
		s.OnFailover(func() {})
		if n := s.ClusterReloads(); n != 0 {
			t.Errorf("%s: ClusterReloads = %d, want 0", tc.name, n)
		}
		if _, err := sluice.NewLimiter(s, limit, nil); !errors.Is(err, sluice.ErrStoreNotBuilt) || !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%s: NewLimiter err = %v, want ErrStoreNotBuilt (ErrNoClient)", tc.name, err)
		}
	}
}

// A negative MaxBatch, MaxInFlight, WaitReplicas, WaitTimeout or
// ReloadInterval used to become the default in silence. The Store now
// refuses every call with ErrInvalidOptions naming the field, writes
// nothing to Redis, and CheckBuilt says so, so that the middleware refuses
// it when built. 0 is still the default. Against a real Redis.
func TestNegativeOptions(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	ctx := context.Background()
	limit := sluice.PerSecond(5)
	for field, o := range map[string]redisstore.Options{
		"MaxBatch":       {MaxBatch: -1},
		"MaxInFlight":    {MaxInFlight: -2},
		"WaitReplicas":   {WaitReplicas: -1},
		"WaitTimeout":    {WaitTimeout: -time.Millisecond},
		"ReloadInterval": {ReloadInterval: -time.Second},
	} {
		o.Prefix = redistest.Prefix(t)
		s := redisstore.New(client, &o)
		_, err := s.Take(ctx, "k", limit, 1)
		if !errors.Is(err, redisstore.ErrInvalidOptions) || !errors.Is(err, sluice.ErrStoreNotBuilt) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s negative: Take = %v, want ErrInvalidOptions naming it", field, err)
		}
		if _, err := s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: limit, Cost: 1}, {Key: "b", Limit: limit, Cost: 1}}); !errors.Is(err, redisstore.ErrInvalidOptions) {
			t.Errorf("%s negative: TakeAll = %v, want ErrInvalidOptions", field, err)
		}
		if err := s.CheckBuilt(); !errors.Is(err, redisstore.ErrInvalidOptions) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s negative: CheckBuilt = %v", field, err)
		}
		// Its fleet registry says the same, not that no client was given.
		if err := s.Membership().CheckBuilt(); !errors.Is(err, redisstore.ErrInvalidOptions) || !strings.Contains(err.Error(), field) {
			t.Errorf("%s negative: Membership().CheckBuilt = %v", field, err)
		}
		if _, err := s.Membership().Heartbeat(ctx, "me", time.Second); !errors.Is(err, redisstore.ErrInvalidOptions) {
			t.Errorf("%s negative: Membership().Heartbeat = %v, want ErrInvalidOptions", field, err)
		}
		if n, err := client.Exists(ctx, s.Keys("k", limit)...).Result(); err != nil || n != 0 {
			t.Errorf("%s negative: %d keys written (%v), want none", field, n, err)
		}
		if _, err := httplimit.New(s, []httplimit.Rule{{Name: "r", Limit: limit, Key: httplimit.Global()}}, nil); !errors.Is(err, httplimit.ErrInvalidConfig) || !errors.Is(err, redisstore.ErrInvalidOptions) {
			t.Errorf("%s negative: httplimit.New = %v, want ErrInvalidConfig and ErrInvalidOptions", field, err)
		}
	}
	s := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}) // 0: the defaults
	if d, err := s.Take(ctx, "k", limit, 1); err != nil || !d.Allowed {
		t.Errorf("default options: Take = %+v, %v", d, err)
	}
	if err := s.CheckBuilt(); err != nil {
		t.Errorf("default options: CheckBuilt = %v", err)
	}
}

// A Prefix whose first "{" is followed by "}" ("rl{}:") makes Redis hash
// each whole key, so a key and its partner keys (reset epoch, in-flight
// holders) land in different slots of a Cluster: the Store refuses it with
// ErrInvalidOptions naming Prefix, and CheckBuilt says so. A tag with text
// in it, or a "{}" after the first tag, is taken. Against a real Redis.
func TestEmptyHashTagPrefix(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	ctx := context.Background()
	limit := sluice.PerSecond(5)
	base := redistest.Prefix(t)
	for _, p := range []string{"rl{}:", "{}", "rl{}{t}:"} {
		s := redisstore.New(client, &redisstore.Options{Prefix: base + p})
		if _, err := s.Take(ctx, "k", limit, 1); !errors.Is(err, redisstore.ErrInvalidOptions) || !strings.Contains(err.Error(), "Prefix") {
			t.Errorf("Prefix %q: Take = %v, want ErrInvalidOptions naming Prefix", p, err)
		}
		if err := s.CheckBuilt(); !errors.Is(err, redisstore.ErrInvalidOptions) || !strings.Contains(err.Error(), "Prefix") {
			t.Errorf("Prefix %q: CheckBuilt = %v, want ErrInvalidOptions naming Prefix", p, err)
		}
	}
	for _, p := range []string{"rl{t}:", "rl{t}{}:", "rl}{:"} {
		s := redisstore.New(client, &redisstore.Options{Prefix: base + p})
		if err := s.CheckBuilt(); err != nil {
			t.Errorf("Prefix %q: CheckBuilt = %v", p, err)
		}
		if d, err := s.Take(ctx, "k", limit, 1); err != nil || !d.Allowed {
			t.Errorf("Prefix %q: Take = %+v, %v", p, d, err)
		}
	}
}
