package server

import (
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestRLSBlockNoRetryAfter: a block (requests_per_unit: 0, or a limit of
// 0 the request carries) has capacity 0, so a hit is over it and no wait
// admits it: no Retry-After and no RateLimit (whose t on a denial is a
// wait), as for any hits above a limit's capacity, while X-RateLimit-Limit
// and RateLimit-Policy tell the capacity. Its reset is now:
// duration_until_reset 0 and X-RateLimit-Reset now. Before, a block said
// Retry-After and duration_until_reset of the window's end.
func TestRLSBlockNoRetryAfter(t *testing.T) {
	store := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	svc := NewService(store, mustConfig(t, `
domain: d
descriptors:
  - key: ip
    value: 10.0.0.1
    rate_limit: {unit: minute, requests_per_unit: 0, name: banned}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1}
`), nil)
	c := serveRLS(t, svc)
	override := func() *rlcommon.RateLimitDescriptor {
		d := desc("user=a")
		d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
		return d
	}
	for _, tt := range []struct {
		what   string
		d      func() *rlcommon.RateLimitDescriptor
		policy string
	}{
		{"requests_per_unit: 0", func() *rlcommon.RateLimitDescriptor { return desc("ip=10.0.0.1") }, `"banned";q=0;w=60`},
		{"carried limit of 0", override, `"d.override";q=0;w=60`},
	} {
		for _, hits := range []uint64{1, 3} {
			d := tt.d()
			d.HitsAddend = wrapperspb.UInt64(hits)
			before := time.Now()
			// Beside an enforced descriptor the request did not reach.
			resp := call(t, c, rlsRequest("d", d, desc("ip=10.0.0.2")))
			after := time.Now()
			if got := render(resp); got != "OVER_LIMIT: OVER/0 OK/1" {
				t.Errorf("%s, %d hits: %s, want the block over, the other untouched", tt.what, hits, got)
			}
			for _, h := range []string{"Retry-After", "RateLimit"} {
				if v := rlsHeader(resp, h); v != "" {
					t.Errorf("%s, %d hits: %s %q, but no wait admits a hit (headers %s)", tt.what, hits, h, v, headerList(resp))
				}
			}
			if got := rlsHeader(resp, "X-RateLimit-Limit"); got != "0" {
				t.Errorf("%s: X-RateLimit-Limit %q, want 0", tt.what, got)
			}
			if got := rlsHeader(resp, "RateLimit-Policy"); got != tt.policy {
				t.Errorf("%s: RateLimit-Policy %q, want %s", tt.what, got, tt.policy)
			}
			if got := checkResetAgrees(t, tt.what, resp, before, after); got != 0 {
				t.Errorf("%s: duration_until_reset %v, want 0 (a block never refills)", tt.what, got)
			}
		}
		// A look is admitted and says the same reset.
		d := tt.d()
		d.HitsAddend = wrapperspb.UInt64(0)
		before := time.Now()
		resp := call(t, c, rlsRequest("d", d))
		if got := checkResetAgrees(t, tt.what+", look", resp, before, time.Now()); resp.OverallCode != rlsv3.RateLimitResponse_OK || got != 0 {
			t.Errorf("%s, look: %s, duration_until_reset %v, want OK and 0", tt.what, render(resp), got)
		}
		if got, want := rlsHeader(resp, "RateLimit"), tt.policy[:len(tt.policy)-len(";q=0;w=60")]+";r=0;t=0"; got != want {
			t.Errorf("%s, look: RateLimit %q, want %s", tt.what, got, want)
		}
	}
}
