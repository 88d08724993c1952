package httplimit

import (
	"net/http"
	"testing"
	"time"

	"sluice"
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
