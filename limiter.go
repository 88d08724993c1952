package sluice

import (
	"context"
	"fmt"
	"time"
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

// NewLimiter returns a Limiter enforcing limit on store. It fails with
// ErrInvalidLimit if limit is invalid or store is nil.
func NewLimiter(store Store, limit Limit, opts *Options) (*Limiter, error) {
	if store == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidLimit)
	}
	if err := limit.Validate(); err != nil {
		return nil, err
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

// WaitN blocks until n units are taken for key or ctx ends. It sleeps for
// each denial's RetryAfter and tries again, since other clients may take the
// units first. If ctx has a deadline that the next wait would pass, it
// returns at once with an error wrapping context.DeadlineExceeded and the
// last denial, rather than sleeping in vain.
func (l *Limiter) WaitN(ctx context.Context, key string, n int64) (Decision, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		d, err := l.AllowN(ctx, key, n)
		if err != nil || d.Allowed {
			return d, err
		}
		wait := d.RetryAfter
		if wait <= 0 { // defensive: a store must not deny with no wait
			wait = time.Millisecond
		}
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return d, fmt.Errorf("sluice: wait of %v would pass the deadline: %w", wait, context.DeadlineExceeded)
		}
		if timer == nil {
			timer = time.NewTimer(wait)
		} else {
			timer.Reset(wait)
		}
		select {
		case <-ctx.Done():
			return d, ctx.Err()
		case <-timer.C:
		}
	}
}
