package resilient

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// breaker is a circuit breaker. Closed: every call goes to the backend;
// threshold consecutive failures open it. Open: no calls until interval has
// passed, then exactly one call probes (half-open). A successful probe
// closes it; a failed one opens it for another interval.
type breaker struct {
	threshold int
	interval  time.Duration
	name      string
	observer  sluice.Observer

	state atomic.Uint32 // sluice.BreakerState, read without the lock on the hot path
	fails atomic.Int32  // consecutive failures while closed

	mu      sync.Mutex
	retryAt time.Time // open: when the next probe may go
}

func (b *breaker) current() sluice.BreakerState { return sluice.BreakerState(b.state.Load()) }

// allow reports whether this call may go to the backend, and whether it is
// the probe.
func (b *breaker) allow(now time.Time) (call, probe bool) {
	if b.current() == sluice.BreakerClosed {
		return true, false
	}
	b.mu.Lock()
	if b.current() != sluice.BreakerOpen || now.Before(b.retryAt) {
		closed := b.current() == sluice.BreakerClosed
		b.mu.Unlock()
		return closed, false
	}
	b.set(sluice.BreakerHalfOpen)
	b.mu.Unlock()
	return true, true
}

func (b *breaker) success(probe bool) {
	if !probe && b.current() == sluice.BreakerClosed {
		if b.fails.Load() != 0 {
			b.fails.Store(0)
		}
		return
	}
	b.mu.Lock()
	b.fails.Store(0)
	if probe || b.current() != sluice.BreakerClosed {
		b.set(sluice.BreakerClosed)
	}
	b.mu.Unlock()
}

func (b *breaker) failure(probe bool, now time.Time) {
	if !probe && b.fails.Add(1) < int32(b.threshold) {
		return
	}
	b.mu.Lock()
	if probe || b.current() == sluice.BreakerClosed {
		b.retryAt = now.Add(b.interval)
		b.set(sluice.BreakerOpen)
	}
	b.mu.Unlock()
}

// release ends a call that taught nothing about the backend (the caller
// gave up, or sent bad input). A probe gives its turn to the next call.
func (b *breaker) release(probe bool, now time.Time) {
	if !probe {
		return
	}
	b.mu.Lock()
	if b.current() == sluice.BreakerHalfOpen {
		b.retryAt = now
		b.set(sluice.BreakerOpen)
	}
	b.mu.Unlock()
}

// set changes state under b.mu and reports the change.
func (b *breaker) set(to sluice.BreakerState) {
	from := b.current()
	if from == to {
		return
	}
	b.state.Store(uint32(to))
	if to == sluice.BreakerClosed {
		b.fails.Store(0)
	}
	if b.observer != nil {
		b.observer.ObserveBreaker(sluice.BreakerEvent{Store: b.name, From: from, To: to})
	}
}
