package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrGrantUnsupported: the store cannot grant under the limit's algorithm.
// The sliding window log is refused: its units are dated when they are
// taken, so a leased unit spent later would leave the log early and admit
// up to a whole extra Rate in a Period.
var ErrGrantUnsupported = errors.New("sluice: algorithm cannot grant")

// ErrInvalidReturn: a Return gives back a negative number of units, or more
// than the grant granted.
var ErrInvalidReturn = errors.New("sluice: invalid return")

// Grant is the outcome of Granter.Grant: units taken from a key's budget in
// one step, to be spent by the caller (a lease).
//
// The examples below use PerSecond(10) (GCRA: one unit every 100ms, burst
// 10) on a key with 3 units left, granting up to 5.
type Grant struct {
	// Granted is how many units were taken: between 0 and the units asked
	// for. Example: 3.
	Granted int64

	// Limit is the policy the grant was made under. Example: 10/s.
	Limit Limit

	// Remaining is how many units could still be taken right now, after
	// the grant. Example: 0.
	Remaining int64

	// RetryAfter is zero when Granted is positive. Otherwise it is the
	// exact wait until one unit could be granted, if nobody else takes
	// units meanwhile. Example: 0 (an empty key: 100ms).
	RetryAfter time.Duration

	// ResetAfter is how long until the key is back to its fresh state if
	// nothing more is taken, as in Decision. Example: 1s.
	ResetAfter time.Duration

	// Window is, for FixedWindow and SlidingWindowCounter, the time from
	// the grant to the end of the window its units were taken from: units
	// spent later would count in no window. Zero for the other algorithms,
	// whose units never go stale. Example: 0.
	Window time.Duration

	// At is the store's time of the grant, µs since the Unix epoch. Return
	// measures the lease's age from it: an At set far in the past, down to
	// math.MinInt64, is a grant as old, which gives nothing back. Example:
	// 1767225600000000.
	At int64

	// Epoch names the key's state the units were taken from among its
	// Resets: Return gives nothing back into a key Reset since. Example: 0.
	Epoch int64
}

// Granter is implemented by stores that can lease units: grant up to n units
// of a key at once, for the caller to spend without asking again, and take
// back the ones it did not spend. Package sluice/lease builds leases on it.
//
// Contract, beside Store's:
//   - Grant takes min(n, available) units in one atomic step, exactly as a
//     Take of that many would (a partial grant, unlike Take's
//     all-or-nothing), so the key's state then says they were taken.
//   - Return gives back at most max(0, unused − r × age) units for GCRA,
//     TokenBucket and LeakyBucket, where r is one unit per Interval (whole
//     units, rounded against the caller) and age is the store's time since
//     the grant: a unit that could have been refilled during the lease,
//     only to be lost to the capacity, is not given back, so returns never
//     let a fleet admit more than leases without returns could. For
//     FixedWindow and SlidingWindowCounter it gives every unused unit back
//     into the count of the window the grant was taken from while the key
//     still counts it (for SlidingWindowCounter also as the previous
//     window, whose count weighs on the current estimate), and nothing
//     otherwise. It reports how many it gave back: how many more units a
//     take could have at once after it than before, so 0 into a window
//     gone by or a fresh key, and fewer than given where a bucket fills.
//   - A Return gives nothing back into a key Reset after the grant: the
//     grant's units were never charged to the key as it now is, and a
//     return would admit them twice. A Reset of a key that holds state
//     counts a new epoch, which the store keeps for ReturnHorizon after
//     the Reset or its last grant (after that no return could give
//     anything anyway); a grant carries the epoch it was taken in. No
//     clock is compared, so clocks that disagree cannot let a return
//     through.
//   - A grant or return is sent at most once: resent, a return would make
//     budget and a grant would strand it.
//   - SlidingWindowLog is refused with ErrGrantUnsupported.
//   - Bad input returns the wrapped sentinel error (ErrInvalidCost for n
//     below 1, ErrCostExceedsBurst above Capacity, ErrInvalidReturn for
//     unused below 1 or above Granted) and changes nothing.
type Granter interface {
	Store

	// Grant takes up to n units of key under limit.
	Grant(ctx context.Context, key string, limit Limit, n int64) (Grant, error)

	// Return gives back unused units of g, a grant of key under limit, as
	// the contract says, and reports how many it gave back.
	Return(ctx context.Context, key string, limit Limit, g Grant, unused int64) (int64, error)
}

