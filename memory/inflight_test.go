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

// A zero Store refuses slots with ErrZeroStore, after validating.
func TestInFlightZeroStore(t *testing.T) {
	t.Parallel()
	var s memory.Store
	ctx := context.Background()
	l := sluice.Concurrent(1, time.Second)
	if _, err := s.Acquire(ctx, "k", l, 1, "h"); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Acquire: err = %v, want ErrZeroStore", err)
	}
	if _, err := s.Extend(ctx, "k", l, "h"); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Extend: err = %v, want ErrZeroStore", err)
	}
	if _, err := s.Release(ctx, "k", "h"); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Release: err = %v, want ErrZeroStore", err)
	}
	if _, err := s.Acquire(ctx, "k", l, 0, "h"); !errors.Is(err, sluice.ErrInvalidWeight) {
		t.Errorf("Acquire with weight 0: err = %v, want the validation error first", err)
	}
}

// Sweep drops the holders of keys nobody touches after their holds end.
func TestInFlightSweep(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	s := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if _, err := s.Acquire(ctx, k, sluice.Concurrent(1, time.Second), 1, "h"); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Second)
	s.Sweep()
	if got := s.HeldKeys(); got != 0 {
		t.Errorf("after the holds and a sweep, %d keys hold slots, want 0", got)
	}
}
