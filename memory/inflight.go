package memory

import (
	"context"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
)

var _ sluice.Slots = (*Store)(nil)

// In-flight slots, the twin of redisstore/scripts/inflight_*.lua decision
// for decision: a key's holders with their weight and hold deadline (µs);
// a holder whose deadline is at or before now has expired and is removed
// before anything is counted.

// slotKey is one key's holders. An empty one stays until swept, so that a
// busy key's acquire and release allocate nothing.
type slotKey struct {
	holders map[string]slotHolder
	inUse   int64 // the holders' total weight
}

type slotHolder struct {
	weight  int64
	expires int64 // µs; held while now < expires
}

// slotsOf returns key's holders in sh, pruned of those expired at now, or
// nil if key has no state. The caller holds sh.mu.
func (sh *shard) slotsOf(key string, now int64) *slotKey {
	k := sh.slots[key]
	if k == nil {
		return nil
	}
	for h, e := range k.holders {
		if e.expires <= now {
			delete(k.holders, h)
			k.inUse -= e.weight
		}
	}
	return k
}

// Acquire implements sluice.Slots.
func (s *Store) Acquire(_ context.Context, key string, l sluice.InFlightLimit, weight int64, holder string) (sluice.SlotDecision, error) {
	if err := sluice.ValidateSlot(key, l, weight, holder); err != nil {
		return sluice.SlotDecision{}, err
	}
	if s.shards == nil {
		return sluice.SlotDecision{}, ErrZeroStore
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	hold := l.Hold.Microseconds()
	k := sh.slotsOf(key, now)
	d := sluice.SlotDecision{Limit: l}
	switch {
	case k != nil && k.holders[holder].weight > 0: // a resent acquire
		k.holders[holder] = slotHolder{weight: k.holders[holder].weight, expires: now + hold}
		d.Allowed = true
	case k == nil || k.inUse+weight <= l.Max:
		if k == nil {
			if sh.slots == nil {
				sh.slots = make(map[string]*slotKey)
			}
			k = &slotKey{holders: make(map[string]slotHolder, 1)}
			sh.slots[key] = k
		}
		k.holders[holder] = slotHolder{weight: weight, expires: now + hold}
		k.inUse += weight
		d.Allowed = true
	default:
		d.RetryAfter = time.Duration(retryEstimate(k, k.inUse+weight-l.Max)-now) * time.Microsecond
	}
	if k != nil {
		d.InUse = k.inUse
	}
	d.Remaining = max(l.Max-d.InUse, 0)
	return d, nil
}

// retryEstimate returns the deadline at which the holders expiring first
// have freed need weight: the denial's estimate.
func retryEstimate(k *slotKey, need int64) int64 {
	hs := make([]slotHolder, 0, len(k.holders))
	for _, h := range k.holders {
		hs = append(hs, h)
	}
	slices.SortFunc(hs, func(a, b slotHolder) int { return int(min(max(a.expires-b.expires, -1), 1)) })
	var freed int64
	for _, h := range hs {
		if freed += h.weight; freed >= need {
			return h.expires
		}
	}
	return hs[len(hs)-1].expires // unreachable: need ≤ inUse
}

// Extend implements sluice.Slots.
func (s *Store) Extend(_ context.Context, key string, l sluice.InFlightLimit, holder string) (bool, error) {
	return s.onHolder(key, l, holder, func(k *slotKey, h slotHolder, now int64) {
		h.expires = now + l.Hold.Microseconds()
		k.holders[holder] = h
	})
}

// Release implements sluice.Slots.
func (s *Store) Release(_ context.Context, key string, holder string) (bool, error) {
	return s.onHolder(key, sluice.InFlightLimit{Max: 1, Hold: time.Microsecond}, holder, func(k *slotKey, h slotHolder, _ int64) {
		delete(k.holders, holder)
		k.inUse -= h.weight
	})
}

// onHolder validates, finds holder's live slot under key and applies f to
// it, reporting whether there was one.
func (s *Store) onHolder(key string, l sluice.InFlightLimit, holder string, f func(k *slotKey, h slotHolder, now int64)) (bool, error) {
	if err := sluice.ValidateSlot(key, l, 1, holder); err != nil {
		return false, err
	}
	if s.shards == nil {
		return false, ErrZeroStore
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	k := sh.slotsOf(key, now)
	if k == nil {
		return false, nil
	}
	h, ok := k.holders[holder]
	if !ok {
		return false, nil
	}
	f(k, h, now)
	return true, nil
}

// sweepSlots removes sh's expired holders, and keys left without any. The
// caller holds sh.mu.
func (sh *shard) sweepSlots(now int64) {
	for key := range sh.slots {
		if k := sh.slotsOf(key, now); len(k.holders) == 0 {
			delete(sh.slots, key)
		}
	}
}

// HeldKeys returns the number of keys with in-flight state: holders,
// expired or not, or none since the last sweep.
func (s *Store) HeldKeys() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += len(sh.slots)
		sh.mu.Unlock()
	}
	return n
}
