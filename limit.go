package sluice

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Bounds that Validate enforces. They keep every quantity an exact integer
// in Redis Lua's double-precision numbers (below 2^53) and keep per-key
// memory sane.
const (
	MaxRate       = 1_000_000_000    // Rate and Burst upper bound
	MaxLogEntries = 100_000          // SlidingWindowLog: at most this many entries per key
	MinPeriod     = time.Millisecond // shortest Period
	MaxPeriod     = 366 * 24 * time.Hour
	MaxKeyLen     = 512            // bytes of the key a store is given (a Limiter's Prefix included)
	maxBurstSpan  = int64(1) << 52 // µs; Burst×Interval must stay below this
)

// MaxClockSkew is how far a caller's clock may lag state that another wrote
// (another host's clock, or Redis's TIME after a failover) and still be
// charged as at that state's time: the window algorithms charge it in the
// newer window rather than reopen an older one. A stored window further
// ahead than that was written under another Period (a policy reloaded with
// a new Limit on the same key) and is read as expired: the key starts fresh
// in the caller's window. So is a GCRA TAT more than MaxClockSkew past the
// limit's burst span; within it, the TAT is waited out, so after a change
// that shortens the span a GCRA key may wait up to MaxClockSkew longer
// than the new limit alone would ask.
const MaxClockSkew = time.Minute

// Limit is a rate-limit policy: Rate units per Period, enforced by Algorithm.
// It is a plain value: build one with PerSecond, PerMinute, PerHour or
// ParseLimit and pass it with every call, so one Store serves many policies.
//
// For GCRA, TokenBucket and LeakyBucket, Burst is the capacity: how many
// units can be taken at once from a full state. Zero means Burst = Rate. The
// window algorithms have no separate burst; their capacity is Rate and
// Burst must be zero or equal to Rate.
type Limit struct {
	Algorithm Algorithm
	Rate      int64
	Period    time.Duration
	Burst     int64
}

// PerSecond returns a GCRA limit of rate units per second, burst rate.
func PerSecond(rate int64) Limit { return Limit{Rate: rate, Period: time.Second} }

// PerMinute returns a GCRA limit of rate units per minute, burst rate.
func PerMinute(rate int64) Limit { return Limit{Rate: rate, Period: time.Minute} }

// PerHour returns a GCRA limit of rate units per hour, burst rate.
func PerHour(rate int64) Limit { return Limit{Rate: rate, Period: time.Hour} }

// WithAlgorithm returns a copy of l enforced by algorithm a.
func (l Limit) WithAlgorithm(a Algorithm) Limit { l.Algorithm = a; return l }

// With is WithAlgorithm.
//
// Deprecated: use WithAlgorithm, which says what it sets. With will be
// removed in the next release.
func (l Limit) With(a Algorithm) Limit { return l.WithAlgorithm(a) }

// WithBurst returns a copy of l with the given burst.
func (l Limit) WithBurst(burst int64) Limit { l.Burst = burst; return l }

// Capacity is the most units one call may take, and Remaining when the key is
// fresh: Burst (or Rate when Burst is zero) for the bucket algorithms and
// GCRA, Rate for the window algorithms.
func (l Limit) Capacity() int64 {
	if l.Burst == 0 || l.Algorithm.windowed() {
		return l.Rate
	}
	return l.Burst
}

// Interval is the time one unit takes to come back under the bucket
// algorithms and GCRA: Period/Rate rounded up to a whole microsecond, so a
// limit is never exceeded. It is exact when Period in µs is a multiple of
// Rate ("100/min": 600ms); "3/s" gives 333,334µs. A Limit that Validate
// refuses for its Rate or Period has none: 0. That includes a Rate faster
// than one per microsecond under the bucket algorithms and GCRA; the
// window algorithms accept one (and do not count in Intervals): 1µs.
func (l Limit) Interval() time.Duration {
	p := l.Period.Microseconds()
	if l.Rate < 1 || l.Rate > MaxRate || l.Period < MinPeriod || l.Period > MaxPeriod ||
		l.Period%time.Microsecond != 0 || l.Rate > p && !l.Algorithm.windowed() {
		return 0
	}
	return time.Duration((p+l.Rate-1)/l.Rate) * time.Microsecond
}

