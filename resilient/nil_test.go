package resilient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// zeroStore is what a zero Store and MultiStore answer for.
type zeroStore interface {
	sluice.Store
	sluice.Slots
	sluice.Granter
	CheckLimit(sluice.Limit) error
	TakeByPolicy(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error)
	AbandonSlot(key, holder string)
	State() sluice.BreakerState
	Probe(context.Context) (bool, error)
	ProbeNow(context.Context) error
	Close() error
}

// A nil *Store behaves as a zero Store: every call is refused with
// ErrZeroStore (or does nothing), and none panics; so do a zero
// MultiStore and a nil *MultiStore (which panicked).
func TestNilStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limit := sluice.PerSecond(10)
	slot := sluice.InFlightLimit{Max: 1, Hold: time.Second}
	for _, tc := range []struct {
		name string
		s    zeroStore
	}{{"nil", (*Store)(nil)}, {"zero", &Store{}}, {"zero MultiStore's Store", (&MultiStore{}).Store},
		{"zero MultiStore", &MultiStore{}}, {"nil MultiStore", (*MultiStore)(nil)}} {
		s := tc.s
		if _, err := s.Take(ctx, "k", limit, 1); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Take err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.TakeByPolicy(ctx, "k", limit, 1); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: TakeByPolicy err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Peek(ctx, "k", limit, 1); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Peek err = %v, want ErrZeroStore", tc.name, err)
		}
		if err := s.Reset(ctx, "k", limit); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Reset err = %v, want ErrZeroStore", tc.name, err)
		}
		if err := s.CheckLimit(limit); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: CheckLimit err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Grant(ctx, "k", limit, 1); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Grant err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Return(ctx, "k", limit, sluice.Grant{Granted: 1}, 1); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Return err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Acquire(ctx, "k", slot, 1, "h"); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Acquire err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Extend(ctx, "k", slot, "h"); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Extend err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Release(ctx, "k", "h"); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Release err = %v, want ErrZeroStore", tc.name, err)
		}
		s.AbandonSlot("k", "h")
		sluice.ReleaseAbandoned(s, "k", "h")
		if st := s.State(); st != sluice.BreakerClosed {
			t.Errorf("%s: State = %v, want closed", tc.name, st)
		}
		if sent, err := s.Probe(ctx); sent || err != nil {
			t.Errorf("%s: Probe = %v, %v; want nothing sent", tc.name, sent, err)
		}
		if err := s.ProbeNow(ctx); err != nil {
			t.Errorf("%s: ProbeNow err = %v", tc.name, err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("%s: Close err = %v", tc.name, err)
		}
		if _, err := sluice.NewLimiter(s, limit, nil); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: NewLimiter err = %v, want ErrZeroStore", tc.name, err)
		}
	}
	for _, m := range []*MultiStore{{}, nil} {
		if _, err := m.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: limit, Cost: 1}}); !errors.Is(err, ErrZeroStore) {
			t.Errorf("MultiStore %v: TakeAll err = %v, want ErrZeroStore", m, err)
		}
		if _, err := m.TakeAll(ctx, []sluice.Request{{Key: "", Limit: limit, Cost: 1}}); !errors.Is(err, sluice.ErrInvalidKey) {
			t.Errorf("MultiStore %v: TakeAll of an empty key: err = %v, want ErrInvalidKey", m, err)
		}
	}
}
