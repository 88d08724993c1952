package server

import (
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/header"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// checkResetAgrees fails unless the head status's duration_until_reset
// is the reset the headers state: X-RateLimit-Reset is now plus it
// (rounded up, now somewhere in [before, after]), and an admitted
// response's RateLimit t is it in seconds.
func checkResetAgrees(t *testing.T, what string, resp *rlsv3.RateLimitResponse, before, after time.Time) time.Duration {
	t.Helper()
	d := resp.Statuses[0].GetDurationUntilReset().AsDuration()
	reset, err := strconv.ParseInt(rlsHeader(resp, "X-RateLimit-Reset"), 10, 64)
	if err != nil {
		t.Fatalf("%s: X-RateLimit-Reset: %v (headers %s)", what, err, headerList(resp))
	}
	if lo, hi := ceilUnix(before.Add(d)), ceilUnix(after.Add(d)); reset < lo || reset > hi {
		t.Errorf("%s: X-RateLimit-Reset %d, but duration_until_reset %v says %d..%d", what, reset, d, lo, hi)
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OK {
		if got, want := rlsHeader(resp, "RateLimit"), ";t="+strconv.FormatInt(header.CeilSeconds(d), 10); !strings.HasSuffix(got, want) {
			t.Errorf("%s: RateLimit %q, but duration_until_reset %v says %s", what, got, d, want)
		}
	}
	return d
}

func ceilUnix(t time.Time) int64 {
	if t.Nanosecond() > 0 {
		return t.Unix() + 1
	}
	return t.Unix()
}

// TestRLSResetAgreesWithHeaders: duration_until_reset and the headers'
// reset (X-RateLimit-Reset, RateLimit's t) are one figure, how long until
// the key is full again. A fixed-window key nothing has been taken from (a
// look, or hits above the capacity, which take nothing) is full already:
// 0 in both, where duration_until_reset said the window's end before.
func TestRLSResetAgreesWithHeaders(t *testing.T) {
	store := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	svc := NewService(store, mustConfig(t, `
domain: d
descriptors:
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 5}
---
domain: s
policies:
  - name: win
    limit: fixed_window 5/h
    key: "{k}"
  - name: g
    limit: 5/h
    key: "{g}"
`), nil)
	c := serveRLS(t, svc)
	hits := func(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(n)
		return d
	}
	do := func(what, domain string, d *rlcommon.RateLimitDescriptor, want rlsv3.RateLimitResponse_Code) time.Duration {
		t.Helper()
		before := time.Now()
		resp := call(t, c, rlsRequest(domain, d))
		after := time.Now()
		if resp.OverallCode != want {
			t.Fatalf("%s: %s, want %s", what, render(resp), want)
		}
		return checkResetAgrees(t, what, resp, before, after)
	}
	for _, tt := range []struct {
		what   string
		domain string
		d      *rlcommon.RateLimitDescriptor
		want   rlsv3.RateLimitResponse_Code
	}{
		{"Envoy fixed window, look", "d", hits(desc("fw=fresh"), 0), rlsv3.RateLimitResponse_OK},
		{"Envoy fixed window, hits above capacity", "d", hits(desc("fw=fresh"), 6), rlsv3.RateLimitResponse_OVER_LIMIT},
		{"sluice fixed window, look", "s", hits(desc("k=fresh"), 0), rlsv3.RateLimitResponse_OK},
		{"sluice fixed window, hits above capacity", "s", hits(desc("k=fresh"), 6), rlsv3.RateLimitResponse_OVER_LIMIT},
		{"gcra, look", "s", hits(desc("g=fresh"), 0), rlsv3.RateLimitResponse_OK},
	} {
		if got := do(tt.what, tt.domain, tt.d, tt.want); got != 0 {
			t.Errorf("%s of a key nothing was taken from: duration_until_reset %v, want 0 (full already)", tt.what, got)
		}
	}
	// Once a hit is counted, both say the window's end.
	do("Envoy fixed window, a hit", "d", desc("fw=used"), rlsv3.RateLimitResponse_OK)
	if got := do("Envoy fixed window, look after a hit", "d", hits(desc("fw=used"), 0), rlsv3.RateLimitResponse_OK); got <= 0 || got > time.Hour {
		t.Errorf("look after a hit: duration_until_reset %v, want the window's end", got)
	}
	if got := do("Envoy fixed window, hits above capacity after a hit", "d", hits(desc("fw=used"), 6), rlsv3.RateLimitResponse_OVER_LIMIT); got <= 0 || got > time.Hour {
		t.Errorf("hits above capacity after a hit: duration_until_reset %v, want the window's end", got)
	}
}
