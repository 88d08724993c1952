// Package line queues the waiters of one process on one store key and
// limit (Limiter.WaitN, the Delay strategy), first come first served, so
// that a waiter can tell at once how long it would wait: each one sleeping
// on its own Retry-After, with no order among them, lets all of them sleep
// and then all but one be refused.
//
// Only the line's head asks the store; the others wait their turn. A
// request that finds a line joins its end without taking first (Look,
// Snapshot.Join): taking first, it would take the unit the head waits for
// whenever one came back as it arrived, and the head would be held to its
// deadline and refused. The store still decides every admission: the line
// only orders this process's waiters and refuses those it cannot serve in
// time. Takes from other processes, from requests of this one that do not
// wait, and from those that took just as the line formed, are not in the
// line, so a waiter can still be refused at its deadline after all.
package line

import (
	"hash/maphash"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
)

// Wake is how long after its units come back a waiter may take to ask for
// them, besides the store's round trip as last measured: a timer's
// lateness and a slower round trip on a loaded host or a busy Redis (10ms
// let 3 waiters in 82 be held to their deadline and refused when other
// tests loaded the same Redis). A wait that ends within a round trip and
// Wake of the caller's deadline is refused at once, by Limiter.WaitN and
// the Delay strategy alike.
const Wake = 25 * time.Millisecond

// Shape is what an estimate needs of a limit.
type Shape struct {
	Kind     Kind
	Interval time.Duration // Bucket: one unit's time
	Period   time.Duration // windows
	Capacity int64
}

// Kind sorts the algorithms by how units come back.
type Kind uint8

const (
	// Bucket: one unit per Interval (GCRA, token and leaky bucket).
	Bucket Kind = iota
	// Fixed: the whole capacity at each window's start.
	Fixed
	// Sliding: units come back over a window, each a Period after it was
	// taken (the sliding window log).
	Sliding
	// Counter: the sliding window counter, which weighs the previous
	// window's count down over the current one.
	Counter
)

// ShapeOf is the shape of a limit of the named algorithm (its config
// name, as sluice.Algorithm's String gives it; this package cannot import
// sluice's, which imports it).
func ShapeOf(algorithm string, interval, period time.Duration, capacity int64) Shape {
	s := Shape{Interval: interval, Period: period, Capacity: capacity}
	switch algorithm {
	case "fixed_window":
		s.Kind = Fixed
	case "sliding_window_log":
		s.Kind = Sliding
	case "sliding_window_counter":
		s.Kind = Counter
	}
	return s
}

// PeekCost is the cost to ask the store about (Peek) for a waiter of cost
// units behind ahead, so that Estimate can be exact: for the sliding
// kinds, the units of the line's last Capacity (ahead+cost when that is
// at most Capacity); otherwise cost.
func (s Shape) PeekCost(ahead, cost int64) int64 {
	switch {
	case ahead <= 0:
		return cost
	case s.Kind == Sliding:
		_, r := s.windows(ahead, cost)
		return r
	case s.Kind == Counter && ahead+cost <= s.Capacity:
		return ahead + cost
	}
	return cost
}

// windows splits the units of a line of ahead+cost on a sliding kind:
// the waiter's units come at least q Periods after the first r of them,
// r in [1, Capacity] (q = 0 when all fit the capacity at once).
func (s Shape) windows(ahead, cost int64) (q, r int64) {
	c := max(s.Capacity, 1)
	q = (ahead + cost - 1) / c
	return q, ahead + cost - q*c
}

// Estimate is how long a waiter of cost units waits, without other
// takers, when the store has just denied peeked units with retry and
// ahead units wait before it in the line. peeked is cost (the waiter's
// own denial) or PeekCost(ahead', cost) for some ahead' ≤ ahead.
//
// For the sliding window log it is exact when ahead+cost fits the
// capacity and peeked is that, and otherwise never longer than the wait
// (a waiter that could be served in time is not refused): the log admits
// at most Capacity units in any Period, so a unit comes at least a Period
// after the one Capacity before it, and the first r at least when the
// store frees r.
//
// For the sliding window counter, the store's answer for ahead+cost units
// (when they fit the capacity) is exact when the line and the waiter are
// admitted in one window, and otherwise errs long (across a window's end
// the counter discounts the units the line took before it), by less than
// a Period; beyond the capacity, or told less, the estimate errs long by
// a Period: the counter can admit almost twice its capacity over a
// Period that straddles two windows, and then nothing for most of the
// next, so no figure of the log's kind bounds it.
func (s Shape) Estimate(retry time.Duration, peeked, ahead, cost int64) time.Duration {
	if ahead <= 0 {
		return retry
	}
	switch s.Kind {
	case Bucket:
		return sat(retry, ahead, s.Interval)
	case Fixed:
		// Each window from the next serves Capacity: the waiter's units
		// come in window ⌈(ahead+cost)/Capacity⌉.
		return sat(retry, (ahead+cost-1)/max(s.Capacity, 1), s.Period)
	case Counter:
		if peeked == ahead+cost {
			return retry
		}
		return sat(retry, (ahead+cost-1)/max(s.Capacity, 1)+1, s.Period)
	default:
		q, r := s.windows(ahead, cost)
		if peeked <= r {
			// The first r come no sooner than the peeked ones.
			return sat(retry, q, s.Period)
		}
		if q == 0 { // cannot happen: peeked ≤ ahead+cost = r
			return retry
		}
		// Units r+Capacity ≥ peeked come no sooner than retry, the
		// waiter's a further q-1 Periods on.
		return max(sat(0, q, s.Period), sat(retry, q-1, s.Period))
	}
}

