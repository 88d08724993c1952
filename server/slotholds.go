package server

import (
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// heldSlots tracks the slots acquired through this instance, until they
// are released through it, released or extended through another instance
// that says so (fleetslots.go), or reach their hold timeout: the
// dashboard's held column, and the sluice.SlotExpire events that take the
// holds released elsewhere or past their timeout out of
// sluice_inflight_held (which counts acquires and releases from their
// events). The store alone knows a fleet's holders; summed over the
// instances behind one load balancer, these figures count each slot once.
// A note from another instance that is lost leaves the slot counted here
// until its hold timeout. A grant of the open failure policy is held as
// open, and only calls and notes about an open grant touch it, and only
// those: a store holder's token marked open must not move a real slot's
// figures. Each slot is known by its holder under its policy and key
// (slotID), as the store knows it: a token naming a real holder beside
// another key frees and extends nothing in the store, and so moves
// nothing here.
type heldSlots struct {
	clock   func() time.Time
	obs     sluice.SlotObserver // told of each hold sweep drops
	mu      sync.Mutex
	holds   map[slotID]heldSlot
	sweepAt int // sweep on add when holds grows past this
}

// slotID names a slot: its holder, under its policy's key (the client's).
type slotID struct{ holder, policy, key string }

type heldSlot struct {
	priority sluice.Priority
	weight   int64
	until    time.Time
	// since is when the store last answered for it (its acquire, or an
	// extend): a Redis that started after it has lost it.
	since time.Time
	// open: granted by the open failure policy, under the token's holder
	// id; storeHolder is the id the store was asked with (its acquire may
	// have run on Redis all the same).
	open        bool
	storeHolder string
	// fallback: held in this instance's fallback store, not on Redis.
	fallback bool
}

// minSweep is the fewest tracked holds that make an add sweep.
const minSweep = 1024

func newHeldSlots(clock func() time.Time, obs sluice.SlotObserver) *heldSlots {
	return &heldSlots{clock: clock, obs: obs, holds: map[slotID]heldSlot{}, sweepAt: minSweep}
}

func (h *heldSlots) add(id slotID, s heldSlot) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holds[id] = s
	if len(h.holds) > h.sweepAt {
		h.sweep()
		h.sweepAt = max(minSweep, 2*len(h.holds))
	}
}

// extend moves id's timeout to hold after at, when the store extended
// it, and reports whether this instance counts id's slot as an open grant
// (open) or a store's.
func (h *heldSlots) extend(id slotID, open bool, at time.Time, hold time.Duration) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.holds[id]
	ok = ok && s.open == open
	if ok {
		s.until, s.since = at.Add(hold), at
		h.holds[id] = s
	}
	return ok
}

// until returns when the hold of id's store slot ends, if this instance
// counts it: as last acquired or extended through this instance, or
// extended through another that said so.
func (h *heldSlots) until(id slotID) (time.Time, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.holds[id]
	return s.until, ok && !s.open
}

// drop stops counting id's slot, released through another instance or
// found not held by the store, and reports it as a sluice.SlotExpire:
// held no more, with no release through this instance. open says which
// kind of slot the call or note is about. It reports whether this instance
// counted the slot.
func (h *heldSlots) drop(id slotID, open bool) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.holds[id]
	if !ok || s.open != open {
		return false
	}
	h.expired(id, s)
	return true
}

// expired stops counting id's slot s, reporting it as a
// sluice.SlotExpire. The caller holds h.mu.
func (h *heldSlots) expired(id slotID, s heldSlot) {
	delete(h.holds, id)
	h.obs.ObserveSlot(sluice.SlotEvent{Policy: id.policy, Op: sluice.SlotExpire, Outcome: sluice.OutcomeAllowed, Priority: s.priority, Weight: s.weight})
}

// release stops tracking id's slot of that kind (open or not) and
// returns it, weight 0 for a slot acquired through another instance, or
// swept.
func (h *heldSlots) release(id slotID, open bool) heldSlot {
	h.mu.Lock()
	defer h.mu.Unlock()
	s, ok := h.holds[id]
	if !ok || s.open != open {
		return heldSlot{}
	}
	delete(h.holds, id)
	return s
}

// lose stops counting the slots held on a Redis server whose keys written
// before before are gone (it started then, or was flushed after), as
// expired: those the store last answered for before then, on that server
// (on). Open grants and the fallback's slots were never on Redis. It
// returns how many it dropped and their weight.
func (h *heldSlots) lose(before time.Time, on func(slotID) bool) (slots int, weight int64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id, s := range h.holds {
		if !s.open && !s.fallback && s.since.Before(before) && on(id) {
			h.expired(id, s)
			slots++
			weight += s.weight
		}
	}
	return slots, weight
}

// expire drops the holds past their timeout, reporting each.
func (h *heldSlots) expire() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep()
}

// sweep drops the holds past their timeout, reporting each as a
// sluice.SlotExpire. The caller holds h.mu.
func (h *heldSlots) sweep() {
	now := h.clock()
	for id, s := range h.holds {
		if !now.Before(s.until) {
			h.expired(id, s)
		}
	}
}

// held returns the weight held, by policy.
func (h *heldSlots) held() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep()
	held := map[string]int64{}
	for id, s := range h.holds {
		held[id.policy] += s.weight
	}
	return held
}

// forget drops what is kept of policies a reload removed, reporting
// nothing: their series go with them.
func (h *heldSlots) forget(policies []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	gone := make(map[string]bool, len(policies))
	for _, p := range policies {
		gone[p] = true
	}
	for id := range h.holds {
		if gone[id.policy] {
			delete(h.holds, id)
		}
	}
}

// heldEnd is weight held until a time: [ms after a fleet report's at_ms,
// weight].
type heldEnd [2]int64

// maxHeldEnds bounds the ends a report gives per policy: beyond it they
// are rounded up to coarser steps.
const maxHeldEnds = 64

// heldEnds returns, by policy, the weight held by when its holds end, in
// ms after now rounded up (to 100 ms, or a coarser step where a policy
// has more than maxHeldEnds of them), in order. A fleet report carries
// them so that the others stop counting a slot at its hold timeout, when
// the store frees it, also once this instance has crashed and its last
// report lingers.
func (h *heldSlots) heldEnds(now time.Time) map[string][]heldEnd {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep()
	ms := map[string][]heldEnd{}
	for id, s := range h.holds {
		ms[id.policy] = append(ms[id.policy], heldEnd{max(s.until.Sub(now).Milliseconds(), 0), s.weight})
	}
	for p, all := range ms {
		for step := int64(100); ; step *= 2 {
			byEnd := map[int64]int64{}
			for _, e := range all {
				byEnd[(e[0]/step+1)*step] += e[1]
			}
			if len(byEnd) <= maxHeldEnds {
				ends := make([]heldEnd, 0, len(byEnd))
				for end, w := range byEnd {
					ends = append(ends, heldEnd{end, w})
				}
				slices.SortFunc(ends, func(a, b heldEnd) int { return int(a[0] - b[0]) })
				ms[p] = ends
				break
			}
		}
	}
	return ms
}

// heldAfter is the weight of ends still held age ms after their report.
func heldAfter(ends []heldEnd, age int64) int64 {
	var w int64
	for _, e := range ends {
		if e[0] > age {
			w += e[1]
		}
	}
	return w
}
