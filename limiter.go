package sluice

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/ctxutil"
	"github.com/sluicehq/sluice/internal/line"
)

// Limiter applies one Limit to many keys through a Store.
//
// Allow is what most callers want: it takes one unit and reports the
// Decision; check Decision.Allowed. AllowN takes a weighted cost. Wait blocks
// until the request is admitted or the context ends, which is what a client
// of a rate-limited third-party API needs. Peek looks without taking; Reset
// forgets a key.
//
// A Limiter is safe for concurrent use. Build one with NewLimiter: the zero
// value (and a nil *Limiter) refuses every call with ErrInvalidLimit.
type Limiter struct {
	store  Store
	limit  Limit
	prefix string
}

// Options configures a Limiter. A nil *Options is valid.
type Options struct {
	// Prefix is prepended to every key, so that several policies can share
	// one store ("login:", "api:"). MaxKeyLen applies to the joined key.
	// Default: none. A non-empty prefix costs one small allocation per call
	// for the joined key.
	Prefix string
}

// errNilStore refuses a nil store. It is ErrStoreNotBuilt, the error a
// caller looks for, and also ErrInvalidLimit, which it used to be alone.
var errNilStore = fmt.Errorf("%w: nil store (%w)", ErrInvalidLimit, ErrStoreNotBuilt)

// NewLimiter returns a Limiter enforcing limit on store. It fails with
// ErrInvalidLimit if limit is invalid, with an error wrapping
// ErrStoreNotBuilt when store is nil (also ErrInvalidLimit) or was never
// built (CheckBuilt), and with the store's error when store is a
// LimitChecker that refuses limit.
func NewLimiter(store Store, limit Limit, opts *Options) (*Limiter, error) {
	if store == nil {
		return nil, errNilStore
	}
	if err := CheckBuilt(store); err != nil {
		return nil, err // it would fail every call
	}
	if err := limit.Validate(); err != nil {
		return nil, err
	}
	if c, ok := store.(LimitChecker); ok {
		if err := c.CheckLimit(limit); err != nil {
			return nil, err
		}
	}
	l := &Limiter{store: store, limit: limit}
	if opts != nil {
		l.prefix = opts.Prefix
	}
	return l, nil
}

// Limit returns the limit l enforces (the zero Limit for a zero Limiter).
func (l *Limiter) Limit() Limit {
	if l == nil {
		return Limit{}
	}
	return l.limit
}

// Store returns the store l decides on (nil for a zero Limiter), for code
// that keeps state of its own beside l's keys: httplimit.Transport keeps
// a provider's Retry-After there, so that a fleet sharing l shares it.
func (l *Limiter) Store() Store {
	if l == nil {
		return nil
	}
	return l.store
}

// Prefix returns the prefix of l's keys (Options.Prefix).
func (l *Limiter) Prefix() string {
	if l == nil {
		return ""
	}
	return l.prefix
}

// key joins the prefix. An empty caller key is rejected here (the joined
// key would not be empty); the store enforces MaxKeyLen on the joined key.
func (l *Limiter) key(key string) (string, error) {
	if l == nil || l.store == nil {
		return "", fmt.Errorf("%w: a zero Limiter: build one with NewLimiter", ErrInvalidLimit)
	}
	if key == "" {
		return "", ValidateKey(key)
	}
	if l.prefix == "" {
		return key, nil
	}
	return l.prefix + key, nil
}

// Allow is shorthand for AllowN(ctx, key, 1).
func (l *Limiter) Allow(ctx context.Context, key string) (Decision, error) {
	return l.AllowN(ctx, key, 1)
}

// AllowN takes n units for key if available. A denial is reported in the
// Decision, not as an error; errors are bad input or store failures.
func (l *Limiter) AllowN(ctx context.Context, key string, n int64) (Decision, error) {
	k, err := l.key(key)
	if err != nil {
		return Decision{}, err
	}
	return l.store.Take(ctx, k, l.limit, n)
}

// Peek reports what Allow would decide now without taking anything.
func (l *Limiter) Peek(ctx context.Context, key string) (Decision, error) {
	k, err := l.key(key)
	if err != nil {
		return Decision{}, err
	}
	return l.store.Peek(ctx, k, l.limit, 1)
}

// Reset returns key to its fresh state.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	k, err := l.key(key)
	if err != nil {
		return err
	}
	return l.store.Reset(ctx, k, l.limit)
}

// Wait is shorthand for WaitN(ctx, key, 1).
func (l *Limiter) Wait(ctx context.Context, key string) (Decision, error) {
	return l.WaitN(ctx, key, 1)
}

// WaitN blocks until n units are taken for key or ctx ends.
//
// The waiters of one process on one key and limit (of any Limiter on the
// same store, and of the middleware's Delay rules) form a line, first come
// first served: a caller that finds a line joins it without taking, and
// only the line's head asks the store again, after each denial's
// RetryAfter. A waiter expects its own wait (from the store, without
// taking) plus what the units ahead of it need; if ctx has a deadline
// that this would pass (less a store round trip and 25ms, to ask for the
// units in time), WaitN returns at once with an error wrapping
// context.DeadlineExceeded and the denial, whose RetryAfter is the wait it
// would have needed, rather than sleeping in vain. Units taken by other
// processes are not in the line: with them a waiter may still wait and
// then fail at its deadline. A nil ctx is context.Background(), as for
// every other method.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64) (Decision, error) {
	ctx = ctxutil.OrBackground(ctx) // the stores accept nil; the wait reads ctx itself
	if line.Busy() {
		if d, done, err := l.queue(ctx, key, n); done {
			return d, err
		}
	}
	start := time.Now()
	d, err := l.AllowN(ctx, key, n)
	if err != nil || d.Allowed {
		return d, err
	}
	return l.wait(ctx, key, n, d, time.Since(start))
}