// Regranter is implemented by Granters that can give back a lease's unused
// units and grant the next lease in one atomic step: package lease refills
// a lease in one round trip with it, where Return and Grant take two.
//
// Contract, beside Granter's: Regrant is Return(ctx, key, limit, g,
// unused) followed by Grant(ctx, key, limit, n), both at one instant of the
// store's clock, with nothing in between: each part is exactly what its own
// call would do then, so whatever holds of the two calls in sequence holds
// of it. Bad input to either part (as Return and Grant refuse it) changes
// nothing. It is sent at most once, as they are: after any other error its
// outcome is unknown, and neither part may be assumed to have run or not.
type Regranter interface {
	Granter

	// Regrant gives back unused units of g, a grant of key under limit,
	// then takes up to n units of key, and reports how many units the
	// return gave back and the new grant.
	Regrant(ctx context.Context, key string, limit Limit, g Grant, unused, n int64) (returned int64, next Grant, _ error)
}

// GrantAller is implemented by Regranters that can send several grants
// at once: package lease sends the grants of a TakeAll's checks through
// it, so that a layered request waits one round trip for them, not one
// per check or per batch the store has room for.
//
// Contract, beside Regranter's: GrantAll makes each of reqs exactly the
// call it names (Grant, or Regrant when its Unused is above 0), reported
// in the result of the same index; the calls are independent (not all or
// nothing: each may succeed or fail alone) and each is sent at most once.
// Bad input fails its own call and changes nothing. It returns
// len(reqs) results.
type GrantAller interface {
	Regranter

	// GrantAll makes each of reqs' calls, sent together.
	GrantAll(ctx context.Context, reqs []GrantRequest) []GrantResult
}

// GrantRequest is one call of a GrantAll: Grant(Key, Limit, N) or, when
// Unused is above 0, Regrant(Key, Limit, Grant, Unused, N).
type GrantRequest struct {
	Key   string
	Limit Limit
	N     int64 // units asked for, as Grant's n
	// Grant and Unused are a Regrant's return: Unused units of Grant, a
	// grant of Key under Limit, given back first. Unused 0: none, a Grant.
	Grant  Grant
	Unused int64
}

// GrantResult is what one call of a GrantAll reported: Returned is a
// Regrant's units given back (0 for a Grant), Grant the new grant, Err
// the call's error, as that call alone would report them.
type GrantResult struct {
	Returned int64
	Grant    Grant
	Err      error
}

// ValidateRegrant checks a Regrant call as stores do before touching their
// backend: the return's input, then the grant's.
func ValidateRegrant(key string, l Limit, g Grant, unused, n int64) error {
	if err := ValidateReturn(key, l, g, unused); err != nil {
		return err
	}
	return ValidateGrant(key, l, n)
}

// ValidateGrant checks a Grant call as stores do before touching their
// backend.
func ValidateGrant(key string, l Limit, n int64) error {
	if err := ValidateRequest(key, l, n); err != nil {
		return err
	}
	if l.Algorithm == SlidingWindowLog {
		return fmt.Errorf("%w: %v", ErrGrantUnsupported, l.Algorithm)
	}
	return nil
}

// ValidateReturn checks a Return call as stores do before touching their
// backend.
func ValidateReturn(key string, l Limit, g Grant, unused int64) error {
	if err := ValidateGrant(key, l, 1); err != nil {
		return err
	}
	if unused < 1 || unused > g.Granted {
		return fmt.Errorf("%w: %d unused of %d granted", ErrInvalidReturn, unused, g.Granted)
	}
	return nil
}

// ReturnAllowance is how many of unused units a return may give back age µs
// after the grant under l (a GCRA or bucket limit): unused less one unit
// for every Interval begun during the lease, at least zero.
func ReturnAllowance(l Limit, unused, age int64) int64 {
	if age < 0 {
		age = 0
	}
	iv := l.Interval().Microseconds()
	if iv <= 0 { // an invalid limit: nothing can be given back by rule
		return 0
	}
	// Intervals begun, rounded up without adding to age, which an age near
	// MaxInt64 would wrap into a negative count: all of unused and more.
	begun := age / iv
	if age%iv != 0 {
		begun++
	}
	return max(0, unused-begun)
}

// ReturnHorizon is how long after a grant under l a Return can still give
// anything back: Capacity Intervals for GCRA and the buckets (a unit a
// lease held that long could have been refilled), two Periods for the
// window algorithms (the grant's window, then as the sliding window
// counter's previous window). A store marks a Reset that long.
func ReturnHorizon(l Limit) time.Duration {
	if l.Algorithm.windowed() {
		return 2 * l.Period
	}
	return time.Duration(l.Capacity()) * l.Interval()
}
