package server

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

const goneRLSConfig = `
domain: api
policies:
  - name: api
    limit: fixed_window 1/1h
    key: "{user}"
`

const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// TestFaultServeRLSClientGone: an Envoy RLS call whose caller cancels it
// while sluice serve waits for a stalled Redis, on a key over its limit,
// returns the context's code (Canceled), as grpclimit does, where it
// returned UNAVAILABLE, a store failure, in sluice_api_requests_total; the
// same request through /json is answered nothing (counted as 499, was a
// 503). Neither is counted as denied or as an error anywhere.
func TestFaultServeRLSClientGone(t *testing.T) {
	race.SkipTiming(t)
	for _, policy := range []string{"local", "closed", "error"} {
		t.Run(policy, func(t *testing.T) {
			r := startRedis(t)
			f := startFleet(t, r.url(), 1, goneRLSConfig, "--failure-policy", policy, "--decision-timeout", "2s")
			p := f.procs[0]
			c := dialRLS(t, p.grpc)
			req := rlsRequest("api", desc("user=k"))
			if got := render(call(t, c, req)); got != "OK: OK/0" {
				t.Fatalf("first call: %s", got)
			}
			r.pause(t)
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*time.Millisecond, cancel)
			if resp, err := c.ShouldRateLimit(ctx, req); status.Code(err) != codes.Canceled {
				t.Fatalf("ShouldRateLimit, cancelled while Redis is paused: %v, %v; want Canceled", render(resp), err)
			}
			hangUp(t, p, "/json", `{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"k"}]}]}`, 300*time.Millisecond)
			// Redis stays paused until both are counted, so that it never
			// answers them.
			grpcCodes := awaitRequests(t, p, "grpc", shouldRateLimit, 2)
			jsonCodes := awaitRequests(t, p, "http", "POST /json", 1)
			r.resume(t)
			if want := map[string]float64{"OK": 1, "Canceled": 1}; !equalCounts(grpcCodes, want) {
				t.Errorf("ShouldRateLimit counted by code %v, want %v", grpcCodes, want)
			}
			if want := map[string]float64{"499": 1}; !equalCounts(jsonCodes, want) {
				t.Errorf("POST /json counted by code %v, want %v", jsonCodes, want)
			}
			oneAllowedNothingElse(t, p, "api")
		})
	}
}

// TestRLSDeadlineWhileStoreWaits: the RLS registered on a gRPC server of
// one's own that gives each call a deadline (no store budget taken from
// it), on a stalled Redis: a call whose deadline passes while the store
// has not answered gets DEADLINE_EXCEEDED, not UNAVAILABLE, a store
// failure; and /json behind a handler that sets a deadline of its own
// answers a 503 problem naming it, without Retry-After (was the store
// failure's, with Retry-After: 1).
func TestRLSDeadlineWhileStoreWaits(t *testing.T) {
	r := startRedis(t)
	rc := r.client()
	t.Cleanup(func() { rc.Close() })
	store := redisstore.New(rc, &redisstore.Options{Prefix: redistest.Prefix(t)})
	svc := NewService(store, mustConfig(t, goneRLSConfig), nil)
	c := serveRLS(t, svc, grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		ctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		return h(ctx, req)
	}))
	h := svc.Handler(nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 200*time.Millisecond)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(srv.Close)

	req := rlsRequest("api", desc("user=k"))
	if got := render(call(t, c, req)); got != "OK: OK/0" {
		t.Fatalf("first call: %s", got)
	}
	r.pause(t)
	defer r.resume(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.ShouldRateLimit(ctx, req); status.Code(err) != codes.DeadlineExceeded || ctx.Err() != nil {
		t.Errorf("ShouldRateLimit past the server's deadline: %v; want DeadlineExceeded from the server", err)
	}

	resp, err := http.Post(srv.URL+"/json", "application/json", strings.NewReader(`{"domain":"api","descriptors":[{"entries":[{"key":"user","value":"k"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "" ||
		resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(string(body), "deadline passed") {
		t.Errorf("/json: %d, Retry-After %q, %s %s; want 503 problem, no Retry-After, the deadline named",
			resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Content-Type"), body)
	}
}
