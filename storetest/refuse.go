package storetest

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
)

// Refuses checks that every decision of s fails with an error wrapping
// want: Take, Peek, Reset and, if s is a sluice.MultiStore, TakeAll. It is
// what a store that cannot decide (a zero value, a store without a
// client) must do rather than panic.
func Refuses(t *testing.T, s sluice.Store, want error) {
	t.Helper()
	ctx := context.Background()
	l := sluice.PerSecond(10)
	if _, err := s.Take(ctx, "k", l, 1); !errors.Is(err, want) {
		t.Errorf("Take: err = %v, want %v", err, want)
	}
	if _, err := s.Peek(ctx, "k", l, 1); !errors.Is(err, want) {
		t.Errorf("Peek: err = %v, want %v", err, want)
	}
	if err := s.Reset(ctx, "k", l); !errors.Is(err, want) {
		t.Errorf("Reset: err = %v, want %v", err, want)
	}
	if m, ok := s.(sluice.MultiStore); ok {
		reqs := []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 1}}
		if _, err := m.TakeAll(ctx, reqs); !errors.Is(err, want) {
			t.Errorf("TakeAll: err = %v, want %v", err, want)
		}
	}
}
