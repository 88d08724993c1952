package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// /v1/stats' overview counts the last minute's decisions of this instance,
// per policy and in total, with rates; older buckets fall out.
func TestAPIStatsOverview(t *testing.T) {
	t.Parallel()
	e := newAPI(t, nil)
	for range 5 {
		e.do(t, "POST", "/v1/check", `{"policy":"fw","key":"a"}`, nil, "") // 3 allowed, 2 denied
	}
	e.clock.Set(t0.Add(OverviewWindow - StatsBucket)) // the first bucket is still in the window
	e.do(t, "POST", "/v1/check", `{"policy":"dry","key":"a"}`, nil, "")
	e.do(t, "POST", "/v1/check", `{"policy":"dry","key":"a"}`, nil, "") // shadow denial counts as denied
	var body struct {
		Instance       string      `json:"instance"`
		ConfigLoadedAt string      `json:"config_loaded_at"`
		Store          StoreHealth `json:"store"`
		Overview       Overview    `json:"overview"`
	}
	stats := func() {
		t.Helper()
		w := e.do(t, "GET", "/v1/stats", "", nil, "")
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatal(err)
		}
	}
	stats()
	o := body.Overview
	if o.Scope != "instance" || o.Instances != 1 || o.WindowMS != 60000 {
		t.Errorf("scope %q instances %d window %d: want this instance over 60000 ms", o.Scope, o.Instances, o.WindowMS)
	}
	if o.Allowed != 4 || o.Denied != 3 || o.DecisionsPerSecond != 7.0/60 || o.DeniedRatio != 3.0/7 {
		t.Errorf("overview %+v: want 4 allowed, 3 denied, 7/60 per second, ratio 3/7", o)
	}
	if len(o.Policies) != 3 || o.Policies[0].Policy != "fw" || o.Policies[0].Allowed != 3 || o.Policies[0].Denied != 2 {
		t.Errorf("policies %+v: want fw first with 3 allowed, 2 denied", o.Policies)
	}
	if o.Policies[0].LatencyP50MS <= 0 || o.Policies[2].LatencyP50MS != -1 {
		t.Errorf("latency: fw p50 %v (want a bound), heavy p50 %v (want -1: no decisions)", o.Policies[0].LatencyP50MS, o.Policies[2].LatencyP50MS)
	}
	if body.Store.Store != "memory" || body.Instance == "" {
		t.Errorf("store %+v instance %q", body.Store, body.Instance)
	}
	if at, err := time.Parse(time.RFC3339Nano, body.ConfigLoadedAt); err != nil || !at.Equal(t0) {
		t.Errorf("config_loaded_at %q (%v), want %v", body.ConfigLoadedAt, err, t0)
	}
	e.clock.Set(t0.Add(OverviewWindow))
	stats()
	if o := body.Overview; o.Allowed != 1 || o.Denied != 1 {
		t.Errorf("a window later: %d allowed, %d denied, want fw's bucket gone (1, 1)", o.Allowed, o.Denied)
	}
}

func TestPercentile(t *testing.T) {
	t.Parallel()
	counts := make([]int64, len(LatencyBoundsMS)+1)
	counts[3] = 98 // ≤ 1 ms
	counts[6] = 2  // ≤ 10 ms
	if got := percentileMS(counts, 0.5); got != 1 {
		t.Errorf("p50 = %v, want 1", got)
	}
	if got := percentileMS(counts, 0.99); got != 10 {
		t.Errorf("p99 = %v, want 10", got)
	}
	if got := percentileMS(make([]int64, len(counts)), 0.5); got != -1 {
		t.Errorf("no counts: %v, want -1", got)
	}
	var h latencyHist
	h.add(7, 700*time.Microsecond)
	h.add(8, 30*time.Second)
	if c := h.counts(8); c[3] != 1 || c[len(c)-1] != 1 {
		t.Errorf("counts %v: want one ≤ 1 ms and one beyond the last bound", c)
	}
	if c := h.counts(9); c[3] != 0 || c[len(c)-1] != 1 {
		t.Errorf("a generation later %v: want generation 7 gone", c)
	}
}

// /v1/top is an admin endpoint: the keys are clients' own.
func TestAPITop(t *testing.T) {
	t.Parallel()
	e := newAPI(t, &HandlerOptions{AdminToken: "tok"})
	for range 5 {
		e.do(t, "POST", "/v1/check", `{"policy":"fw","key":"203.0.113.9"}`, nil, "")
	}
	if w := e.do(t, "GET", "/v1/top", "", nil, ""); w.Code != 401 {
		t.Errorf("without the token: %d, want 401", w.Code)
	}
	w := e.do(t, "GET", "/v1/top", "", map[string]string{"Authorization": "Bearer tok"}, "")
	var body topResponse
	if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || w.Code != 200 {
		t.Fatalf("%d %s: %v", w.Code, w.Body, err)
	}
	if body.Scope != "instance" || len(body.Denials) != 1 || body.Denials[0].Key != "203.0.113.9" || body.Denials[0].Count != 2 {
		t.Errorf("top %+v: want this instance's one key denied twice", body)
	}
	if len(body.NearLimit) != 1 || body.NearLimit[0].Count != 3 {
		t.Errorf("near limit %+v: want 3 (the third allowed and two denied)", body.NearLimit)
	}
}

