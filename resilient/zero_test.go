package resilient_test

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/resilient"
)

// Zero values refuse every call with ErrZeroStore instead of panicking.
func TestZeroStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l := sluice.PerSecond(10)
	var s resilient.Store
	var m resilient.MultiStore
	for name, st := range map[string]sluice.Store{"Store": &s, "MultiStore": &m} {
		if _, err := st.Take(ctx, "k", l, 1); !errors.Is(err, resilient.ErrZeroStore) {
			t.Errorf("%s.Take: err = %v, want ErrZeroStore", name, err)
		}
		if _, err := st.Peek(ctx, "k", l, 1); !errors.Is(err, resilient.ErrZeroStore) {
			t.Errorf("%s.Peek: err = %v, want ErrZeroStore", name, err)
		}
		if err := st.Reset(ctx, "k", l); !errors.Is(err, resilient.ErrZeroStore) {
			t.Errorf("%s.Reset: err = %v, want ErrZeroStore", name, err)
		}
	}
	if _, err := m.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: l, Cost: 1}}); !errors.Is(err, resilient.ErrZeroStore) {
		t.Errorf("MultiStore.TakeAll: err = %v, want ErrZeroStore", err)
	}
	if got := s.State(); got != sluice.BreakerClosed {
		t.Errorf("State = %v, want closed", got)
	}
	if got := m.State(); got != sluice.BreakerClosed {
		t.Errorf("MultiStore.State = %v, want closed", got)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("MultiStore.Close = %v", err)
	}
}