// EstimateAllowed is Estimate for a counter that would have admitted the
// waiter (a layered request denied by another counter, or peeked units
// that are free now), with remaining units left.
func (s Shape) EstimateAllowed(remaining, ahead, cost int64) time.Duration {
	need := ahead + cost - remaining
	if need <= 0 {
		return 0
	}
	switch s.Kind {
	case Bucket:
		return sat(0, need, s.Interval)
	case Sliding:
		// As Estimate: the waiter's units come q Periods after the first
		// r; those are free now if r ≤ remaining, and not yet otherwise
		// (some wait, of unknown length: the least there is).
		q, r := s.windows(ahead, cost)
		if r > remaining {
			return max(sat(0, q, s.Period), time.Microsecond)
		}
		return sat(0, q, s.Period)
	}
	return sat(0, (need+max(s.Capacity, 1)-1)/max(s.Capacity, 1), s.Period)
}

// Wait is how long a waiter of cost units waits behind ahead units on a
// counter that answered it about peeked units (see Estimate) without
// taking: allowed with remaining units left, or denied with retry.
func (s Shape) Wait(allowed bool, remaining int64, retry time.Duration, peeked, ahead, cost int64) time.Duration {
	if allowed {
		return s.EstimateAllowed(remaining, ahead, cost)
	}
	return s.Estimate(max(retry, time.Millisecond), peeked, ahead, cost) // a denial with no wait must still wait
}

// sat is base + n×d, saturating.
func sat(base time.Duration, n int64, d time.Duration) time.Duration {
	const most = time.Duration(1<<63 - 1)
	if n > 0 && d > 0 && n > int64(most-base)/int64(d) {
		return most
	}
	return base + time.Duration(n)*d
}

// head finds a line: the store (when it can be a map key) or another
// owner, and the key of the line's first counter; lines of other counter
// sets sharing that key are chained behind it.
type head struct {
	owner any
	key   string
}

// The registry is sharded by key, so that requests on other keys do not
// queue on one mutex behind a busy key's line; live counts its lines, so
// that with none a request looks at nothing else.
const shards = 64

var (
	live     atomic.Int64
	seed     = maphash.MakeSeed()
	registry [shards]struct {
		mu    sync.Mutex
		lines map[head]*Line
	}
)

func shardOf(key string) int { return int(maphash.String(seed, key) % shards) }

// Line is the queue of one key and limit (or one set of them).
type Line struct {
	head    head
	name    string
	shard   int
	next    *Line // another line with the same head
	gone    bool  // out of the registry: its waiters all left
	waiters []*Waiter
	units   []int64 // per counter, the units of every waiter in the line
	joined  []int64 // per counter, the units of every waiter that ever joined
}

// Waiter is one place in a line.
type Waiter struct {
	line *Line
	cost []int64
	turn chan struct{} // closed when the waiter is the head
}

// Owner returns store if it can identify a line, else fallback: a store
// whose type is not comparable cannot be a map key.
func Owner(store, fallback any) any {
	if store != nil && reflect.TypeOf(store).Comparable() {
		return store
	}
	return fallback
}

// Busy reports whether any line exists: without one, no request need look
// further (one atomic load).
func Busy() bool { return live.Load() > 0 }

