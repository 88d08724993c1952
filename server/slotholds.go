package server

import (
	"sync"
	"time"
)

// heldSlots tracks the slots acquired through this instance, until they
// are released through it or reach their hold timeout: the figures behind
// sluice_inflight_held and the dashboard's held column. The store alone
// knows a fleet's holders; summed over the instances behind one load
// balancer, these figures count each slot once while its extends and
// release reach the instance that acquired it. A slot released through
// another instance stays counted here until its hold timeout.
type heldSlots struct {
	clock   func() time.Time
	mu      sync.Mutex
	holds   map[string]heldSlot // by holder id
	sweepAt int                 // sweep on add when holds grows past this
}

type heldSlot struct {
	policy string
	weight int64
	until  time.Time
}

// minSweep is the fewest tracked holds that make an add sweep.
const minSweep = 1024

func newHeldSlots(clock func() time.Time) *heldSlots {
	return &heldSlots{clock: clock, holds: map[string]heldSlot{}, sweepAt: minSweep}
}

func (h *heldSlots) add(holder, policy string, weight int64, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.holds[holder] = heldSlot{policy: policy, weight: weight, until: until}
	if len(h.holds) > h.sweepAt {
		h.sweep()
		h.sweepAt = max(minSweep, 2*len(h.holds))
	}
}

func (h *heldSlots) extend(holder string, until time.Time) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if s, ok := h.holds[holder]; ok {
		s.until = until
		h.holds[holder] = s
	}
}

func (h *heldSlots) release(holder string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.holds, holder)
}

// sweep drops the holds past their timeout. The caller holds h.mu.
func (h *heldSlots) sweep() {
	now := h.clock()
	for id, s := range h.holds {
		if !now.Before(s.until) {
			delete(h.holds, id)
		}
	}
}

// held returns the weight held, by policy.
func (h *heldSlots) held() map[string]int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sweep()
	held := map[string]int64{}
	for _, s := range h.holds {
		held[s.policy] += s.weight
	}
	return held
}

// forget drops what is kept of policies a reload removed.
func (h *heldSlots) forget(policies []string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	gone := make(map[string]bool, len(policies))
	for _, p := range policies {
		gone[p] = true
	}
	for id, s := range h.holds {
		if gone[s.policy] {
			delete(h.holds, id)
		}
	}
}
