package header

import (
	"net/http"
	"net/url"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// fields are the wanted header values by name; "" means absent.
type fields = map[string]string

func TestSet(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	lim := sluice.PerMinute(100)
	tests := []struct {
		name   string
		policy string
		d      sluice.Decision
		want   fields
	}{
		{"allowed", "api", sluice.Decision{Allowed: true, Limit: lim, Remaining: 99, ResetAfter: 600 * time.Millisecond}, fields{RetryAfter: "", Limit: "100", Remaining: "99", Reset: "1700000001", Policy: `"api";q=100;w=60`, RateLimit: `"api";r=99;t=1`}},
		{"denied rounds up", "api", sluice.Decision{Limit: lim, RetryAfter: 11*time.Second + time.Microsecond, ResetAfter: 60 * time.Second}, fields{RetryAfter: "12", Remaining: "0", Reset: "1700000060", Policy: `"api";q=100;w=60`, RateLimit: `"api";r=0;t=12`}},
		{"denied exact second", "api", sluice.Decision{Limit: lim, RetryAfter: 12 * time.Second, ResetAfter: 12 * time.Second}, fields{RetryAfter: "12", RateLimit: `"api";r=0;t=12`}},
		{"denied sub-second is 1", "api", sluice.Decision{Limit: lim, RetryAfter: time.Microsecond}, fields{RetryAfter: "1"}},
		{"burst is the limit, a sub-second span per second", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Rate: 10, Period: 100 * time.Millisecond, Burst: 20}, Remaining: 19}, fields{Limit: "20", Policy: `"b";q=100;w=1`, RateLimit: `"b";r=19;t=0`, Reset: "1700000000"}},
		{"burst is the quota, over its refill", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Rate: 10, Period: time.Second, Burst: 20}, Remaining: 19}, fields{Limit: "20", Policy: `"b";q=20;w=2`, RateLimit: `"b";r=19;t=0`}},
		{"a sub-second window, per second", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 5, Period: 100 * time.Millisecond}, Remaining: 4}, fields{Policy: `"b";q=50;w=1`}},
		// A window comes back whole at its Period, whatever its Interval's
		// rounding: faster than one unit per µs, or a third of a second.
		{"a window's w is its period", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 3_000_000, Period: time.Second}}, fields{Policy: `"b";q=3000000;w=1`}},
		{"a window's w is its period, not rounded Intervals", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Algorithm: sluice.SlidingWindowCounter, Rate: 3, Period: time.Second}}, fields{Policy: `"b";q=3;w=1`}},
		{"a sub-second window faster than one unit per µs, per second", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 1_000_000_000, Period: time.Millisecond}}, fields{Policy: `"b";q=1000000000000;w=1`}},
		{"a sub-second window, the units a second brings", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 5, Period: 300 * time.Millisecond}}, fields{Policy: `"b";q=16;w=1`}},
		{"3/s comes back in a second, not 3 rounded-up intervals", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Rate: 3, Period: time.Second}}, fields{Policy: `"b";q=3;w=1`}},
		{"7 per 3s, burst 7", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 7, Period: 3 * time.Second}}, fields{Policy: `"b";q=7;w=3`}},
		{"burst 10 at 3/s refills in 3.33s", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Algorithm: sluice.LeakyBucket, Rate: 3, Period: time.Second, Burst: 10}}, fields{Policy: `"b";q=10;w=4`}},
		{"a window of 1.5s, rounded up", "b", sluice.Decision{Allowed: true, Limit: sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 7, Period: 1500 * time.Millisecond}}, fields{Policy: `"b";q=7;w=2`}},
		{"name escaped", "a\"b\\c\n\xff", sluice.Decision{Allowed: true, Limit: lim, Remaining: 1}, fields{RateLimit: `"a\"b\\c%0A%FF";r=1;t=0`}},
		{"non-ASCII percent-encoded", "café", sluice.Decision{Allowed: true, Limit: lim, Remaining: 1}, fields{RateLimit: `"caf%C3%A9";r=1;t=0`, Policy: `"caf%C3%A9";q=100;w=60`}},
		{"percent itself encoded", "caf%C3%A9", sluice.Decision{Allowed: true, Limit: lim, Remaining: 1}, fields{RateLimit: `"caf%25C3%25A9";r=1;t=0`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			All.Set(h, tt.policy, tt.d, now)
			for k, want := range tt.want {
				if got := h.Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
		})
	}
}