// Validate reports whether l can be enforced. Errors wrap ErrInvalidLimit.
func (l Limit) Validate() error {
	switch {
	case !l.Algorithm.Valid():
		return fmt.Errorf("%w: unknown algorithm %d", ErrInvalidLimit, uint8(l.Algorithm))
	case l.Rate < 1:
		return fmt.Errorf("%w: rate %d must be at least 1", ErrInvalidLimit, l.Rate)
	case l.Rate > MaxRate:
		return fmt.Errorf("%w: rate %d exceeds %d", ErrInvalidLimit, l.Rate, MaxRate)
	case l.Period < MinPeriod:
		return fmt.Errorf("%w: period %v is shorter than %v", ErrInvalidLimit, l.Period, MinPeriod)
	case l.Period > MaxPeriod:
		return fmt.Errorf("%w: period %v exceeds %v", ErrInvalidLimit, l.Period, MaxPeriod)
	case l.Period%time.Microsecond != 0:
		return fmt.Errorf("%w: period %v is not a whole number of microseconds", ErrInvalidLimit, l.Period)
	case l.Burst < 0:
		return fmt.Errorf("%w: burst %d must be at least 1", ErrInvalidLimit, l.Burst)
	case l.Burst > MaxRate:
		return fmt.Errorf("%w: burst %d exceeds %d", ErrInvalidLimit, l.Burst, MaxRate)
	}
	if l.Algorithm.windowed() {
		if l.Burst != 0 && l.Burst != l.Rate {
			return fmt.Errorf("%w: %v has no separate burst (burst %d, rate %d)", ErrInvalidLimit, l.Algorithm, l.Burst, l.Rate)
		}
		if l.Algorithm == SlidingWindowLog && l.Rate > MaxLogEntries {
			return fmt.Errorf("%w: sliding_window_log keeps one entry per unit; rate %d exceeds %d", ErrInvalidLimit, l.Rate, MaxLogEntries)
		}
		return nil
	}
	if l.Rate > l.Period.Microseconds() {
		return fmt.Errorf("%w: rate %d per %v is faster than one per microsecond", ErrInvalidLimit, l.Rate, l.Period)
	}
	// Divide rather than multiply: the product can wrap past 2^63 into a
	// small positive number.
	if l.Capacity() > (maxBurstSpan-1)/l.Interval().Microseconds() {
		return fmt.Errorf("%w: burst %d × interval %v is too long", ErrInvalidLimit, l.Capacity(), l.Interval())
	}
	return nil
}

// ValidateRequest checks everything a store checks before it touches its
// backend: the key, the limit and the cost. Stores call it first; callers
// may call it to reject input early.
func ValidateRequest(key string, l Limit, cost int64) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := l.Validate(); err != nil {
		return err
	}
	return l.ValidateCost(cost)
}

// ValidateRequests checks a TakeAll's requests as stores do: each as
// ValidateRequest does, and no key twice under one algorithm (one state
// cannot be checked as two), which wraps ErrInvalidKey. Errors name the
// request's index. Its cost grows with len(reqs), not its square.
func ValidateRequests(reqs []Request) error {
	type state struct {
		key string
		alg Algorithm
	}
	var seen map[state]int
	if len(reqs) > 8 {
		seen = make(map[state]int, len(reqs))
	}
	for i, r := range reqs {
		if err := ValidateRequest(r.Key, r.Limit, r.Cost); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		dup := false
		if seen != nil {
			st := state{r.Key, r.Limit.Algorithm}
			_, dup = seen[st]
			seen[st] = i
		} else {
			for _, prev := range reqs[:i] {
				dup = dup || prev.Key == r.Key && prev.Limit.Algorithm == r.Limit.Algorithm
			}
		}
		if dup {
			return fmt.Errorf("request %d: %w: %q appears twice under %v", i, ErrInvalidKey, r.Key, r.Limit.Algorithm)
		}
	}
	return nil
}

// ValidateKey rejects empty keys and keys longer than MaxKeyLen bytes.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if len(key) > MaxKeyLen {
		return fmt.Errorf("%w: key of %d bytes exceeds %d", ErrInvalidKey, len(key), MaxKeyLen)
	}
	return nil
}

// ValidateCost rejects costs below 1 (ErrInvalidCost) and above Capacity
// (ErrCostExceedsBurst), which could never be admitted.
func (l Limit) ValidateCost(cost int64) error {
	if cost < 1 {
		return fmt.Errorf("%w: %d must be at least 1", ErrInvalidCost, cost)
	}
	if c := l.Capacity(); cost > c {
		return fmt.Errorf("%w: cost %d, capacity %d", ErrCostExceedsBurst, cost, c)
	}
	return nil
}

// String formats l as ParseLimit reads it: "100/min", "10/s burst 20",
// "fixed_window 5000/h". The algorithm is omitted when it is GCRA.
func (l Limit) String() string {
	var b strings.Builder
	if l.Algorithm != GCRA {
		b.WriteString(l.Algorithm.String())
		b.WriteByte(' ')
	}
	b.WriteString(strconv.FormatInt(l.Rate, 10))
	b.WriteByte('/')
	b.WriteString(formatPeriod(l.Period))
	if l.Burst != 0 && l.Burst != l.Rate {
		b.WriteString(" burst ")
		b.WriteString(strconv.FormatInt(l.Burst, 10))
	}
	return b.String()
}

