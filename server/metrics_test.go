package server

import (
	"context"
	"net/http"
	"runtime"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// decisionCount is sluice_decisions_total for policy and outcome, or -1
// when there is no such series.
func decisionCount(t *testing.T, m *Metrics, policy, outcome string) float64 {
	t.Helper()
	return metricValue(t, m.Registry(), "sluice_decisions_total", map[string]string{"policy": policy, "outcome": outcome})
}

// Failed decisions count as outcome="error", and a reload that drops a
// policy drops its series.
func TestMetricsErrorsAndForget(t *testing.T) {
	m := NewMetrics()
	mem := memory.New(nil)
	t.Cleanup(func() { mem.Close() })
	svc := NewService(storetest.Down{Store: mem}, mustConfig(t, "policies:\n  - name: a\n    limit: 1/s\n  - name: b\n    limit: 1/s\n"), &ServiceOptions{Metrics: m})
	if _, err := svc.Check(context.Background(), "a", "k", 0); err == nil {
		t.Fatal("Check on a broken store succeeded")
	}
	if got := decisionCount(t, m, "a", "error"); got != 1 {
		t.Errorf(`decisions{policy="a",outcome="error"} = %v, want 1`, got)
	}
	svc.SetConfig(mustConfig(t, "policies:\n  - name: b\n    limit: 1/s\n"))
	if got := decisionCount(t, m, "a", "error"); got != -1 {
		t.Errorf("policy a's series survive its removal: %v", got)
	}
}

// A configured policy's series exist at 0 from its load, a reload's too,
// before any request: a series born at 1 shows Prometheus no increase, so
// SluiceInFlightReleaseErrors missed a process's first failed release and
// SluiceDenialRatioJump had no share an hour before to compare with while
// a policy had never denied.
func TestMetricsPolicySeriesFromLoad(t *testing.T) {
	m := NewMetrics()
	mem := memory.New(nil)
	t.Cleanup(func() { mem.Close() })
	svc := NewService(mem, mustConfig(t, "policies:\n  - name: api\n    limit: 1/s\n  - name: exports\n    key: \"{user}\"\n    in_flight: {max: 2, hold: 30s}\n"), &ServiceOptions{Metrics: m})
	zero := func(name string, labels map[string]string) {
		t.Helper()
		if got := metricValue(t, m.Registry(), name, labels); got != 0 {
			t.Errorf("%s%v = %v before any request, want 0 (-1: no series)", name, labels, got)
		}
	}
	zero("sluice_decisions_total", map[string]string{"policy": "api", "outcome": "denied"})
	zero("sluice_inflight_calls_total", map[string]string{"policy": "exports", "call": "release", "outcome": "error"})
	zero("sluice_inflight_calls_total", map[string]string{"policy": "exports", "call": "release", "outcome": "not_retried"})
	zero("sluice_inflight_expired_total", map[string]string{"policy": "exports"})
	svc.SetConfig(mustConfig(t, "policies:\n  - name: uploads\n    key: \"{user}\"\n    in_flight: {max: 2, hold: 30s}\n"))
	zero("sluice_inflight_calls_total", map[string]string{"policy": "uploads", "call": "release", "outcome": "error"})
	if got := decisionCount(t, m, "api", "denied"); got != -1 {
		t.Errorf("policy api's series survive its removal: %v", got)
	}
}

// Requests are counted and timed per API and endpoint; Envoy requests
// for an unknown domain and descriptors no rule matches are counted; the
// build is described.
func TestMetricsPerAPI(t *testing.T) {
	srv := startServer(t, Options{})
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	for range 2 {
		resp, err := http.Post("http://"+srv.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(`{"policy":"gcra","key":"k"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for _, path := range []string{"/v1/nowhere", "/v1/"} {
		if resp, err := http.Get("http://" + srv.HTTPAddr() + path); err == nil {
			resp.Body.Close()
		}
	}
	rls := dialRLS(t, srv.GRPCAddr())
	const domain = "sluice" // the demo configuration's
	for _, dom := range []string{"no-such-domain", domain} {
		_, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: dom, Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "no_such_key", Value: "v"}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
	}
	const rlsMethod = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	reg := srv.Metrics().Registry()
	tests := []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"sluice_api_requests_total", map[string]string{"api": "http", "endpoint": "POST /v1/check", "code": "200"}, 2},
		{"sluice_api_requests_total", map[string]string{"api": "http", "endpoint": "/v1/", "code": "404"}, 1},
		{"sluice_api_requests_total", map[string]string{"api": "http", "endpoint": "GET /v1/", "code": "200"}, 1},
		{"sluice_api_request_duration_seconds", map[string]string{"api": "http", "endpoint": "POST /v1/check"}, 2},
		{"sluice_api_requests_total", map[string]string{"api": "grpc", "endpoint": rlsMethod, "code": "OK"}, 2},
		{"sluice_api_request_duration_seconds", map[string]string{"api": "grpc", "endpoint": rlsMethod}, 2},
		{"sluice_rls_unknown_domain_requests_total", nil, 1},
		{"sluice_rls_unmatched_descriptors_total", map[string]string{"domain": domain}, 1},
		{"sluice_build_info", map[string]string{"goversion": runtime.Version()}, 1},
	}
	for _, tt := range tests {
		if got := metricValue(t, reg, tt.name, tt.labels); got != tt.want {
			t.Errorf("%s%v = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
}