// TestWriteRuleFields covers the middleware's path: the rule's
// precomputed values, a decision under another limit (a local fallback's),
// and values that stay independent when a later handler appends to one.
func TestWriteRuleFields(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 500_000_000)
	f := NewFields("api", sluice.PerMinute(100))
	allowed := sluice.Decision{Allowed: true, Limit: sluice.PerMinute(100), Remaining: 1_234_567, ResetAfter: 1500 * time.Millisecond}
	tests := []struct {
		name string
		set  Selection
		d    sluice.Decision
		want fields
	}{
		{"allowed, standard fields", Standard, allowed, map[string]string{RetryAfter: "", Limit: "", Remaining: "", Reset: "", Policy: `"api";q=100;w=60`, RateLimit: `"api";r=1234567;t=2`}},
		{"allowed, all fields", All, allowed, map[string]string{RetryAfter: "", Limit: "100", Remaining: "1234567", Reset: "1700000002", Policy: `"api";q=100;w=60`, RateLimit: `"api";r=1234567;t=2`}},
		{"denied under a fallback limit, standard fields asked", Standard, sluice.Decision{Limit: sluice.PerMinute(25), RetryAfter: 2400 * time.Millisecond, ResetAfter: time.Minute}, fields{RetryAfter: "3", Limit: "25", Remaining: "0", Reset: "1700000061", Policy: `"api";q=25;w=60`, RateLimit: `"api";r=0;t=3`}},
		// One response states one limit: the share's, in the policy too.
		{"allowed under a fallback limit, standard fields", Standard, sluice.Decision{Allowed: true, Limit: sluice.PerMinute(25), Remaining: 20, ResetAfter: 12 * time.Second}, map[string]string{RetryAfter: "", Limit: "", Remaining: "", Reset: "", Policy: `"api";q=25;w=60`, RateLimit: `"api";r=20;t=12`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			Write(h, tt.set, f, tt.d, func() time.Time { return now })
			for _, k := range []string{RetryAfter, Limit, Remaining, Reset, Policy, RateLimit} {
				h.Add(k, "appended")
			}
			for k, want := range tt.want {
				got := h.Values(k)
				if want == "" {
					if len(got) != 1 {
						t.Errorf("%s = %q, want only the appended value", k, got)
					}
					continue
				}
				if len(got) != 2 || got[0] != want || got[1] != "appended" {
					t.Errorf("%s = %q, want [%q appended]", k, got, want)
				}
			}
		})
	}
}

// TestQuoteDistinct: names that differ only outside printable ASCII keep
// distinct header values, and decode back to themselves.
func TestQuoteDistinct(t *testing.T) {
	t.Parallel()
	names := []string{"café", "cafè", "caf??", "caf%C3%A9", "日本", "中国", "a\tb", "a\x7fb", "a%b"}
	seen := map[string]string{}
	for _, n := range names {
		q := Quote(n)
		if prev, dup := seen[q]; dup {
			t.Errorf("Quote(%q) = Quote(%q) = %s", n, prev, q)
		}
		seen[q] = n
		for i := 1; i < len(q)-1; i++ {
			if q[i] < 0x20 || q[i] > 0x7e {
				t.Errorf("Quote(%q) = %q holds byte %#x, not allowed in a structured-field string", n, q, q[i])
			}
		}
		unq, err := strconv.Unquote(q)
		if err != nil {
			t.Fatalf("Quote(%q) = %s: %v", n, q, err)
		}
		if dec, err := url.PathUnescape(unq); err != nil || dec != n {
			t.Errorf("Quote(%q) = %s decodes to %q, %v", n, q, dec, err)
		}
	}
}

// Set is exported (httplimit.SetHeaders) for decisions built outside the
// middleware: one whose limit is not valid (an Interval of 0) must still
// be written, not panic, and a wait too long for a Duration's arithmetic
// must not wrap around to a short one.
func TestSetOutsideValidLimits(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	for _, d := range []sluice.Decision{
		{Limit: sluice.Limit{Rate: 1 << 40, Period: time.Nanosecond}},
		{Allowed: true, Limit: sluice.Limit{Rate: 5_000_000, Period: time.Millisecond}},
	} {
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("Set(%v) panicked: %v", d.Limit, p)
				}
			}()
			All.Set(http.Header{}, "p", d, now)
		}()
	}
	long := time.Duration(1<<63 - 1)
	if got, want := CeilSeconds(long), int64(long/time.Second)+1; got != want {
		t.Errorf("CeilSeconds(%v) = %d, want %d", long, got, want)
	}
	h := http.Header{}
	All.Set(h, "p", sluice.Decision{Limit: sluice.PerMinute(1), RetryAfter: long}, now)
	if got, want := h.Get(RetryAfter), strconv.FormatInt(int64(long/time.Second)+1, 10); got != want {
		t.Errorf("Retry-After for a wait of %v: %q, want %q", long, got, want)
	}
}
