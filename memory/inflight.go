package memory

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
)

var _ sluice.Slots = (*Store)(nil)

// reclaimSample is how many of a full shard's in-flight keys Acquire looks
// at for one without live holders before refusing with ErrFull.
const reclaimSample = 8

// In-flight slots, the twin of redisstore/scripts/inflight_*.lua decision
// for decision: a key's holders with their weight and hold deadline (µs);
// a holder whose deadline is at or before now has expired. Only Acquire
// removes expired holders, and reports their weight; Extend and Release
// take an expired holder for gone and leave it. A release that finds no
// live holder leaves a tombstone of its id, which refuses that id's next
// acquire while it lives (inflight_release.lua says why).

// slotKey is one key's holders. An empty one stays until swept, so that a
// busy key's acquire and release allocate nothing.
type slotKey struct {
	holders map[string]slotHolder
	inUse   int64 // the holders' total weight, expired ones included
	// next is at or before the earliest deadline: no holder has expired
	// before it, so a busy key is not scanned on every acquire.
	next int64
	// released are the releases ReleaseOnce remembers: holder → µs until
	// which it is remembered. In the key's own state, as Redis keeps them
	// in the key's hash slot, so that they cost no key of MaxKeys.
	released map[string]int64
	// forgetAt is the size of released at which the releases no longer
	// remembered are next dropped.
	forgetAt int
	// tombs are the tombstones: holder → µs until which its acquire is
	// refused. Ended ones are dropped when more than tombMax are kept,
	// and by the sweep; live ones beyond tombMax, the one ending first.
	tombs map[string]int64
}

// tombMax bounds the live tombstones of a key, as TOMBS in
// inflight_release.lua.
const tombMax = 1024

type slotHolder struct {
	weight  int64
	expires int64 // µs; held while now < expires
}

// prune removes k's holders expired at now and returns their weight.
func (k *slotKey) prune(now int64) int64 {
	if now < k.next {
		return 0
	}
	var gone int64
	k.next = math.MaxInt64
	for h, e := range k.holders {
		if e.expires <= now {
			delete(k.holders, h)
			gone += e.weight
		} else {
			k.next = min(k.next, e.expires)
		}
	}
	k.inUse -= gone
	return gone
}

// set records holder's slot, keeping next at or before its deadline.
func (k *slotKey) set(holder string, h slotHolder) {
	k.holders[holder] = h
	k.next = min(k.next, h.expires)
}

// live returns holder's slot if it holds at now; a nil k holds none.
func (k *slotKey) live(holder string, now int64) (slotHolder, bool) {
	if k == nil {
		return slotHolder{}, false
	}
	h, ok := k.holders[holder]
	return h, ok && now < h.expires
}

// Acquire implements sluice.Slots.
func (s *Store) Acquire(ctx context.Context, key string, l sluice.InFlightLimit, weight int64, holder string) (sluice.SlotDecision, error) {
	if err := ctxErr(ctx); err != nil {
		return sluice.SlotDecision{}, err
	}
	if err := sluice.ValidateSlot(key, l, weight, holder); err != nil {
		return sluice.SlotDecision{}, err
	}
	if s.zero() {
		return sluice.SlotDecision{}, s.unbuilt()
	}
	s.tombLife.Cover(l.Hold)
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	expires := now + l.Hold.Microseconds()
	d := sluice.SlotDecision{Limit: l}
	k := sh.slots[key]
	if k == nil {
		var err error
		if k, err = sh.addSlotKey(key, now); err != nil {
			return d, err
		}
	}
	d.Expired = k.prune(now)
	end, buried := k.tombs[holder]
	if buried { // found once, live or not
		delete(k.tombs, holder)
	}
	switch h, held := k.holders[holder]; {
	case buried && now < end:
		// Released before this acquire came: refused, as nobody would
		// release it.
	case held: // a resent acquire
		k.set(holder, slotHolder{weight: h.weight, expires: expires})
		d.Allowed = true
	case k.inUse+weight <= l.Max:
		k.set(holder, slotHolder{weight: weight, expires: expires})
		k.inUse += weight
		d.Allowed = true
	default:
		d.RetryAfter = time.Duration(retryEstimate(k, k.inUse+weight-l.Max)-now) * time.Microsecond
	}
	d.InUse = k.inUse
	d.Remaining = max(l.Max-d.InUse, 0)
	return d, nil
}

