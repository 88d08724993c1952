package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// LimitChanges are the limits a key is taken under in turn, each run
// starting on a fresh key, for algorithm a: a reloaded policy whose Period
// grows ×60 or ×86400 or shrinks ÷60 (and back), whose Rate grows and
// shrinks, and, for the bucket algorithms and GCRA, whose Burst does.
func LimitChanges(a sluice.Algorithm) [][]sluice.Limit {
	l := func(rate int64, period time.Duration) sluice.Limit {
		return sluice.Limit{Algorithm: a, Rate: rate, Period: period}
	}
	day := 24 * time.Hour
	out := [][]sluice.Limit{
		{l(5, time.Second), l(5, time.Minute), l(5, time.Second)},
		{l(5, time.Minute), l(5, time.Second), l(5, time.Minute)},
		{l(5, time.Second), l(5, day), l(5, time.Second)},
		{l(5, day), l(5, time.Second), l(5, day)},
		{l(5, time.Second), l(100, time.Second), l(1, time.Second), l(5, time.Second)},
		{l(100, 7*time.Hour), l(3, time.Second), l(100, 7*time.Hour)},
	}
	if !windowed(a) {
		out = append(out,
			[]sluice.Limit{l(5, time.Second), l(5, time.Second).WithBurst(50), l(5, time.Second).WithBurst(1), l(5, time.Second)},
			[]sluice.Limit{l(2, time.Second).WithBurst(40), l(2, time.Minute).WithBurst(3), l(2, time.Second).WithBurst(40)},
		)
	}
	return out
}

func windowed(a sluice.Algorithm) bool {
	return a == sluice.FixedWindow || a == sluice.SlidingWindowCounter || a == sluice.SlidingWindowLog
}

// horizon is the longest any decision under l can ask a caller to wait, for
// a unit or for the key to be fresh, when no caller's clock lags another's:
// a window (two for the sliding window counter, whose previous window still
// counts through the current one), or the time from empty to full.
//
// GCRA's state is one time, the TAT, which cannot tell a limit's change
// from a clock's lag: a TAT up to sluice.MaxClockSkew past the span is read
// as a lagging clock's and waited out (further, it is stale and the key
// fresh). So after a change GCRA may ask for up to MaxClockSkew more.
func horizon(l sluice.Limit) time.Duration {
	switch l.Algorithm {
	case sluice.FixedWindow, sluice.SlidingWindowLog:
		return l.Period
	case sluice.SlidingWindowCounter:
		return 2 * l.Period
	case sluice.GCRA:
		return time.Duration(l.Capacity())*l.Interval() + sluice.MaxClockSkew
	}
	return time.Duration(l.Capacity()) * l.Interval()
}

// testLimitChange takes on a key under one limit, then under others, as a
// policy reloaded with another Period, Rate or Burst does: the key's
// prefix names the policy, not its limit. Whatever the state says, no call
// fails, panics or answers with a wait beyond the new limit's horizon; a
// denial has a wait, and at its end the key admits again.
func testLimitChange(t *testing.T, newStore NewStore, a sluice.Algorithm) {
	ctx := context.Background()
	for _, seq := range LimitChanges(a) {
		var names []string
		for _, l := range seq {
			names = append(names, fmt.Sprintf("%d_per_%v_burst_%d", l.Rate, l.Period, l.Capacity()))
		}
		for _, exhaust := range []bool{true, false} {
			name := strings.Join(names, "_to_")
			if !exhaust {
				name += "_after_one_take"
			}
			t.Run(name, func(t *testing.T) { limitChange(ctx, t, newStore, seq, exhaust) })
		}
	}
}

// limitChange runs one sequence of limits on one key. Under each but the
// last, the key is exhausted, or takes just one unit (leaving more than a
// smaller capacity after it can hold), before the next takes over at once.
func limitChange(ctx context.Context, t *testing.T, newStore NewStore, seq []sluice.Limit, exhaust bool) {
	clock := NewClock(T0.Add(1234567 * time.Microsecond))
	s := newStore(t, clock.Now)
	key := uniqueKey(t, "lc")
	for i, l := range seq {
		check := func(what string, d sluice.Decision) {
			t.Helper()
			where := fmt.Sprintf("under %v (limit %d of %v), %s at +%v", l, i+1, seq, what, clock.Now().Sub(T0))
			checkWithin(t, where, l, d)
		}
		p, err := s.Peek(ctx, key, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		check("peek", p)
		last := i == len(seq)-1
		if !exhaust && !last {
			d, err := s.Take(ctx, key, l, 1)
			if err != nil {
				t.Fatal(err)
			}
			check("take", d)
			continue
		}
		// Exhaust the key: every take is within bounds, and the first
		// denial waits, after which the key admits again.
		var denied sluice.Decision
		for n := int64(0); n <= l.Capacity(); n++ {
			d, err := s.Take(ctx, key, l, 1)
			if err != nil {
				t.Fatal(err)
			}
			check(fmt.Sprintf("take %d", n+1), d)
			if !d.Allowed {
				denied = d
				break
			}
		}
		if denied.RetryAfter == 0 {
			t.Fatalf("under %v: %d takes of 1 never denied", l, l.Capacity()+1)
		}
		clock.Advance(denied.RetryAfter)
		d, err := s.Take(ctx, key, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		check("take at the denial's RetryAfter", d)
		if !d.Allowed {
			t.Fatalf("under %v: still denied at the denial's RetryAfter %v: %+v", l, denied.RetryAfter, d)
		}
		if last {
			clock.Advance(d.ResetAfter)
			if p, err := s.Peek(ctx, key, l, 1); err != nil || p.Remaining != l.Capacity() {
				t.Fatalf("under %v: not fresh at ResetAfter %v: %+v %v", l, d.ResetAfter, p, err)
			}
		}
	}
}

// checkWithin checks d, a decision under l, against l's own bounds.
func checkWithin(t *testing.T, where string, l sluice.Limit, d sluice.Decision) {
	t.Helper()
	h := horizon(l)
	switch {
	case d.Limit != l:
		t.Fatalf("%s: Decision.Limit %v", where, d.Limit)
	case d.RetryAfter < 0 || d.RetryAfter > h, d.ResetAfter < 0 || d.ResetAfter > h:
		t.Fatalf("%s: %+v: a wait outside [0, %v]", where, d, h)
	case d.Remaining < 0 || d.Remaining > l.Capacity():
		t.Fatalf("%s: %+v: Remaining outside [0, %d]", where, d, l.Capacity())
	case d.Allowed != (d.RetryAfter == 0):
		t.Fatalf("%s: %+v: allowed with a wait, or denied without one", where, d)
	}
}