// Waiting reports whether a line whose first counter is key waits on
// owner, without allocating.
func Waiting(owner any, key string) bool {
	sh := &registry[shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	return sh.lines[head{owner, key}] != nil
}

// find returns the line named name, if any; the shard's lock is held.
func find(lines map[head]*Line, h head, name string) *Line {
	for l := lines[h]; l != nil; l = l.next {
		if l.name == name {
			return l
		}
	}
	return nil
}

// Snapshot is a line as a newcomer found it, before it asked the store how
// long its own units need: with what joined since, the units ahead of it.
type Snapshot struct {
	line   *Line
	units  []int64
	joined []int64
}

// Ahead returns the units per counter in the line when s was taken; more
// may have joined since.
func (s *Snapshot) Ahead() []int64 { return s.units }

// Look returns the line named name, whose first counter is key, on owner,
// or nil if there is none. A request that finds one joins it (Snapshot.Join)
// instead of taking first: a newcomer that took first would take the unit
// the head waits for.
func Look(owner any, key, name string) *Snapshot {
	sh := &registry[shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := find(sh.lines, head{owner, key}, name)
	if l == nil {
		return nil
	}
	return &Snapshot{line: l, units: append([]int64(nil), l.units...), joined: append([]int64(nil), l.joined...)}
}

// Join puts a waiter of cost units (one per counter) at the end of the line
// s looked at, if fits accepts the units now ahead of it per counter: those
// in the line when s was taken and all that joined since (some of which may
// have left, served, without the store's answer since s showing it: so the
// estimate errs long, never short). It returns the waiter (nil when
// refused), and false when the line has emptied since s (nothing done).
func (s *Snapshot) Join(cost []int64, fits func(ahead []int64) bool) (*Waiter, bool) {
	l := s.line
	sh := &registry[l.shard]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if l.gone {
		return nil, false
	}
	ahead := make([]int64, len(cost))
	for j := range ahead {
		ahead[j] = s.units[j] + l.joined[j] - s.joined[j]
	}
	if !fits(ahead) {
		return nil, true
	}
	return l.add(cost), true
}

// Join puts a waiter of cost units (one per counter) at the end of the
// line named name (whose first counter is key) on owner, if estimate,
// given the units ahead per counter, is at most limit. It returns the
// waiter (nil when refused) and the estimate.
func Join(owner any, key, name string, cost []int64, estimate func(ahead []int64) time.Duration, limit time.Duration) (*Waiter, time.Duration) {
	h := head{owner, key}
	sh := &registry[shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l := find(sh.lines, h, name)
	ahead := make([]int64, len(cost))
	if l != nil {
		copy(ahead, l.units)
	}
	est := estimate(ahead)
	if est > limit {
		return nil, est
	}
	if l == nil {
		l = &Line{head: h, name: name, shard: shardOf(key), units: make([]int64, len(cost)), joined: make([]int64, len(cost))}
		if sh.lines == nil {
			sh.lines = map[head]*Line{}
		}
		l.next = sh.lines[h]
		sh.lines[h] = l
		live.Add(1)
	}
	return l.add(cost), est
}

// add appends a waiter; the shard's lock is held.
func (l *Line) add(cost []int64) *Waiter {
	w := &Waiter{line: l, cost: cost, turn: make(chan struct{})}
	if len(l.waiters) == 0 {
		close(w.turn)
	}
	l.waiters = append(l.waiters, w)
	for j, c := range cost {
		l.units[j] += c
		l.joined[j] += c
	}
	return w
}

// Turn is closed when w heads its line: then, and only then, it asks the
// store.
func (w *Waiter) Turn() <-chan struct{} { return w.turn }

// Head reports whether w heads its line.
func (w *Waiter) Head() bool {
	select {
	case <-w.turn:
		return true
	default:
		return false
	}
}

// Leave takes w out of its line, admitted or refused; the next waiter
// becomes the head if w was. Calling it twice is harmless.
func (w *Waiter) Leave() {
	l := w.line
	if l == nil {
		return
	}
	sh := &registry[l.shard]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	w.line = nil
	for i, o := range l.waiters {
		if o != w {
			continue
		}
		l.waiters = append(l.waiters[:i], l.waiters[i+1:]...)
		if i == 0 && len(l.waiters) > 0 {
			close(l.waiters[0].turn)
		}
		break
	}
	for j, c := range w.cost {
		l.units[j] -= c
	}
	if len(l.waiters) == 0 {
		l.gone = true
		live.Add(-1)
		// Unchain l.
		p := sh.lines[l.head]
		if p == l {
			if l.next == nil {
				delete(sh.lines, l.head)
			} else {
				sh.lines[l.head] = l.next
			}
			return
		}
		for ; p != nil; p = p.next {
			if p.next == l {
				p.next = l.next
				return
			}
		}
	}
}

// Held reports how many waiters the lines whose first counter is key hold
// on owner, for tests.
func Held(owner any, key string) int {
	sh := &registry[shardOf(key)]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	n := 0
	for l := sh.lines[head{owner, key}]; l != nil; l = l.next {
		n += len(l.waiters)
	}
	return n
}

// Len reports how many waiters all lines hold, for tests.
func Len() int {
	n := 0
	for i := range registry {
		sh := &registry[i]
		sh.mu.Lock()
		for l := range sh.lines {
			for c := sh.lines[l]; c != nil; c = c.next {
				n += len(c.waiters)
			}
		}
		sh.mu.Unlock()
	}
	return n
}
