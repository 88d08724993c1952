package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/race"
)

// apiCodes returns instance p's sluice_api_requests_total by code for
// one api and endpoint.
func apiCodes(t *testing.T, p *proc, api, endpoint string) map[string]float64 {
	t.Helper()
	code, body := p.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("metrics: %d", code)
	}
	out := map[string]float64{}
	prefix := `sluice_api_requests_total{api="` + api + `",code="`
	suffix := `",endpoint="` + endpoint + `"} `
	for line := range strings.SplitSeq(body, "\n") {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		c, n, ok := strings.Cut(rest, suffix)
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(n, 64)
		if err != nil {
			t.Fatalf("metric %s: %v", line, err)
		}
		out[c] = v
	}
	return out
}

// awaitRequests waits until instance p has counted n requests of api's
// endpoint, whatever their codes, and returns the counts by code.
func awaitRequests(t *testing.T, p *proc, api, endpoint string, n float64) map[string]float64 {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		codes := apiCodes(t, p, api, endpoint)
		var sum float64
		for _, v := range codes {
			sum += v
		}
		if sum >= n {
			return codes
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s %s: counted %v, want %v requests", api, endpoint, codes, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// hangUp sends a request to instance p and hangs up after d, before any
// answer: it fails the test if one came.
func hangUp(t *testing.T, p *proc, path, body string, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.http+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err == nil {
		resp.Body.Close()
		t.Fatalf("POST %s answered %d before the client hung up", path, resp.StatusCode)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("POST %s: %v, want the client's own deadline", path, err)
	}
}

// decisionCounts is /v1/stats' allowed, denied and errors of a policy,
// over every bucket.
func decisionCounts(t *testing.T, p *proc, policy string) (allowed, denied, errs int64) {
	t.Helper()
	code, body := p.get(t, "/v1/stats")
	if code != http.StatusOK {
		t.Fatalf("/v1/stats: %d %s", code, body)
	}
	var stats struct {
		Series []struct {
			Policy                  string
			Allowed, Denied, Errors []int64
		}
	}
	if err := json.Unmarshal([]byte(body), &stats); err != nil {
		t.Fatal(err)
	}
	sum := func(xs []int64) (n int64) {
		for _, x := range xs {
			n += x
		}
		return n
	}
	for _, s := range stats.Series {
		if s.Policy == policy {
			return sum(s.Allowed), sum(s.Denied), sum(s.Errors)
		}
	}
	t.Fatalf("/v1/stats has no series for %q: %s", policy, body)
	return
}

// topDenials is /v1/top's denied keys.
func topDenials(t *testing.T, p *proc) []any {
	t.Helper()
	code, body := p.get(t, "/v1/top")
	if code != http.StatusOK {
		t.Fatalf("/v1/top: %d %s", code, body)
	}
	var top struct{ Denials []any }
	if err := json.Unmarshal([]byte(body), &top); err != nil {
		t.Fatal(err)
	}
	return top.Denials
}

// TestFaultServeCheckClientGone: a /v1/check whose client hangs up while
// sluice serve waits for a stalled Redis, on a key already over its limit,
// is no decision and no store failure, under every failure policy: nothing
// is written (the request is counted in sluice_api_requests_total as 499,
// where it was a 503 telling a client long gone to retry), and neither
// the decisions metric, /v1/stats nor the top keys count it as denied or
// as an error.
func TestFaultServeCheckClientGone(t *testing.T) {
	race.SkipTiming(t)
	for _, policy := range []string{"local", "closed", "error"} {
		t.Run(policy, func(t *testing.T) {
			r := startRedis(t)
			f := startFleet(t, r.url(), 1, "policies:\n  - name: api\n    limit: fixed_window 1/1h\n",
				"--failure-policy", policy, "--decision-timeout", "2s")
			p := f.procs[0]
			if code, body := p.post(t, "/v1/check", `{"policy":"api","key":"k"}`); code != http.StatusOK {
				t.Fatalf("first check: %d %v", code, body)
			}
			r.pause(t)
			hangUp(t, p, "/v1/check", `{"policy":"api","key":"k"}`, 300*time.Millisecond)
			// Redis stays paused until the request is counted, so that it
			// never answers the check.
			codes := awaitRequests(t, p, "http", "POST /v1/check", 2)
			r.resume(t)
			if want := map[string]float64{"200": 1, "499": 1}; !equalCounts(codes, want) {
				t.Errorf("POST /v1/check counted by code %v, want %v", codes, want)
			}
			oneAllowedNothingElse(t, p, "api")
		})
	}
}

// oneAllowedNothingElse checks that policy counts one allowed decision and
// no denial or error anywhere: /v1/stats, sluice_decisions_total, /v1/top.
func oneAllowedNothingElse(t *testing.T, p *proc, policy string) {
	t.Helper()
	allowed, denied, errs := decisionCounts(t, p, policy)
	if allowed != 1 || denied != 0 || errs != 0 {
		t.Errorf("/v1/stats: allowed %d, denied %d, errors %d; want 1, 0, 0", allowed, denied, errs)
	}
	for _, outcome := range []string{"denied", "error"} {
		if got := metric(t, p, `sluice_decisions_total{outcome="`+outcome+`",policy="`+policy+`"}`); got > 0 {
			t.Errorf("sluice_decisions_total %s = %v, want none", outcome, got)
		}
	}
	if d := topDenials(t, p); len(d) != 0 {
		t.Errorf("/v1/top denials %v, want none", d)
	}
}

func equalCounts(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// TestCheckServerDeadlineWhileStoreWaits: the JSON API behind a handler
// that gives each request a deadline of its own (a server's choice, not
// the client's), on a stalled Redis: a check, a peek and a reset whose
// deadline passes while the store has not answered are a 503 problem
// without Retry-After, saying the deadline passed (it was a 503 "the store
// did not answer … try again shortly" with Retry-After), and the check is
// counted nowhere.
func TestCheckServerDeadlineWhileStoreWaits(t *testing.T) {
	r := startRedis(t)
	c := r.client()
	t.Cleanup(func() { c.Close() })
	svc := newRedisService(t, c, "policies:\n  - name: api\n    limit: fixed_window 1/1h\n")
	h := svc.Handler(nil)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 200*time.Millisecond)
		defer cancel()
		h.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(srv.Close)
	post := func(path, body string) (*http.Response, string) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b strings.Builder
		if _, err := io.Copy(&b, resp.Body); err != nil {
			t.Fatal(err)
		}
		return resp, b.String()
	}
	if resp, body := post("/v1/check", `{"policy":"api","key":"k"}`); resp.StatusCode != http.StatusOK {
		t.Fatalf("first check: %d %s", resp.StatusCode, body)
	}
	r.pause(t)
	defer r.resume(t)
	for _, path := range []string{"/v1/check", "/v1/peek", "/v1/reset"} {
		resp, body := post(path, `{"policy":"api","key":"k"}`)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "" ||
			resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(body, "deadline passed") {
			t.Errorf("%s: %d, Retry-After %q, %s %s; want 503 problem, no Retry-After, the deadline named",
				path, resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header.Get("Content-Type"), body)
		}
	}
	for _, s := range svc.Stats().Snapshot() {
		if s.Policy == "api" {
			var allowed, denied, errs int64
			for i := range s.Allowed {
				allowed, denied, errs = allowed+s.Allowed[i], denied+s.Denied[i], errs+s.Errors[i]
			}
			if allowed != 1 || denied != 0 || errs != 0 {
				t.Errorf("stats: allowed %d, denied %d, errors %d; want 1, 0, 0", allowed, denied, errs)
			}
		}
	}
}

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
	svc := newRedisService(t, rc, goneRLSConfig)
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

// TestFaultServeSlotClientGone: a /v1/acquire and a /v1/extend whose
// client hangs up while sluice serve waits for a stalled Redis are no
// store failure, under every failure policy: nothing is written (counted
// as 499, where each was a 503 to nobody), and neither /v1/stats nor the
// in-flight metrics count an error (each counted one).
func TestFaultServeSlotClientGone(t *testing.T) {
	race.SkipTiming(t)
	for _, policy := range []string{"local", "closed", "error"} {
		t.Run(policy, func(t *testing.T) {
			r := startRedis(t)
			f := startFleet(t, r.url(), 1, "policies:\n  - name: jobs\n    in_flight: {max: 1, hold: 30s}\n",
				"--failure-policy", policy, "--decision-timeout", "2s")
			p := f.procs[0]
			code, got := p.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
			token, _ := got["token"].(string)
			if code != http.StatusOK || token == "" {
				t.Fatalf("first acquire: %d %v", code, got)
			}
			r.pause(t)
			hangUp(t, p, "/v1/acquire", `{"policy":"jobs","key":"k"}`, 300*time.Millisecond)
			hangUp(t, p, "/v1/extend", `{"token":"`+token+`"}`, 300*time.Millisecond)
			// Redis stays paused until both are counted, so that it never
			// answers them.
			acquires := awaitRequests(t, p, "http", "POST /v1/acquire", 2)
			extends := awaitRequests(t, p, "http", "POST /v1/extend", 1)
			r.resume(t)
			if want := map[string]float64{"200": 1, "499": 1}; !equalCounts(acquires, want) {
				t.Errorf("POST /v1/acquire counted by code %v, want %v", acquires, want)
			}
			if want := map[string]float64{"499": 1}; !equalCounts(extends, want) {
				t.Errorf("POST /v1/extend counted by code %v, want %v", extends, want)
			}
			allowed, denied, errs := decisionCounts(t, p, "jobs")
			if allowed != 1 || denied != 0 || errs != 0 {
				t.Errorf("/v1/stats: allowed %d, denied %d, errors %d; want 1, 0, 0", allowed, denied, errs)
			}
			for _, name := range []string{
				`sluice_inflight_acquires_total{outcome="error",policy="jobs",priority="critical"}`,
				`sluice_inflight_acquires_total{outcome="denied",policy="jobs",priority="critical"}`,
				`sluice_inflight_calls_total{call="extend",outcome="error",policy="jobs"}`,
			} {
				if got := metric(t, p, name); got > 0 {
					t.Errorf("%s = %v, want none", name, got)
				}
			}
		})
	}
}