// MarshalText implements encoding.TextMarshaler with String's form.
func (l Limit) MarshalText() ([]byte, error) { return []byte(l.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseLimit.
func (l *Limit) UnmarshalText(b []byte) error {
	v, err := ParseLimit(string(b))
	if err != nil {
		return err
	}
	*l = v
	return nil
}

var periodUnits = []struct {
	names []string
	d     time.Duration
}{
	{[]string{"ms", "msec", "millisecond", "milliseconds"}, time.Millisecond},
	{[]string{"s", "sec", "secs", "second", "seconds"}, time.Second},
	{[]string{"m", "min", "mins", "minute", "minutes"}, time.Minute},
	{[]string{"h", "hr", "hrs", "hour", "hours"}, time.Hour},
	{[]string{"d", "day", "days"}, 24 * time.Hour},
}

func formatPeriod(d time.Duration) string {
	switch d {
	case time.Second:
		return "s"
	case time.Minute:
		return "min"
	case time.Hour:
		return "h"
	case 24 * time.Hour:
		return "day"
	}
	if d > 0 && d%(24*time.Hour) == 0 {
		return strconv.FormatInt(int64(d/(24*time.Hour)), 10) + "day"
	}
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// ParseLimit parses the forms people write in config:
//
//	100/min    10/s    5000/1h    30/90s    1000/day    10/s burst 20
//	token_bucket 10/s burst 20    sliding_window_log 300/5m
//
// A leading algorithm name is optional (GCRA when absent). Units: ms, s/sec,
// m/min, h/hr/hour, d/day, optionally preceded by a count ("5min"), or any
// Go duration ("1m30s"). The result is validated; errors wrap
// ErrInvalidLimit.
func ParseLimit(s string) (Limit, error) {
	var l Limit
	fields := strings.Fields(strings.ToLower(s))
	if len(fields) > 0 && fields[0] != "" && isLetter(fields[0][0]) {
		a, err := ParseAlgorithm(fields[0])
		if err != nil {
			return Limit{}, fmt.Errorf("%w: %q: unknown algorithm %q", ErrInvalidLimit, s, fields[0])
		}
		l.Algorithm = a
		fields = fields[1:]
	}
	var rateExpr string
	for len(fields) > 0 && fields[0] != "burst" {
		rateExpr += fields[0]
		fields = fields[1:]
	}
	if len(fields) > 0 { // "burst N"
		if len(fields) != 2 {
			return Limit{}, fmt.Errorf("%w: %q: want \"burst N\" at the end", ErrInvalidLimit, s)
		}
		b, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil || b < 1 {
			return Limit{}, fmt.Errorf("%w: %q: burst %q is not a positive integer", ErrInvalidLimit, s, fields[1])
		}
		l.Burst = b
	}
	num, unit, ok := strings.Cut(rateExpr, "/")
	if !ok {
		return Limit{}, fmt.Errorf("%w: %q: want RATE/PERIOD such as 100/min", ErrInvalidLimit, s)
	}
	rate, err := strconv.ParseInt(num, 10, 64)
	if err != nil {
		return Limit{}, fmt.Errorf("%w: %q: rate %q is not an integer", ErrInvalidLimit, s, num)
	}
	l.Rate = rate
	if l.Period, err = parsePeriod(unit); err != nil {
		return Limit{}, fmt.Errorf("%w: %q: %v", ErrInvalidLimit, s, err)
	}
	if err := l.Validate(); err != nil {
		return Limit{}, fmt.Errorf("%w (in %q)", err, s)
	}
	return l, nil
}

func parsePeriod(s string) (time.Duration, error) {
	i := 0
	for i < len(s) && s[i] >= '0' && s[i] <= '9' {
		i++
	}
	count := int64(1)
	if i > 0 {
		n, err := strconv.ParseInt(s[:i], 10, 64)
		if err != nil || n < 1 {
			// "0.5s" and "0h30m" are Go durations whose whole part is 0.
			if d, derr := time.ParseDuration(s); derr == nil {
				return positivePeriod(s, d)
			}
			if err == nil {
				return 0, fmt.Errorf("period %q: a period must be positive", s)
			}
			return 0, fmt.Errorf("period %q: bad count", s)
		}
		count = n
	}
	for _, u := range periodUnits {
		for _, name := range u.names {
			if s[i:] == name {
				if count > int64(MaxPeriod/u.d) {
					return 0, fmt.Errorf("period %q exceeds %v", s, MaxPeriod)
				}
				return time.Duration(count) * u.d, nil
			}
		}
	}
	if d, err := time.ParseDuration(s); err == nil {
		return positivePeriod(s, d)
	}
	return 0, fmt.Errorf("period %q: unknown unit (want ms, s, min, h, day or a Go duration)", s)
}

func positivePeriod(s string, d time.Duration) (time.Duration, error) {
	if d <= 0 {
		return 0, fmt.Errorf("period %q: a period must be positive", s)
	}
	return d, nil
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' }
