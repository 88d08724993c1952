package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

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