// deadline is how long ctx lets a caller wait for its units to come back:
// it must still ask for them, which takes a store round trip (rtt, as the
// last call took) and a timer's wake-up (line.Wake); a waiter whose units
// come back later than that cannot be served in time, and is refused at
// once.
func deadline(ctx context.Context, rtt time.Duration) (time.Duration, time.Time, bool) {
	d, bounded := ctx.Deadline()
	if !bounded {
		return time.Duration(1<<63 - 1), d, false
	}
	return time.Until(d) - rtt - line.Wake, d, true
}

// queue joins the line already waiting on key, if there is one, without
// taking: it asks the store how long n units need (Peek) and adds what the
// line ahead needs. done is false when there is no line, or room for all
// of it and this caller: then WaitN takes as usual.
func (l *Limiter) queue(ctx context.Context, key string, n int64) (d Decision, done bool, err error) {
	k, err := l.key(key)
	if err != nil {
		return Decision{}, true, err
	}
	owner := line.Owner(l.store, l)
	if !line.Waiting(owner, k) {
		return Decision{}, false, nil
	}
	snap := line.Look(owner, k, k+"\x00"+l.limit.String())
	if snap == nil {
		return Decision{}, false, nil
	}
	shape := l.limit.shape()
	// On a sliding window, asking for the line's units and this caller's
	// at once makes the estimate exact (see line.Shape.Estimate).
	peeked := shape.PeekCost(snap.Ahead()[0], n)
	start := time.Now()
	d, err = l.store.Peek(ctx, k, l.limit, peeked)
	if err != nil {
		return d, true, err
	}
	limit, _, _ := deadline(ctx, time.Since(start))
	var est time.Duration
	w, there := snap.Join([]int64{n}, func(ahead []int64) bool {
		est = shape.Wait(d.Allowed, d.Remaining, d.RetryAfter, peeked, ahead[0], n)
		return est > 0 && est <= limit
	})
	switch {
	case !there || w == nil && est == 0:
		return Decision{}, false, nil
	case w == nil:
		d.Allowed, d.Remaining = false, 0
		d.RetryAfter = max(d.RetryAfter, est)
		d.ResetAfter = max(d.ResetAfter, d.RetryAfter)
		return d, true, fmt.Errorf("sluice: wait of %v would pass the deadline: %w", est, context.DeadlineExceeded)
	}
	d.Allowed, d.Remaining = false, 0
	d.RetryAfter = max(d.RetryAfter, est)
	d, err = l.waitIn(ctx, k, n, d, w, false)
	return d, true, err
}

// wait is WaitN after its first denial d.
// rtt is how long that take took.
func (l *Limiter) wait(ctx context.Context, key string, n int64, d Decision, rtt time.Duration) (Decision, error) {
	k, _ := l.key(key) // AllowN has checked it
	limit, _, _ := deadline(ctx, rtt)
	shape := l.limit.shape()
	first := max(d.RetryAfter, time.Millisecond) // defensive: a store must not deny with no wait
	w, est := line.Join(line.Owner(l.store, l), k, k+"\x00"+l.limit.String(), []int64{n}, func(ahead []int64) time.Duration {
		return shape.Estimate(first, n, ahead[0], n)
	}, limit)
	if w == nil {
		d.RetryAfter = max(d.RetryAfter, est)
		d.ResetAfter = max(d.ResetAfter, d.RetryAfter)
		return d, fmt.Errorf("sluice: wait of %v would pass the deadline: %w", est, context.DeadlineExceeded)
	}
	return l.waitIn(ctx, k, n, d, w, true)
}

// waitIn waits in line as w, denied with d, until admitted or ctx ends.
// fresh: d came from a take just now, so a head sleeps on it; a waiter
// that joined without taking asks the store as soon as it heads the line.
func (l *Limiter) waitIn(ctx context.Context, k string, n int64, d Decision, w *line.Waiter, fresh bool) (Decision, error) {
	defer w.Leave()
	deadline, bounded := ctx.Deadline()
	first := max(d.RetryAfter, time.Millisecond)
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	sleep := func(wait time.Duration) error {
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return nil
		}
	}
	if fresh && w.Head() {
		// The denial in hand is fresh: sleep on it.
		if bounded && time.Until(deadline) < first {
			return d, fmt.Errorf("sluice: wait of %v would pass the deadline: %w", first, context.DeadlineExceeded)
		}
		if err := sleep(first); err != nil {
			return d, err
		}
	} else {
		select {
		case <-ctx.Done():
			return d, ctx.Err()
		case <-w.Turn():
		}
	}
	for {
		d, err := l.store.Take(ctx, k, l.limit, n)
		if err != nil || d.Allowed {
			return d, err
		}
		wait := max(d.RetryAfter, time.Millisecond)
		if bounded && time.Until(deadline) < wait {
			return d, fmt.Errorf("sluice: wait of %v would pass the deadline: %w", wait, context.DeadlineExceeded)
		}
		if err := sleep(wait); err != nil {
			return d, err
		}
	}
}

// shape is what a line's estimate needs of l.
func (l Limit) shape() line.Shape {
	return line.ShapeOf(l.Algorithm.String(), l.Interval(), l.Period, l.Capacity())
}
