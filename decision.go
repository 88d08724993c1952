package sluice

import "time"

// Decision is the outcome of taking (or peeking at) units for a key.
//
// The examples below use PerMinute(10) (GCRA: one unit returns every 6s)
// with a fresh key, taking 4 units at t=0.
type Decision struct {
	// Allowed reports whether the units were taken. A denied request takes
	// nothing. Example: true.
	Allowed bool

	// Limit is the policy the decision was made under. Example: 10/min.
	Limit Limit

	// Remaining is how many units could still be taken right now, after
	// this request. It never goes below zero. Example: 6.
	Remaining int64

	// RetryAfter is zero when Allowed. Otherwise it is the exact wait after
	// which the same request (same cost) would be allowed, if nobody else
	// takes units meanwhile; waiting RetryAfter−1µs is not enough.
	// Example: after the 4 units, a request for 7 at t=0 is denied with
	// RetryAfter 6s (one unit must come back).
	RetryAfter time.Duration

	// ResetAfter is how long until the key is back to its fresh state
	// (Remaining = Capacity) if nothing more is taken. Example: 24s (4 units
	// × 6s). For FixedWindow it is the time to the end of the window.
	ResetAfter time.Duration

	// Source says who answered. Stores report SourceBackend (the zero
	// value); package resilient sets the others when its deny cache,
	// fallback or failure policy answered instead of the backend, so that
	// callers can tell a made-up denial (SourceFailClosed) from a real one.
	// Example: SourceBackend.
	Source Source
}