// addSlotKey adds an empty slotKey for key, first dropping one without
// live holders if the shard holds MaxKeys in-flight keys. The caller holds
// sh.mu.
func (sh *shard) addSlotKey(key string, now int64) (*slotKey, error) {
	if sh.slots == nil {
		sh.slots = make(map[string]*slotKey)
	}
	if len(sh.slots) >= sh.maxKeys && !sh.reclaimSlotKey(now) {
		return nil, fmt.Errorf("%w: %d keys with in-flight holders in the shard of %q (Options.MaxKeys)", ErrFull, len(sh.slots), key)
	}
	k := &slotKey{holders: make(map[string]slotHolder, 1), next: math.MaxInt64}
	sh.slots[key] = k
	return k, nil
}

// reclaimSlotKey drops one key without live holders among a sample of
// sh's in-flight keys (map iteration starts at a random place), reporting
// whether it found one. Releases it remembers go with it: a slot in use
// is worth more than the answer to a repeated release.
func (sh *shard) reclaimSlotKey(now int64) bool {
	seen := 0
	for key, k := range sh.slots {
		if k.prune(now); len(k.holders) == 0 {
			delete(sh.slots, key)
			return true
		}
		if seen++; seen >= reclaimSample {
			break
		}
	}
	return false
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
func (s *Store) Extend(ctx context.Context, key string, l sluice.InFlightLimit, holder string) (bool, error) {
	if err := ctxErr(ctx); err != nil {
		return false, err
	}
	if sluice.ValidateSlot(key, l, 1, holder) == nil && !s.zero() {
		s.tombLife.Cover(l.Hold)
	}
	return s.onHolder(key, l, holder, func(k *slotKey, h slotHolder, now int64) {
		h.expires = now + l.Hold.Microseconds()
		k.set(holder, h)
	})
}

// Release implements sluice.Slots. A release that finds no live holder
// leaves a tombstone of holder until now plus the longest hold the Store
// has acquired or extended with (none before any): see bury.
func (s *Store) Release(ctx context.Context, key string, holder string) (bool, error) {
	if err := ctxErr(ctx); err != nil {
		return false, err
	}
	held := false
	life := s.tombstoneLife()
	err := s.atKey(key, sluice.InFlightLimit{Max: 1, Hold: time.Microsecond}, holder, func(sh *shard, k *slotKey, now int64) {
		if k != nil {
			if h, ok := k.live(holder, now); ok {
				delete(k.holders, holder)
				k.inUse -= h.weight
				held = true
				return
			}
		}
		sh.bury(key, k, holder, now, life)
	})
	return held, err
}

// bury leaves a tombstone of holder in key's state (k, nil if it has none)
// until now+life, so that holder's acquire, should it come later (it
// timed out, and this is its abandoned release), is refused rather than
// held for a hold nobody ends. Beyond tombMax live tombstones the one
// ending first goes (of two, the lesser id), as in Redis. No tombstone
// when life is 0, nor when the shard is at MaxKeys without one to spare.
// The caller holds sh.mu.
func (sh *shard) bury(key string, k *slotKey, holder string, now, life int64) {
	if life <= 0 {
		return
	}
	if k == nil {
		var err error
		if k, err = sh.addSlotKey(key, now); err != nil {
			return
		}
	}
	if k.tombs == nil {
		k.tombs = make(map[string]int64, 1)
	}
	k.tombs[holder] = now + life
	if len(k.tombs) > tombMax {
		k.buried(now)
	}
	if len(k.tombs) <= tombMax {
		return
	}
	first, end := "", int64(math.MaxInt64)
	for h, e := range k.tombs {
		if e < end || e == end && h < first {
			first, end = h, e
		}
	}
	delete(k.tombs, first)
}

// buried drops the tombstones ended at now, reporting whether any are
// left.
func (k *slotKey) buried(now int64) bool {
	for h, end := range k.tombs {
		if end <= now {
			delete(k.tombs, h)
		}
	}
	return len(k.tombs) > 0
}

// tombstoneLife returns how long a tombstone lives, µs: the longest hold
// the Store's acquires and extends have asked for, so that it outlives
// the hold of any acquire the Store may have abandoned (0, no tombstone,
// on a zero Store or before any).
func (s *Store) tombstoneLife() int64 {
	if s.zero() {
		return 0
	}
	return s.tombLife.Micros()
}

// ReleaseOnce is Release that also remembers, for remember, a release
// that freed holder's slot, under the same lock, as
// redisstore.Store.ReleaseOnce does in one script: sent again within
// remember (its first answer lost), it reports the slot released before
// rather than not held, and remembers it again from now. released is
// false when holder held no slot and no release of it is remembered. A
// key without live holders keeps its remembered releases until they end,
// but may go, and they with it, when its shard is at MaxKeys.
func (s *Store) ReleaseOnce(ctx context.Context, key, holder string, remember time.Duration) (released, before bool, err error) {
	if err := ctxErr(ctx); err != nil {
		return false, false, err
	}
	life := s.tombstoneLife()
	err = s.atKey(key, sluice.Concurrent(1, remember), holder, func(sh *shard, k *slotKey, now int64) {
		if h, ok := k.live(holder, now); ok {
			delete(k.holders, holder)
			k.inUse -= h.weight
		} else {
			sh.bury(key, k, holder, now, life)
			if k = sh.slots[key]; k == nil {
				return
			}
			if until, ok := k.released[holder]; !ok || now >= until {
				return
			}
			before = true
		}
		released = true
		k.remember(holder, now+remember.Microseconds(), now)
	})
	return released, before, err
}

// remember records holder's release until until, dropping the releases
// forgotten at now once released has doubled since the last time, so
// that a release costs amortised O(1).
func (k *slotKey) remember(holder string, until, now int64) {
	if k.released == nil {
		k.released = make(map[string]int64, 1)
	}
	k.released[holder] = until
	if len(k.released) >= k.forgetAt {
		k.forget(now)
		k.forgetAt = max(2*len(k.released), 8)
	}
}

// forget drops the releases no longer remembered at now, reporting
// whether any are left.
func (k *slotKey) forget(now int64) bool {
	for h, until := range k.released {
		if until <= now {
			delete(k.released, h)
		}
	}
	return len(k.released) > 0
}

// onHolder validates, finds holder's live slot under key and applies f to
// it, reporting whether there was one.
func (s *Store) onHolder(key string, l sluice.InFlightLimit, holder string, f func(k *slotKey, h slotHolder, now int64)) (bool, error) {
	held := false
	err := s.atKey(key, l, holder, func(_ *shard, k *slotKey, now int64) {
		if h, ok := k.live(holder, now); ok {
			f(k, h, now)
			held = true
		}
	})
	return held, err
}

// atKey runs f on key's in-flight state (nil if it has none) under its
// shard's lock, after the checks every call about one holder makes.
func (s *Store) atKey(key string, l sluice.InFlightLimit, holder string, f func(sh *shard, k *slotKey, now int64)) error {
	if err := sluice.ValidateSlot(key, l, 1, holder); err != nil {
		return err
	}
	if s.zero() {
		return s.unbuilt()
	}
	sh := s.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	f(sh, sh.slots[key], s.now())
	return nil
}

// sweepSlots removes sh's expired holders and forgotten releases, and keys
// left without either, a chunk at a time (h). The caller holds sh.mu.
// Between chunks the map may change: a key added then may or may not be
// met, one deleted is not (the language's rule for a range loop).
func (sh *shard) sweepSlots(now int64, h *sweepHold) {
	for key, k := range sh.slots {
		k.prune(now)
		kept := k.buried(now)
		if len(k.holders) == 0 && !k.forget(now) && !kept {
			delete(sh.slots, key)
		}
		h.walked(1)
	}
}

// HeldKeys returns the number of keys with in-flight state: holders,
// expired or not, or none since the last sweep.
func (s *Store) HeldKeys() int {
	return s.sum(func(sh *shard) int { return len(sh.slots) })
}
