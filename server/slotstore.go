package server

import (
	"context"
	"time"

	"github.com/sluicehq/sluice"
)

var _ sluice.Slots = budgetStore{}

// A budgetStore bounds in-flight slot calls as it bounds takes: a stalled
// Redis costs an acquire, extend or release at most the decision timeout,
// then the caller gets 503.

func (s budgetStore) Acquire(ctx context.Context, key string, l sluice.InFlightLimit, weight int64, holder string) (sluice.SlotDecision, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.Store.Acquire(ctx, key, l, weight, holder)
}

func (s budgetStore) Extend(ctx context.Context, key string, l sluice.InFlightLimit, holder string) (bool, error) {
	return boundedBool(s, ctx, func(ctx context.Context) (bool, error) { return s.Store.Extend(ctx, key, l, holder) })
}

func (s budgetStore) Release(ctx context.Context, key string, holder string) (bool, error) {
	return boundedBool(s, ctx, func(ctx context.Context) (bool, error) { return s.Store.Release(ctx, key, holder) })
}

func (s budgetStore) ReleaseOnce(ctx context.Context, key, holder string, remember time.Duration) (bool, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.Store.ReleaseOnce(ctx, key, holder, remember)
}

func boundedBool(s budgetStore, ctx context.Context, f func(context.Context) (bool, error)) (bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return f(ctx)
}
