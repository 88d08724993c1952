package redisstore_test

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
)

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
