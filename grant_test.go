package sluice_test

import (
	"errors"
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// One unit is kept back for every interval begun since the grant.
func TestReturnAllowance(t *testing.T) {
	t.Parallel()
	l := sluice.PerSecond(10) // 100ms per unit
	for _, c := range []struct {
		unused int64
		age    time.Duration
		want   int64
	}{
		{8, 0, 8},
		{8, -time.Second, 8}, // a clock behind the grant's: age 0
		{8, time.Microsecond, 7},
		{8, 100 * time.Millisecond, 7},
		{8, 100*time.Millisecond + time.Microsecond, 6},
		{8, 250 * time.Millisecond, 5},
		{8, 800 * time.Millisecond, 0},
		{8, time.Hour, 0},
	} {
		if got := sluice.ReturnAllowance(l, c.unused, c.age.Microseconds()); got != c.want {
			t.Errorf("ReturnAllowance(%d unused, age %v) = %d, want %d", c.unused, c.age, got, c.want)
		}
	}
	// An age near MaxInt64 µs must not wrap into a negative count of
	// intervals, which would give back more than was unused.
	if got := sluice.ReturnAllowance(l, 8, math.MaxInt64); got != 0 {
		t.Errorf("ReturnAllowance(8 unused, age MaxInt64 µs) = %d, want 0", got)
	}
}

func TestValidateGrant(t *testing.T) {
	t.Parallel()
	l := sluice.PerSecond(10)
	g := sluice.Grant{Granted: 3, Limit: l}
	for _, c := range []struct {
		name string
		err  error
		want error
	}{
		{"grant", sluice.ValidateGrant("k", l, 10), nil},
		{"grant_zero", sluice.ValidateGrant("k", l, 0), sluice.ErrInvalidCost},
		{"grant_above_capacity", sluice.ValidateGrant("k", l, 11), sluice.ErrCostExceedsBurst},
		{"grant_log", sluice.ValidateGrant("k", l.WithAlgorithm(sluice.SlidingWindowLog), 1), sluice.ErrGrantUnsupported},
		{"grant_key", sluice.ValidateGrant("", l, 1), sluice.ErrInvalidKey},
		{"return", sluice.ValidateReturn("k", l, g, 3), nil},
		{"return_zero", sluice.ValidateReturn("k", l, g, 0), sluice.ErrInvalidReturn},
		{"return_above_granted", sluice.ValidateReturn("k", l, g, 4), sluice.ErrInvalidReturn},
		{"return_above_capacity", sluice.ValidateReturn("k", l, g, 11), sluice.ErrInvalidReturn},
		{"return_log", sluice.ValidateReturn("k", l.WithAlgorithm(sluice.SlidingWindowLog), g, 1), sluice.ErrGrantUnsupported},
		{"regrant", sluice.ValidateRegrant("k", l, g, 3, 10), nil},
		{"regrant_bad_return", sluice.ValidateRegrant("k", l, g, 4, 1), sluice.ErrInvalidReturn},
		{"regrant_bad_grant", sluice.ValidateRegrant("k", l, g, 3, 11), sluice.ErrCostExceedsBurst},
		{"regrant_zero_grant", sluice.ValidateRegrant("k", l, g, 3, 0), sluice.ErrInvalidCost},
	} {
		if !errors.Is(c.err, c.want) || (c.want == nil) != (c.err == nil) {
			t.Errorf("%s: err = %v, want %v", c.name, c.err, c.want)
		}
	}
}
