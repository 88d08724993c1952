package lease

import (
	"context"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ctxutil"
)

// In-flight slots are never leased: a slot can free at any instant, so no
// part of a key's slots can be spent locally without the fleet's bound
// going. A Store passes them through to its granter, so that one store
// serves a middleware's leased rate rules and its in-flight rules alike.

// Acquire implements sluice.Slots: the granter's Acquire, or ErrNoSlots.
func (s *Store) Acquire(ctx context.Context, key string, l sluice.InFlightLimit, weight int64, holder string) (sluice.SlotDecision, error) {
	ctx = ctxutil.OrBackground(ctx)
	st, err := s.slots()
	if err != nil {
		return sluice.SlotDecision{}, err
	}
	return st.Acquire(ctx, key, l, weight, holder)
}

// Extend implements sluice.Slots: the granter's Extend, or ErrNoSlots.
func (s *Store) Extend(ctx context.Context, key string, l sluice.InFlightLimit, holder string) (bool, error) {
	ctx = ctxutil.OrBackground(ctx)
	st, err := s.slots()
	if err != nil {
		return false, err
	}
	return st.Extend(ctx, key, l, holder)
}

// Release implements sluice.Slots: the granter's Release, or ErrNoSlots.
func (s *Store) Release(ctx context.Context, key string, holder string) (bool, error) {
	ctx = ctxutil.OrBackground(ctx)
	st, err := s.slots()
	if err != nil {
		return false, err
	}
	return st.Release(ctx, key, holder)
}

// AbandonSlot hands an abandoned holder's release to the granter
// (sluice.ReleaseAbandoned), so that a failure policy under the leases
// sends it past its breaker as it would without them.
func (s *Store) AbandonSlot(key, holder string) {
	_ = s.TryAbandonSlot(key, holder)
}

// TryAbandonSlot is AbandonSlot that reports a release it could not start
// (sluice.TryReleaseAbandoned: sluice.ErrRetriesFull), so that the caller
// counts it; ErrNoGranter or ErrNoSlots when there is no granter's slots.
func (s *Store) TryAbandonSlot(key, holder string) error {
	st, err := s.slots()
	if err != nil {
		return err
	}
	return sluice.TryReleaseAbandoned(st, key, holder)
}

func (s *Store) slots() (sluice.Slots, error) {
	if s == nil || s.granter == nil {
		return nil, ErrNoGranter
	}
	st, ok := s.granter.(sluice.Slots)
	if !ok {
		return nil, ErrNoSlots
	}
	return st, nil
}
