package server

import (
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/redistest"
)

// A key longer than a store key may be is hashed over Envoy RLS; the JSON
// API must hash it the same way, so that both front ends share its counter.
func TestLongKeySharedByRLSAndJSON(t *testing.T) {
	addr := redistest.Addr(t)
	cfg := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: fixed_window 3/1h\n    key: \"{user}\"\n")
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + addr + "/0"})
	p := &proc{http: srv.HTTPAddr()}
	rls := dialRLS(t, srv.GRPCAddr())
	key := redistest.Prefix(t) + strings.Repeat("u", 600)

	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK} {
		r := call(t, rls, rlsRequest("d", desc("user="+key)))
		if r.OverallCode != want || r.Statuses[0].LimitRemaining != uint32(2-i) {
			t.Fatalf("RLS take %d: %v, remaining %d", i+1, r.OverallCode, r.Statuses[0].LimitRemaining)
		}
	}
	body := `{"policy":"api","key":"` + key + `"}`
	if code, m := p.post(t, "/v1/peek", body); code != 200 || m["remaining"] != 1.0 {
		t.Fatalf("peek after two RLS takes: %d %v, want 200 with remaining 1", code, m)
	}
	if code, m := p.post(t, "/v1/check", body); code != 200 || m["remaining"] != 0.0 {
		t.Fatalf("check after two RLS takes: %d %v, want 200 with remaining 0", code, m)
	}
	if r := call(t, rls, rlsRequest("d", desc("user="+key))); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("RLS after the JSON check: %v, want OVER_LIMIT", r.OverallCode)
	}
	if code, m := p.post(t, "/v1/reset", body); code/100 != 2 {
		t.Fatalf("reset: %d %v", code, m)
	}
	if r := call(t, rls, rlsRequest("d", desc("user="+key))); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("RLS after the JSON reset: %v remaining %d, want OK with 2", r.OverallCode, r.Statuses[0].LimitRemaining)
	}
}
