package sluice_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func TestParseLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		in   string
		want sluice.Limit
		str  string
	}{
		{"100/min", sluice.PerMinute(100), "100/min"},
		{"10/s", sluice.PerSecond(10), "10/s"},
		{"5000/1h", sluice.PerHour(5000), "5000/h"},
		{"10/s burst 20", sluice.PerSecond(10).WithBurst(20), "10/s burst 20"},
		{"10 / sec  burst 10", sluice.PerSecond(10).WithBurst(10), "10/s"},
		{"30/90s", sluice.Limit{Rate: 30, Period: 90 * time.Second}, "30/1m30s"},
		{"1000/day", sluice.Limit{Rate: 1000, Period: 24 * time.Hour}, "1000/day"},
		{"7/2days", sluice.Limit{Rate: 7, Period: 48 * time.Hour}, "7/2day"},
		{"3/500ms", sluice.Limit{Rate: 3, Period: 500 * time.Millisecond}, "3/500ms"},
		{"fixed_window 60/min", sluice.PerMinute(60).WithAlgorithm(sluice.FixedWindow), "fixed_window 60/min"},
		{"Token-Bucket 1/s burst 5", sluice.PerSecond(1).WithBurst(5).WithAlgorithm(sluice.TokenBucket), "token_bucket 1/s burst 5"},
		{"sliding_window_log 300/5m", sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 300, Period: 5 * time.Minute}, "sliding_window_log 300/5m"},
		// Go durations whose whole part is 0.
		{"10/0.5s", sluice.Limit{Rate: 10, Period: 500 * time.Millisecond}, "10/500ms"},
		{"10/0.25h", sluice.Limit{Rate: 10, Period: 15 * time.Minute}, "10/15m"},
		{"10/0h30m", sluice.Limit{Rate: 10, Period: 30 * time.Minute}, "10/30m"},
		{"10/00.5s", sluice.Limit{Rate: 10, Period: 500 * time.Millisecond}, "10/500ms"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := sluice.ParseLimit(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("ParseLimit(%q) = %#v, want %#v", tt.in, got, tt.want)
			}
			if s := got.String(); s != tt.str {
				t.Errorf("String() = %q, want %q", s, tt.str)
			}
			back, err := sluice.ParseLimit(got.String())
			if err != nil || back.String() != got.String() || back.Capacity() != got.Capacity() {
				t.Errorf("round trip of %q: %#v %v", got.String(), back, err)
			}
		})
	}
}

func TestParseLimitErrors(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"", "100", "/min", "x/min", "100/fortnight", "0/s", "-1/s", "10/0s", "10/-1s",
		"10/500us", "10/s burst", "10/s burst 0", "10/s burst -2", "10/s burst x", "10/s burst 1 2",
		"bogus 10/s", "fixed_window 10/s burst 20", "2000000000/s", "10/400days",
		"sliding_window_log 1000000/day", "10000000/s", "10/1.5us",
	} {
		t.Run(in, func(t *testing.T) {
			if l, err := sluice.ParseLimit(in); !errors.Is(err, sluice.ErrInvalidLimit) {
				t.Errorf("ParseLimit(%q) = %v, %v; want ErrInvalidLimit", in, l, err)
			}
		})
	}
}

