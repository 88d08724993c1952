package memory_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

func newStore(t *testing.T, now func() time.Time) sluice.Store {
	s := memory.New(&memory.Options{Clock: now})
	t.Cleanup(func() { s.Close() })
	return s
}

func TestConformance(t *testing.T) { storetest.Run(t, newStore) }

func TestGrantConformance(t *testing.T) { storetest.RunGrant(t, newStore) }

// A zero Store refuses every decision with ErrZeroStore instead of
// panicking, and its housekeeping methods are harmless.
func TestZeroStore(t *testing.T) {
	t.Parallel()
	var s memory.Store
	ctx := context.Background()
	l := sluice.PerSecond(10)
	if _, err := s.Take(ctx, "k", l, 1); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Take: err = %v, want ErrZeroStore", err)
	}
	if _, err := s.Peek(ctx, "k", l, 1); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Peek: err = %v, want ErrZeroStore", err)
	}
	if err := s.Reset(ctx, "k", l); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Reset: err = %v, want ErrZeroStore", err)
	}
	if _, err := s.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: l, Cost: 1}}); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("TakeAll: err = %v, want ErrZeroStore", err)
	}
	if _, err := s.Take(ctx, "", l, 1); errors.Is(err, memory.ErrZeroStore) || err == nil {
		t.Errorf("Take with an empty key: err = %v, want the validation error first", err)
	}
	s.Sweep()
	if got := s.Len(); got != 0 {
		t.Errorf("Len = %d, want 0", got)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
}
