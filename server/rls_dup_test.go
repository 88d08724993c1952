package server

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// Descriptors naming one counter whose hits together exceed its capacity
// are never admissible: over the limit with no Retry-After and no
// RateLimit (whose t would be a wait), as one such descriptor is. Against
// Redis, sluice-format and Envoy-format limits.
func TestRLSMergedHitsAboveCapacityNoRetryAfterRedis(t *testing.T) {
	store := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	svc := NewService(store, mustConfig(t, `
policies:
  - name: api
    limit: sliding_window_log 5/h
    key: "{api_key}"
---
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window_log}
`), nil)
	c := serveRLS(t, svc) // sliding logs: no window ends between the steps
	for _, tt := range []struct{ domain, entry string }{{"sluice", "api_key=d2"}, {"edge", "remote_address=9.9.9.9"}} {
		t.Run(tt.domain, func(t *testing.T) {
			send := func(hits ...uint64) (string, string, string, string) {
				t.Helper()
				req := rlsRequest(tt.domain)
				for _, h := range hits {
					d := desc(tt.entry)
					d.HitsAddend = wrapperspb.UInt64(h)
					req.Descriptors = append(req.Descriptors, d)
				}
				resp := call(t, c, req)
				return render(resp), rlsHeader(resp, "Retry-After"), rlsHeader(resp, "RateLimit"), rlsHeader(resp, "RateLimit-Policy")
			}
			got, retry, rl, pol := send(3, 3)
			if got != "OVER_LIMIT: OVER/5 OVER/5" || retry != "" || rl != "" || pol == "" {
				t.Errorf("hits 3 + 3 of 5: %s, Retry-After %q, RateLimit %q, RateLimit-Policy %q; want over, nothing taken, no wait, the policy told", got, retry, rl, pol)
			}
			// At the capacity together: admitted, nothing was taken before.
			if got, _, _, _ := send(2, 3); got != "OK: OK/0 OK/0" {
				t.Errorf("hits 2 + 3 of 5: %s, want both OK with 0 left", got)
			}
			// Within the capacity but over what is left: a wait admits it.
			got, retry, rl, _ = send(1, 1)
			if got != "OVER_LIMIT: OVER/0 OVER/0" || retry == "" || !strings.Contains(rl, ";t=") {
				t.Errorf("hits 1 + 1 on a full window: %s, Retry-After %q, RateLimit %q; want over with a wait", got, retry, rl)
			}
		})
	}
}
