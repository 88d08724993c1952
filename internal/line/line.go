// Package line queues the waiters of one process on one store key and
// limit (Limiter.WaitN, the Delay strategy), first come first served, so
// that a waiter can tell at once how long it would wait: each one sleeping
// on its own Retry-After, with no order among them, lets all of them sleep
// and then all but one be refused.
//
// Only the line's head asks the store; the others wait their turn. The
// store still decides every admission: the line only orders this process's
// waiters and refuses those it cannot serve in time. Takes from other
// processes, and from requests of this one that are admitted without
// waiting, are not in the line, so a waiter can still be refused at its
// deadline after all.
package line

import (
	"reflect"
	"sync"
	"time"
)

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
	// Sliding: units come back over a window (log and counter).
	Sliding
)

// Estimate is how long a waiter of cost units waits, without other
// takers, when the store has just denied it with retry (which covers its
// own units) and ahead units wait before it in the line. It errs long:
// a waiter told it can be served in time must not be held and then refused.
func (s Shape) Estimate(retry time.Duration, ahead, cost int64) time.Duration {
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
	default:
		// A sliding window frees its units over a whole Period, so even
		// those that fit one window may need all of it: one more.
		return sat(retry, (ahead+cost-1)/max(s.Capacity, 1)+1, s.Period)
	}
}

// EstimateAllowed is Estimate for a counter that would have admitted the
// waiter (a layered request denied by another counter), with remaining
// units left.
func (s Shape) EstimateAllowed(remaining, ahead, cost int64) time.Duration {
	need := ahead + cost - remaining
	if need <= 0 {
		return 0
	}
	if s.Kind == Bucket {
		return sat(0, need, s.Interval)
	}
	return sat(0, (need+max(s.Capacity, 1)-1)/max(s.Capacity, 1), s.Period)
}

// sat is base + n×d, saturating.
func sat(base time.Duration, n int64, d time.Duration) time.Duration {
	const most = time.Duration(1<<63 - 1)
	if n > 0 && d > 0 && n > int64(most-base)/int64(d) {
		return most
	}
	return base + time.Duration(n)*d
}

// id names a line: the store (when it can be a map key) or another owner,
// and the keys and limits of the waiters.
type id struct {
	owner any
	name  string
}

var (
	mu    sync.Mutex
	lines = map[id]*Line{}
)

// Line is the queue of one key and limit (or one set of them).
type Line struct {
	id      id
	waiters []*Waiter
	units   []int64 // per counter, the units of every waiter in the line
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

// Join puts a waiter of cost units (one per counter) at the end of the
// line named by owner and name, if estimate, given the units ahead per
// counter, is at most limit. It returns the waiter (nil when refused) and
// the estimate.
func Join(owner any, name string, cost []int64, estimate func(ahead []int64) time.Duration, limit time.Duration) (*Waiter, time.Duration) {
	mu.Lock()
	defer mu.Unlock()
	k := id{owner, name}
	l := lines[k]
	ahead := make([]int64, len(cost))
	if l != nil {
		copy(ahead, l.units)
	}
	est := estimate(ahead)
	if est > limit {
		return nil, est
	}
	if l == nil {
		l = &Line{id: k, units: make([]int64, len(cost))}
		lines[k] = l
	}
	w := &Waiter{line: l, cost: cost, turn: make(chan struct{})}
	if len(l.waiters) == 0 {
		close(w.turn)
	}
	l.waiters = append(l.waiters, w)
	for j, c := range cost {
		l.units[j] += c
	}
	return w, est
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
	mu.Lock()
	defer mu.Unlock()
	l := w.line
	if l == nil {
		return
	}
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
		delete(lines, l.id)
	}
}

// Len reports how many waiters all lines hold, for tests.
func Len() int {
	mu.Lock()
	defer mu.Unlock()
	n := 0
	for _, l := range lines {
		n += len(l.waiters)
	}
	return n
}