func TestParseLimitZeroPeriod(t *testing.T) {
	t.Parallel()
	for _, in := range []string{"10/0s", "10/0", "10/0min", "10/0h0m", "10/-1s"} {
		_, err := sluice.ParseLimit(in)
		if !errors.Is(err, sluice.ErrInvalidLimit) || !strings.Contains(err.Error(), "a period must be positive") {
			t.Errorf("ParseLimit(%q): %v; want ErrInvalidLimit saying a period must be positive", in, err)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := []sluice.Limit{
		sluice.PerSecond(1),
		{Algorithm: sluice.FixedWindow, Rate: sluice.MaxRate, Period: time.Second},
		{Rate: 1_000_000, Period: time.Second},
		{Rate: 1, Period: sluice.MaxPeriod},
		{Algorithm: sluice.SlidingWindowLog, Rate: sluice.MaxLogEntries, Period: time.Hour},
	}
	for _, l := range ok {
		if err := l.Validate(); err != nil {
			t.Errorf("%#v: %v", l, err)
		}
	}
	bad := []sluice.Limit{
		{},
		{Rate: 1},
		{Period: time.Second},
		{Rate: 1, Period: time.Millisecond - 1},
		{Rate: 1, Period: sluice.MaxPeriod + time.Hour},
		{Rate: 1, Period: time.Second, Burst: -1},
		{Rate: 1, Period: time.Second, Burst: sluice.MaxRate + 1},
		{Rate: 2_000_000, Period: time.Second},                // faster than 1/µs
		{Rate: 1, Period: sluice.MaxPeriod, Burst: 1_000_000}, // burst span absurd
		// burst × interval wraps past 2^64 to 2^44: must not pass as small
		{Rate: 1, Period: (1 << 44) * time.Microsecond, Burst: 1<<20 + 1},
		{Algorithm: 200, Rate: 1, Period: time.Second}, // unknown algorithm
		{Algorithm: sluice.SlidingWindowCounter, Rate: 5, Period: time.Second, Burst: 6},
	}
	for _, l := range bad {
		if err := l.Validate(); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%#v: got %v, want ErrInvalidLimit", l, err)
		}
	}
}

func TestCapacityAndInterval(t *testing.T) {
	t.Parallel()
	if got := sluice.PerSecond(3).Interval(); got != 333334*time.Microsecond {
		t.Errorf("3/s interval = %v, want 333.334ms (rounded up)", got)
	}
	if got := sluice.PerMinute(100).Interval(); got != 600*time.Millisecond {
		t.Errorf("100/min interval = %v", got)
	}
	// Validate refuses these for their Rate or Period: no Interval. The
	// window algorithms accept a rate faster than one per µs.
	for _, l := range []sluice.Limit{
		sluice.PerSecond(1_500_000),
		{Rate: 1_000_000_000, Period: time.Millisecond},
		{Rate: 1, Period: time.Microsecond},
		{Rate: 1, Period: sluice.MaxPeriod + time.Microsecond},
		{Rate: 1, Period: time.Second + time.Nanosecond},
		{Rate: sluice.MaxRate + 1, Period: sluice.MaxPeriod},
		{Rate: 0, Period: time.Second},
	} {
		if got := l.Interval(); got != 0 || l.Validate() == nil {
			t.Errorf("%v: Interval %v, Validate %v; want 0 and a refusal", l, got, l.Validate())
		}
	}
	if l := sluice.PerSecond(1_500_000).WithAlgorithm(sluice.FixedWindow); l.Interval() != time.Microsecond || l.Validate() != nil {
		t.Errorf("%v: Interval %v, Validate %v; want 1µs and valid", l, l.Interval(), l.Validate())
	}
	if got := sluice.PerSecond(2).WithBurst(7).Capacity(); got != 7 {
		t.Errorf("capacity = %d, want 7", got)
	}
	if got := sluice.PerSecond(2).WithAlgorithm(sluice.FixedWindow).Capacity(); got != 2 {
		t.Errorf("fixed window capacity = %d, want 2", got)
	}
}

func TestAlgorithmText(t *testing.T) {
	t.Parallel()
	for _, a := range sluice.Algorithms() {
		b, err := a.MarshalText()
		if err != nil {
			t.Fatal(err)
		}
		var back sluice.Algorithm
		if err := back.UnmarshalText(b); err != nil || back != a {
			t.Errorf("%v: round trip gave %v, %v", a, back, err)
		}
	}
	if _, err := sluice.ParseAlgorithm("bogus"); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("bogus algorithm: %v", err)
	}
	var l sluice.Limit
	if err := l.UnmarshalText([]byte("leaky_bucket 5/s burst 9")); err != nil || l.Burst != 9 || l.Algorithm != sluice.LeakyBucket {
		t.Errorf("UnmarshalText: %#v %v", l, err)
	}
}

