package httplimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func TestSetHeaders(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 0)
	lim := sluice.PerMinute(100)
	tests := []struct {
		name   string
		policy string
		d      sluice.Decision
		want   map[string]string // "" means absent
	}{
		{
			name:   "allowed",
			policy: "api",
			d:      sluice.Decision{Allowed: true, Limit: lim, Remaining: 99, ResetAfter: 600 * time.Millisecond},
			want: map[string]string{
				HeaderRetryAfter:      "",
				HeaderLimit:           "100",
				HeaderRemaining:       "99",
				HeaderReset:           "1700000001",
				HeaderRateLimitPolicy: `"api";q=100;w=60`,
				HeaderRateLimit:       `"api";r=99;t=1`,
			},
		},
		{
			name:   "denied rounds up",
			policy: "api",
			d:      sluice.Decision{Limit: lim, RetryAfter: 11*time.Second + time.Microsecond, ResetAfter: 60 * time.Second},
			want: map[string]string{
				HeaderRetryAfter:      "12",
				HeaderRemaining:       "0",
				HeaderReset:           "1700000060",
				HeaderRateLimitPolicy: `"api";q=100;w=60`,
				HeaderRateLimit:       `"api";r=0;t=12`,
			},
		},
		{
			name:   "denied exact second",
			policy: "api",
			d:      sluice.Decision{Limit: lim, RetryAfter: 12 * time.Second, ResetAfter: 12 * time.Second},
			want:   map[string]string{HeaderRetryAfter: "12", HeaderRateLimit: `"api";r=0;t=12`},
		},
		{
			name:   "denied sub-second is 1",
			policy: "api",
			d:      sluice.Decision{Limit: lim, RetryAfter: time.Microsecond},
			want:   map[string]string{HeaderRetryAfter: "1"},
		},
		{
			name:   "burst is the limit, sub-second window is 1",
			policy: "b",
			d:      sluice.Decision{Allowed: true, Limit: sluice.Limit{Rate: 10, Period: 100 * time.Millisecond, Burst: 20}, Remaining: 19},
			want: map[string]string{
				HeaderLimit:           "20",
				HeaderRateLimitPolicy: `"b";q=10;w=1`,
				HeaderRateLimit:       `"b";r=19;t=0`,
				HeaderReset:           "1700000000",
			},
		},
		{
			name:   "name escaped",
			policy: "a\"b\\c\n\xff",
			d:      sluice.Decision{Allowed: true, Limit: lim, Remaining: 1},
			want:   map[string]string{HeaderRateLimit: `"a\"b\\c??";r=1;t=0`},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			SetHeaders(h, tt.policy, tt.d, now)
			for k, want := range tt.want {
				if got := h.Get(k); got != want {
					t.Errorf("%s = %q, want %q", k, got, want)
				}
			}
		})
	}
}

// TestWriteHeadersRuleFields covers the middleware's path: the rule's
// precomputed values, a decision under another limit (a local fallback's),
// and values that stay independent when a later handler appends to one.
func TestWriteHeadersRuleFields(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_700_000_000, 500_000_000)
	f := newFields("api", sluice.PerMinute(100))
	allowed := sluice.Decision{Allowed: true, Limit: sluice.PerMinute(100), Remaining: 1_234_567, ResetAfter: 1500 * time.Millisecond}
	tests := []struct {
		name string
		set  HeaderSet
		d    sluice.Decision
		want map[string]string // "" means absent
	}{
		{
			name: "allowed, standard fields",
			set:  StandardHeaders,
			d:    allowed,
			want: map[string]string{
				HeaderRetryAfter:      "",
				HeaderLimit:           "",
				HeaderRemaining:       "",
				HeaderReset:           "",
				HeaderRateLimitPolicy: `"api";q=100;w=60`,
				HeaderRateLimit:       `"api";r=1234567;t=2`,
			},
		},
		{
			name: "allowed, all fields",
			set:  AllHeaders,
			d:    allowed,
			want: map[string]string{
				HeaderRetryAfter:      "",
				HeaderLimit:           "100",
				HeaderRemaining:       "1234567",
				HeaderReset:           "1700000002",
				HeaderRateLimitPolicy: `"api";q=100;w=60`,
				HeaderRateLimit:       `"api";r=1234567;t=2`,
			},
		},
		{
			name: "denied under a fallback limit, standard fields asked",
			set:  StandardHeaders,
			d:    sluice.Decision{Limit: sluice.PerMinute(25), RetryAfter: 2400 * time.Millisecond, ResetAfter: time.Minute},
			want: map[string]string{
				HeaderRetryAfter:      "3",
				HeaderLimit:           "25",
				HeaderRemaining:       "0",
				HeaderReset:           "1700000061",
				HeaderRateLimitPolicy: `"api";q=100;w=60`,
				HeaderRateLimit:       `"api";r=0;t=3`,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := http.Header{}
			writeHeaders(h, tt.set, f, tt.d, func() time.Time { return now })
			for _, k := range []string{HeaderRetryAfter, HeaderLimit, HeaderRemaining, HeaderReset, HeaderRateLimitPolicy, HeaderRateLimit} {
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
