package enforce

import (
	"container/heap"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// keeper is the one timer of a SlotRules' held requests: it starts each
// request's rounds of extends when due, and reports each observed slot's
// expiry when its hold passes unreleased and unextended. One timer and a
// heap for all, rather than two timers per request: a request that is
// held costs no timer, and one that ends sooner than a third of its hold
// costs a push and a remove.
type keeper struct {
	mu    sync.Mutex
	heap  heldHeap
	timer *time.Timer  // nil until first armed
	armed int64        // when timer fires (holdEnv.now); 0: not armed
	now   func() int64 // holdEnv.now
}

// schedule puts h in the heap at its next due time, or takes it out when
// nothing of it is due any more. Call it with k.mu held.
func (k *keeper) schedule(h *Held) {
	at, ok := h.due()
	switch {
	case !ok && h.index > 0:
		heap.Remove(&k.heap, h.index-1)
	case !ok:
	case h.index > 0:
		h.at = at
		heap.Fix(&k.heap, h.index-1)
	default:
		h.at = at
		heap.Push(&k.heap, h)
	}
	k.arm()
}

// arm sets the timer to the heap's earliest due time if it would fire
// later (or not at all); firing early only costs an empty fire.
func (k *keeper) arm() {
	if len(k.heap) == 0 {
		return
	}
	at := k.heap[0].at
	if k.armed != 0 && k.armed <= at {
		return
	}
	k.armed = at
	d := time.Duration(at - k.now())
	if k.timer == nil {
		k.timer = time.AfterFunc(d, k.fire)
	} else {
		k.timer.Reset(d)
	}
}

// fire reports the expiries due and starts the rounds of extends due,
// each on a goroutine of its own (a store call may take up to
// releaseTimeout).
func (k *keeper) fire() {
	type expiry struct {
		h  *Held
		sh *slotHold
	}
	var (
		rounds  []*Held
		expired []expiry
	)
	k.mu.Lock()
	k.armed = 0
	now := k.now()
	for len(k.heap) > 0 && k.heap[0].at <= now {
		h := k.heap[0]
		for _, sh := range h.holds {
			if sh.state != nil && sh.until.Load() <= now && sh.state.CompareAndSwap(0, 2) {
				expired = append(expired, expiry{h, sh})
			}
		}
		if !h.done.Load() && !h.extending && h.next <= now {
			h.extending = true
			rounds = append(rounds, h)
		}
		k.schedule(h) // moves it down, or out
	}
	k.arm()
	k.mu.Unlock()
	for _, e := range expired {
		e.h.env.observe(e.sh.name, sluice.SlotExpire, sluice.OutcomeAllowed, e.h.priority, e.sh.weight)
	}
	for _, h := range rounds {
		go h.extend()
	}
}

// due is when the keeper looks at h next: its next round of extends
// (unless released, or one runs), or the earliest hold to pass of a slot
// whose expiry is observed and not yet reported. ok is false when nothing
// of h is due.
func (h *Held) due() (at int64, ok bool) {
	if !h.done.Load() && !h.extending {
		at, ok = h.next, true
	}
	for _, sh := range h.holds {
		if sh.state != nil && sh.state.Load() == 0 {
			if u := sh.until.Load(); !ok || u < at {
				at, ok = u, true
			}
		}
	}
	return at, ok
}

// heldHeap orders held requests by due time (container/heap).
type heldHeap []*Held

func (q heldHeap) Len() int           { return len(q) }
func (q heldHeap) Less(i, j int) bool { return q[i].at < q[j].at }
func (q heldHeap) Swap(i, j int) {
	q[i], q[j] = q[j], q[i]
	q[i].index, q[j].index = i+1, j+1
}

func (q *heldHeap) Push(x any) {
	h := x.(*Held)
	h.index = len(*q) + 1
	*q = append(*q, h)
}

func (q *heldHeap) Pop() any {
	old := *q
	h := old[len(old)-1]
	old[len(old)-1] = nil
	h.index = 0
	*q = old[:len(old)-1]
	return h
}