func TestValidateRequest(t *testing.T) {
	t.Parallel()
	l := sluice.PerMinute(10)
	cases := []struct {
		key  string
		cost int64
		want error
	}{
		{"", 1, sluice.ErrInvalidKey},
		{string(make([]byte, sluice.MaxKeyLen+1)), 1, sluice.ErrInvalidKey},
		{"k", 0, sluice.ErrInvalidCost},
		{"k", 11, sluice.ErrCostExceedsBurst},
		{"k", 10, nil},
	}
	for _, c := range cases {
		if err := sluice.ValidateRequest(c.key, l, c.cost); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("ValidateRequest(len %d, cost %d) = %v, want %v", len(c.key), c.cost, err, c.want)
		}
	}
}

// With stays one release as a deprecated alias of WithAlgorithm.
func TestWithIsWithAlgorithm(t *testing.T) {
	l := sluice.PerMinute(10)
	if got, want := l.With(sluice.FixedWindow), l.WithAlgorithm(sluice.FixedWindow); got != want || got.Algorithm != sluice.FixedWindow {
		t.Errorf("With = %v, WithAlgorithm = %v", got, want)
	}
}

// TestValidateRequests: each request is validated, and a key twice under
// one algorithm is refused, among few requests and among many.
func TestValidateRequests(t *testing.T) {
	l := sluice.PerSecond(10)
	for _, n := range []int{2, 8, 9, 1000} {
		reqs := make([]sluice.Request, n)
		for i := range reqs {
			reqs[i] = sluice.Request{Key: fmt.Sprintf("k%d", i), Limit: l, Cost: 1}
		}
		if err := sluice.ValidateRequests(reqs); err != nil {
			t.Errorf("%d distinct: %v", n, err)
		}
		// The same key under another algorithm is another state.
		reqs = append(reqs, sluice.Request{Key: "k0", Limit: l.WithAlgorithm(sluice.FixedWindow), Cost: 1})
		if err := sluice.ValidateRequests(reqs); err != nil {
			t.Errorf("%d, k0 under two algorithms: %v", n, err)
		}
		reqs = append(reqs, sluice.Request{Key: "k1", Limit: l, Cost: 1})
		err := sluice.ValidateRequests(reqs)
		if !errors.Is(err, sluice.ErrInvalidKey) || !strings.Contains(err.Error(), fmt.Sprintf("request %d", n+1)) {
			t.Errorf("%d with k1 twice: %v, want ErrInvalidKey naming request %d", n, err, n+1)
		}
		reqs[n+1].Cost = 0
		if err := sluice.ValidateRequests(reqs); !errors.Is(err, sluice.ErrInvalidCost) {
			t.Errorf("%d with a cost of 0: %v, want ErrInvalidCost", n, err)
		}
	}
}

// FuzzParseLimit: a limit string parses or is refused with
// ErrInvalidLimit, never panics; a limit that parses is valid and reads
// back from its String as itself (a burst equal to the rate is the
// default, which String leaves out).
func FuzzParseLimit(f *testing.F) {
	for _, s := range []string{"100/min", "10/s", "5000/1h", "30/90s", "1000/day", "10/s burst 20", "token_bucket 10/s burst 20",
		"sliding_window_log 300/5m", "fixed_window 5000/h", "2000000/s", "0.5s", "1/0.5s", "1/0h30m", "10/fortnight", "5/15m",
		"leaky_bucket 5/s burst 9", "1/366day", "1/367day", "9223372036854775807/s", "1/9223372036854775807ms", "burst 3", "/", " "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		l, err := sluice.ParseLimit(s)
		if err != nil {
			if !errors.Is(err, sluice.ErrInvalidLimit) {
				t.Fatalf("ParseLimit(%q): %v does not wrap ErrInvalidLimit", s, err)
			}
			return
		}
		if err := l.Validate(); err != nil {
			t.Fatalf("ParseLimit(%q) = %v, invalid: %v", s, l, err)
		}
		var back sluice.Limit
		if err := back.UnmarshalText([]byte(l.String())); err != nil {
			t.Fatalf("ParseLimit(%q) = %#v, written %q, which does not parse: %v", s, l, l.String(), err)
		}
		if l.Burst == l.Rate {
			l.Burst = 0
		}
		if back != l {
			t.Fatalf("ParseLimit(%q) = %#v, written %q, reads back as %#v", s, l, l.String(), back)
		}
	})
}
