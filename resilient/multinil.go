package resilient

import (
	"context"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// A nil *MultiStore answers every call as a zero one does (ErrZeroStore,
// or nothing), as a nil *Store does: the methods it would otherwise
// promote from its *Store dereference the nil pointer to find it.

// store returns m's Store, nil for a nil or zero m.
func (m *MultiStore) store() *Store {
	if m == nil {
		return nil
	}
	return m.Store
}

// Take is Store.Take.
func (m *MultiStore) Take(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	return m.store().Take(ctx, key, limit, cost)
}

// TakeByPolicy is Store.TakeByPolicy.
func (m *MultiStore) TakeByPolicy(ctx context.Context, key string, limit sluice.Limit, cost int64, cause error) (sluice.Decision, error) {
	return m.store().TakeByPolicy(ctx, key, limit, cost, cause)
}

// TakeAllByPolicy is Store.TakeAllByPolicy.
func (m *MultiStore) TakeAllByPolicy(ctx context.Context, reqs []sluice.Request, cause error) ([]sluice.Decision, error) {
	return m.store().TakeAllByPolicy(ctx, reqs, cause)
}

// PeekByPolicy is Store.PeekByPolicy.
func (m *MultiStore) PeekByPolicy(ctx context.Context, key string, limit sluice.Limit, cost int64, cause error) (sluice.Decision, error) {
	return m.store().PeekByPolicy(ctx, key, limit, cost, cause)
}

// Peek is Store.Peek.
func (m *MultiStore) Peek(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	return m.store().Peek(ctx, key, limit, cost)
}

// Reset is Store.Reset.
func (m *MultiStore) Reset(ctx context.Context, key string, limit sluice.Limit) error {
	return m.store().Reset(ctx, key, limit)
}

// CheckLimit is Store.CheckLimit.
func (m *MultiStore) CheckLimit(limit sluice.Limit) error { return m.store().CheckLimit(limit) }

// Grant is Store.Grant.
func (m *MultiStore) Grant(ctx context.Context, key string, limit sluice.Limit, n int64) (sluice.Grant, error) {
	return m.store().Grant(ctx, key, limit, n)
}

// Return is Store.Return.
func (m *MultiStore) Return(ctx context.Context, key string, limit sluice.Limit, grant sluice.Grant, unused int64) (int64, error) {
	return m.store().Return(ctx, key, limit, grant, unused)
}

// Regrant is Store.Regrant.
func (m *MultiStore) Regrant(ctx context.Context, key string, limit sluice.Limit, grant sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	return m.store().Regrant(ctx, key, limit, grant, unused, n)
}

// Acquire is Store.Acquire.
func (m *MultiStore) Acquire(ctx context.Context, key string, l sluice.InFlightLimit, weight int64, holder string) (sluice.SlotDecision, error) {
	return m.store().Acquire(ctx, key, l, weight, holder)
}

// Extend is Store.Extend.
func (m *MultiStore) Extend(ctx context.Context, key string, l sluice.InFlightLimit, holder string) (bool, error) {
	return m.store().Extend(ctx, key, l, holder)
}

// Release is Store.Release.
func (m *MultiStore) Release(ctx context.Context, key string, holder string) (bool, error) {
	return m.store().Release(ctx, key, holder)
}

// ReleaseOnce is Store.ReleaseOnce.
func (m *MultiStore) ReleaseOnce(ctx context.Context, key, holder string, remember time.Duration) (released, before bool, err error) {
	return m.store().ReleaseOnce(ctx, key, holder, remember)
}

// AbandonSlot is Store.AbandonSlot.
func (m *MultiStore) AbandonSlot(key, holder string) { m.store().AbandonSlot(key, holder) }

// TryAbandonSlot is Store.TryAbandonSlot.
func (m *MultiStore) TryAbandonSlot(key, holder string) error {
	return m.store().TryAbandonSlot(key, holder)
}

// State is Store.State.
func (m *MultiStore) State() sluice.BreakerState { return m.store().State() }

// Probe is Store.Probe.
func (m *MultiStore) Probe(ctx context.Context) (bool, error) { return m.store().Probe(ctx) }

// ProbeNow is Store.ProbeNow.
func (m *MultiStore) ProbeNow(ctx context.Context) error { return m.store().ProbeNow(ctx) }

// Close is Store.Close.
func (m *MultiStore) Close() error { return m.store().Close() }

// Breakers is Store.Breakers.
func (m *MultiStore) Breakers() []BreakerStatus { return m.store().Breakers() }

// FallbackEvictions is Store.FallbackEvictions.
func (m *MultiStore) FallbackEvictions() (evicted memory.Evictions, evicting bool) {
	return m.store().FallbackEvictions()
}