// /v1/ lists every endpoint of the OpenAPI document and links it.
func TestAPIIndex(t *testing.T) {
	t.Parallel()
	e := newAPI(t, nil)
	w := e.do(t, "GET", "/v1/", "", nil, "")
	var idx struct {
		OpenAPI   string `json:"openapi"`
		Endpoints []struct{ Method, Path string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &idx); err != nil || w.Code != 200 {
		t.Fatalf("%d %s: %v", w.Code, w.Body, err)
	}
	if idx.OpenAPI != "openapi.json" || w.Header().Get("Link") != `<openapi.json>; rel="service-desc"` {
		t.Errorf("openapi %q, Link %q", idx.OpenAPI, w.Header().Get("Link"))
	}
	if len(idx.Endpoints) < 12 {
		t.Errorf("%d endpoints listed: %+v", len(idx.Endpoints), idx.Endpoints)
	}
	if w := e.do(t, "GET", "/v1/openapi.json", "", nil, ""); w.Code != 200 || !json.Valid(w.Body.Bytes()) {
		t.Errorf("openapi.json: %d", w.Code)
	}
	if w := e.do(t, "POST", "/v1/", "", nil, ""); w.Code != 405 || w.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /v1/: %d, Allow %q", w.Code, w.Header().Get("Allow"))
	}
}

// TestWrongMethodOutsideV1: the endpoints beyond /v1/ answer a wrong method
// with a 405 problem too, not the dashboard's 404.
func TestWrongMethodOutsideV1(t *testing.T) {
	e := newAPI(t, &HandlerOptions{Metrics: NewMetrics()})
	for _, tt := range []struct{ method, path, allow string }{
		{"GET", "/json", "POST"},
		{"PUT", "/json", "POST"},
		{"POST", "/healthz", "GET, HEAD"},
		{"DELETE", "/readyz", "GET, HEAD"},
		{"POST", "/metrics", "GET, HEAD"},
		{"POST", "/v1/status", "GET, HEAD"},
		{"PUT", "/v1/policies", "GET, HEAD"},
		{"GET", "/v1/check", "POST"},
	} {
		w := e.do(t, tt.method, tt.path, "", nil, "")
		if w.Code != 405 || w.Header().Get("Allow") != tt.allow || w.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s %s: %d, Allow %q, Content-Type %q; want 405, %s, a problem", tt.method, tt.path, w.Code, w.Header().Get("Allow"), w.Header().Get("Content-Type"), tt.allow)
		}
		// Allow names every method the path serves, and only those.
		if head := e.do(t, "HEAD", tt.path, "", nil, ""); (head.Code != 405) != strings.Contains(tt.allow, "HEAD") {
			t.Errorf("HEAD %s: %d, but Allow says %q", tt.path, head.Code, tt.allow)
		}
	}
	for _, tt := range []struct{ method, path string }{{"GET", "/healthz"}, {"HEAD", "/readyz"}, {"GET", "/metrics"}} {
		if w := e.do(t, tt.method, tt.path, "", nil, ""); w.Code != 200 {
			t.Errorf("%s %s: %d", tt.method, tt.path, w.Code)
		}
	}
	// Without metrics, /metrics is no endpoint at all.
	if w := newAPI(t, nil).do(t, "POST", "/metrics", "", nil, ""); w.Code != 404 {
		t.Errorf("POST /metrics without metrics: %d, want 404", w.Code)
	}
}

// TestIndexReadyzSummary: /readyz is readiness under the failure policy,
// not "the store answers" (under local it stays ready while Redis is down).
func TestIndexReadyzSummary(t *testing.T) {
	w := newAPI(t, nil).do(t, "GET", "/v1/", "", nil, "")
	var idx struct {
		Endpoints []struct{ Method, Path, Summary string }
	}
	if err := json.Unmarshal(w.Body.Bytes(), &idx); err != nil {
		t.Fatal(err)
	}
	for _, e := range idx.Endpoints {
		if e.Path == "/readyz" && (!strings.Contains(e.Summary, "failure policy") || strings.Contains(e.Summary, "the store answers")) {
			t.Errorf("/readyz summary %q", e.Summary)
		}
	}
}
