package lease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

// A nil *Store behaves as a zero Store: every call is refused with
// ErrNoGranter (or reports nothing), and none panics.
func TestNilStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limit := sluice.PerSecond(10)
	slot := sluice.InFlightLimit{Max: 1, Hold: time.Second}
	for _, tc := range []struct {
		name string
		s    *lease.Store
	}{{"nil", nil}, {"zero", &lease.Store{}}} {
		s := tc.s
		if _, err := s.Take(ctx, "k", limit, 1); !errors.Is(err, lease.ErrNoGranter) {
			t.Errorf("%s: Take err = %v, want ErrNoGranter", tc.name, err)
		}
		if _, err := s.Peek(ctx, "k", limit, 1); !errors.Is(err, lease.ErrNoGranter) {
			t.Errorf("%s: Peek err = %v, want ErrNoGranter", tc.name, err)
		}
		if _, err := s.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: limit, Cost: 1}}); !errors.Is(err, lease.ErrNoGranter) {
			t.Errorf("%s: TakeAll err = %v, want ErrNoGranter", tc.name, err)
		}
		if err := s.Reset(ctx, "k", limit); !errors.Is(err, lease.ErrNoGranter) {
			t.Errorf("%s: Reset err = %v, want ErrNoGranter", tc.name, err)
		}
		if err := s.CheckLimit(limit); !errors.Is(err, lease.ErrNoGranter) {
			t.Errorf("%s: CheckLimit err = %v, want ErrNoGranter", tc.name, err)
		}
		if _, err := s.Acquire(ctx, "k", slot, 1, "h"); !errors.Is(err, lease.ErrNoGranter) {
			t.Errorf("%s: Acquire err = %v, want ErrNoGranter", tc.name, err)
		}
		if _, err := s.Extend(ctx, "k", slot, "h"); !errors.Is(err, lease.ErrNoGranter) {
			t.Errorf("%s: Extend err = %v, want ErrNoGranter", tc.name, err)
		}
		if _, err := s.Release(ctx, "k", "h"); !errors.Is(err, lease.ErrNoGranter) {
			t.Errorf("%s: Release err = %v, want ErrNoGranter", tc.name, err)
		}
		s.AbandonSlot("k", "h")
		sluice.ReleaseAbandoned(s, "k", "h")
		if st := s.Stats(); st != (lease.Stats{}) {
			t.Errorf("%s: Stats = %+v, want zeros", tc.name, st)
		}
		if n := s.Len(); n != 0 {
			t.Errorf("%s: Len = %d, want 0", tc.name, n)
		}
		if err := s.Close(ctx); err != nil {
			t.Errorf("%s: Close err = %v, want nil", tc.name, err)
		}
		if _, err := sluice.NewLimiter(s, limit, nil); !errors.Is(err, lease.ErrNoGranter) {
			t.Errorf("%s: NewLimiter err = %v, want ErrNoGranter", tc.name, err)
		}
	}
}

// New refuses a granter that was never built (a nil pointer, a zero
// memory or Redis store) with ErrNoGranter: it used to be accepted, and
// every refill then failed.
func TestNewRefusesUnbuiltGranter(t *testing.T) {
	t.Parallel()
	opts := &lease.Options{MaxStaleness: time.Millisecond}
	for name, g := range map[string]sluice.Granter{
		"nil *memory.Store":     (*memory.Store)(nil),
		"zero memory.Store":     &memory.Store{},
		"zero redisstore.Store": &redisstore.Store{},
	} {
		if s, err := lease.New(g, opts); !errors.Is(err, lease.ErrNoGranter) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("New(%s): %v, %v; want ErrNoGranter", name, s, err)
		}
	}
	m := memory.New(nil)
	t.Cleanup(func() { m.Close() })
	s, err := lease.New(m, opts)
	if err != nil {
		t.Fatalf("New(built memory store): %v", err)
	}
	s.Close(context.Background())
}
