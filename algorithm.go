package sluice

import (
	"fmt"
	"strings"
)

// Algorithm selects how a Limit is enforced. The zero value is GCRA.
//
// Choosing one (see the README for the full table):
//
//   - GCRA: the default. One number per key, smooth, allows bursts up to
//     Burst. Token bucket and leaky bucket make exactly the same decisions
//     and differ only in what they store.
//   - FixedWindow: cheapest and easiest to explain ("100 per calendar
//     minute"), but admits up to 2× the rate across a window boundary.
//   - SlidingWindowLog: exact "at most N in any period", memory O(N) per key.
//   - SlidingWindowCounter: an approximate sliding window in constant
//     memory (it assumes the previous window's traffic was even).
type Algorithm uint8

const (
	// GCRA is the generic cell rate algorithm (as in redis_rate and
	// redis-cell). State: one number, the theoretical arrival time (TAT).
	// Exact; bursts up to Burst, then one unit per Interval; the smallest
	// state of all. The default.
	GCRA Algorithm = iota
	// TokenBucket holds Burst tokens, one returning every Interval. State:
	// whole tokens and the time of the last whole refill (a hash). Exact and
	// drift-free (integer time); decides exactly as GCRA does.
	TokenBucket
	// LeakyBucket is the leaky bucket as a meter: units fill a bucket of
	// Burst that drains one per Interval; a request fits while
	// level + cost <= capacity. State: level and time of the last leak (a
	// hash). Decides exactly as GCRA does.
	LeakyBucket
	// FixedWindow counts units per calendar window of Period. State: the
	// window number and its count. Cheapest and easiest to explain, but a
	// client can pass 2× Rate across a window edge (Rate at the end of one
	// window, Rate at the start of the next).
	FixedWindow
	// SlidingWindowLog records each admitted unit's time and admits while
	// fewer than Rate fall in the last Period. Exact, no edge bursts, but
	// memory grows with Rate: O(Rate) entries per key.
	SlidingWindowLog
	// SlidingWindowCounter estimates the last Period's count as the current
	// fixed window's count plus the previous window's, weighted by how much
	// of it the sliding period still overlaps. Constant memory and smoothed
	// edges; approximate where traffic within a window was uneven.
	SlidingWindowCounter

	numAlgorithms
)

var algorithmNames = [numAlgorithms]string{
	GCRA:                 "gcra",
	TokenBucket:          "token_bucket",
	LeakyBucket:          "leaky_bucket",
	FixedWindow:          "fixed_window",
	SlidingWindowLog:     "sliding_window_log",
	SlidingWindowCounter: "sliding_window_counter",
}

// Algorithms returns every algorithm, in a stable order.
func Algorithms() []Algorithm {
	all := make([]Algorithm, numAlgorithms)
	for i := range all {
		all[i] = Algorithm(i)
	}
	return all
}

// String returns the algorithm's config name, such as "fixed_window".
func (a Algorithm) String() string {
	if a < numAlgorithms {
		return algorithmNames[a]
	}
	return fmt.Sprintf("Algorithm(%d)", uint8(a))
}

// Valid reports whether a is one of the defined algorithms.
func (a Algorithm) Valid() bool { return a < numAlgorithms }

// windowed reports whether the algorithm counts per window (no separate burst).
func (a Algorithm) windowed() bool {
	return a == FixedWindow || a == SlidingWindowLog || a == SlidingWindowCounter
}

// ParseAlgorithm parses a config name such as "token_bucket". Hyphens and
// case are accepted ("Token-Bucket").
func ParseAlgorithm(s string) (Algorithm, error) {
	norm := strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "-", "_")
	for i, name := range algorithmNames {
		if norm == name {
			return Algorithm(i), nil
		}
	}
	return 0, fmt.Errorf("%w: unknown algorithm %q (want one of %s)", ErrInvalidLimit, s, strings.Join(algorithmNames[:], ", "))
}

// MarshalText implements encoding.TextMarshaler.
func (a Algorithm) MarshalText() ([]byte, error) {
	if !a.Valid() {
		return nil, fmt.Errorf("%w: unknown algorithm %d", ErrInvalidLimit, uint8(a))
	}
	return []byte(a.String()), nil
}

// UnmarshalText implements encoding.TextUnmarshaler.
func (a *Algorithm) UnmarshalText(b []byte) error {
	v, err := ParseAlgorithm(string(b))
	if err != nil {
		return err
	}
	*a = v
	return nil
}
