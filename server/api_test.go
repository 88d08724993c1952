package server

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

const apiConfig = `
domain: web
policies:
  - name: fw
    limit: fixed_window 3/10s
  - name: dry
    limit: 1/min
    strategy: shadow
  - name: heavy
    limit: token_bucket 10/s burst 4
    cost: 2
`

type apiEnv struct {
	svc   *Service
	h     http.Handler
	clock *fakeClock
}

func newAPI(t *testing.T, opts *HandlerOptions) *apiEnv {
	t.Helper()
	clock := newFakeClock()
	svc := newMemService(t, apiConfig, clock)
	return &apiEnv{svc: svc, h: svc.Handler(opts), clock: clock}
}

// do sends one request as a loopback client unless remote is set.
func (e *apiEnv) do(t *testing.T, method, path, body string, hdr map[string]string, remote string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, path, strings.NewReader(body))
	r.RemoteAddr = "127.0.0.1:40000"
	r.Host = "127.0.0.1:8080" // as a loopback client addresses the server
	if method == "POST" {
		r.Header.Set("Content-Type", "application/json")
	}
	if remote != "" {
		r.RemoteAddr = remote
	}
	for k, v := range hdr {
		r.Header.Set(k, v)
	}
	if h, ok := hdr["Host"]; ok {
		r.Host = h
	}
	w := httptest.NewRecorder()
	e.h.ServeHTTP(w, r)
	return w
}

func decodeBody(t *testing.T, w *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &m); err != nil {
		t.Fatalf("body %q: %v", w.Body.String(), err)
	}
	return m
}

func TestAPIPolicies(t *testing.T) {
	e := newAPI(t, nil)
	w := e.do(t, "GET", "/v1/policies", "", nil, "")
	if w.Code != 200 {
		t.Fatalf("status %d", w.Code)
	}
	var got struct{ Policies []policyJSON }
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := []policyJSON{
		{"fw", "fixed_window", "fixed_window 3/10s", 3, 10000, 3, false, 0},
		{"dry", "gcra", "1/min", 1, 60000, 1, true, 0},
		{"heavy", "token_bucket", "token_bucket 10/s burst 4", 10, 1000, 4, false, 0},
	}
	if len(got.Policies) != len(want) {
		t.Fatalf("got %+v", got.Policies)
	}
	for i := range want {
		if got.Policies[i] != want[i] {
			t.Errorf("policy %d = %+v, want %+v", i, got.Policies[i], want[i])
		}
	}
}

func TestAPICheck(t *testing.T) {
	e := newAPI(t, nil)
	e.clock.Set(t0.Add(4 * time.Second))
	steps := []struct {
		name, path, body string
		code             int
		want             string // compact JSON of the body
		retryAfter       string
	}{
		{"allowed", "/v1/check", `{"policy":"fw","key":"k"}`, 200,
			`{"policy":"fw","key":"k","allowed":true,"limit":3,"remaining":2,"retry_after_ms":0,"reset_after_ms":6000}`, ""},
		{"cost", "/v1/check", `{"policy":"fw","key":"k","cost":2}`, 200,
			`{"policy":"fw","key":"k","allowed":true,"limit":3,"remaining":0,"retry_after_ms":0,"reset_after_ms":6000}`, ""},
		{"denied", "/v1/check", `{"policy":"fw","key":"k"}`, 429,
			`{"policy":"fw","key":"k","allowed":false,"limit":3,"remaining":0,"retry_after_ms":6000,"reset_after_ms":6000}`, "6"},
		{"peek is 200 and takes nothing", "/v1/peek", `{"policy":"fw","key":"other"}`, 200,
			`{"policy":"fw","key":"other","allowed":true,"limit":3,"remaining":3,"retry_after_ms":0,"reset_after_ms":0}`, ""},
		{"peek of a denied key", "/v1/peek", `{"policy":"fw","key":"k"}`, 200,
			`{"policy":"fw","key":"k","allowed":false,"limit":3,"remaining":0,"retry_after_ms":6000,"reset_after_ms":6000}`, "6"},
		{"shadow allows", "/v1/check", `{"policy":"dry","key":"k"}`, 200,
			`{"policy":"dry","key":"k","allowed":true,"limit":1,"remaining":0,"retry_after_ms":0,"reset_after_ms":60000}`, ""},
		{"shadow denial is 200", "/v1/check", `{"policy":"dry","key":"k"}`, 200,
			`{"policy":"dry","key":"k","allowed":false,"shadow_denied":true,"limit":1,"remaining":0,"retry_after_ms":60000,"reset_after_ms":60000}`, ""},
		{"policy cost by default", "/v1/check", `{"policy":"heavy","key":"k"}`, 200,
			`{"policy":"heavy","key":"k","allowed":true,"limit":4,"remaining":2,"retry_after_ms":0,"reset_after_ms":200}`, ""},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			w := e.do(t, "POST", s.path, s.body, nil, "")
			if w.Code != s.code {
				t.Errorf("status %d, want %d", w.Code, s.code)
			}
			if got := strings.TrimSpace(w.Body.String()); got != s.want {
				t.Errorf("body\n  %s\nwant\n  %s", got, s.want)
			}
			if got := w.Header().Get("Retry-After"); got != s.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, s.retryAfter)
			}
			if w.Header().Get("X-RateLimit-Limit") == "" || w.Header().Get("RateLimit-Policy") == "" {
				t.Errorf("rate-limit headers missing: %v", w.Header())
			}
		})
	}
}

func TestAPIErrors(t *testing.T) {
	e := newAPI(t, nil)
	tests := []struct {
		name, method, path, body string
		code                     int
		detail                   string
	}{
		{"malformed JSON", "POST", "/v1/check", `{"policy":`, 400, "ends inside its JSON object"},
		{"not an object", "POST", "/v1/check", `[1]`, 400, "must be a JSON object with the fields policy, key and cost"},
		{"null", "POST", "/v1/check", ` null`, 400, "must be a JSON object with the fields policy, key and cost"},
		{"reset: null", "POST", "/v1/reset", `null`, 400, "must be a JSON object with the fields policy and key"},
		{"acquire: null", "POST", "/v1/acquire", `null`, 400, "must be a JSON object with the fields policy, key, weight and priority"},
		{"unknown field", "POST", "/v1/check", `{"policy":"fw","key":"k","weight":3}`, 400, `unknown field "weight": the fields are policy, key and cost`},
		{"a field in another case", "POST", "/v1/check", `{"POLICY":"fw","KEY":"k"}`, 400, `unknown field "POLICY": the fields are policy, key and cost`},
		{"a field twice", "POST", "/v1/check", `{"policy":"fw","key":"x","key":"y"}`, 400, `field "key" appears twice`},
		{"reset: a key in another case beside key", "POST", "/v1/reset", `{"policy":"fw","key":"x","KEY":"victim"}`, 400, `unknown field "KEY"`},
		{"trailing data", "POST", "/v1/check", `{"policy":"fw","key":"k"} {}`, 400, "more after its JSON object"},
		{"trailing brace", "POST", "/v1/check", `{"policy":"fw","key":"k"}}`, 400, "more after its JSON object"},
		{"trailing bracket", "POST", "/v1/check", `{"policy":"fw","key":"k"}]`, 400, "more after its JSON object"},
		{"empty body", "POST", "/v1/check", ``, 400, "the request body is empty"},
		{"too large", "POST", "/v1/check", `{"policy":"fw","key":"` + strings.Repeat("x", MaxBodyBytes) + `"}`, 413, "exceeds"},
		{"unknown policy", "POST", "/v1/check", `{"policy":"nope","key":"k"}`, 404, `there is no policy "nope": GET /v1/policies lists`},
		{"no policy", "POST", "/v1/check", `{"key":"k"}`, 400, "policy is required"},
		{"empty key", "POST", "/v1/check", `{"policy":"fw","key":""}`, 400, "key is required"},
		{"negative cost", "POST", "/v1/check", `{"policy":"fw","key":"k","cost":-1}`, 400, "cost -1"},
		{"cost above capacity", "POST", "/v1/check", `{"policy":"fw","key":"k","cost":4}`, 400, "cost 4 exceeds the policy's capacity of 3"},
		{"cost above int64", "POST", "/v1/check", `{"policy":"fw","key":"k","cost":18446744073709551616}`, 400, `field "cost" is out of range: 18446744073709551616 is not between -9223372036854775808 and 9223372036854775807`},
		{"cost above int64, exponent", "POST", "/v1/check", `{"policy":"fw","key":"k","cost":1E19}`, 400, `field "cost" is out of range: 1E19 is not between`},
		{"cost with an exponent", "POST", "/v1/check", `{"policy":"fw","key":"k","cost":1e3}`, 400, `field "cost" must be written as a plain integer (1000), not 1e3`},
		{"cost below int64", "POST", "/v1/check", `{"policy":"fw","key":"k","cost":-9223372036854775809}`, 400, `field "cost" is out of range: -9223372036854775809 is not between`},
		{"acquire: weight above int64", "POST", "/v1/acquire", `{"policy":"fw","key":"k","weight":18446744073709551616}`, 400, `field "weight" is out of range: 18446744073709551616 is not between -9223372036854775808 and 9223372036854775807`},
		{"cost with a fraction", "POST", "/v1/check", `{"policy":"fw","key":"k","cost":1.5}`, 400, `field "cost" must be a whole number, not a JSON number 1.5`},
		{"cost of the wrong type", "POST", "/v1/check", `{"policy":"fw","key":"k","cost":"2"}`, 400, `field "cost" must be a whole number, not a JSON string`},
		{"missing key", "POST", "/v1/check", `{"policy":"fw"}`, 400, "key is required"},
		{"not JSON", "POST", "/v1/check", `policy=fw`, 400, "not valid JSON (at byte 1)"},
		{"unknown endpoint", "GET", "/v1/nothing", ``, 404, "no such endpoint"},
		{"reset unknown policy", "POST", "/v1/reset", `{"policy":"nope","key":"k"}`, 404, "there is no policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w := e.do(t, tt.method, tt.path, tt.body, nil, "")
			if w.Code != tt.code {
				t.Errorf("status %d, want %d", w.Code, tt.code)
			}
			if ct := w.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type %q", ct)
			}
			m := decodeBody(t, w)
			d, _ := m["detail"].(string)
			if !strings.Contains(d, tt.detail) {
				t.Errorf("detail %q, want it to contain %q", d, tt.detail)
			}
			if leak := goInternals(d); leak != "" {
				t.Errorf("detail %q speaks of %q", d, leak)
			}
			if m["status"] != float64(tt.code) {
				t.Errorf("status field %v", m["status"])
			}
		})
	}
	if w := e.do(t, "GET", "/v1/check", "", nil, ""); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/check: %d, want 405", w.Code)
	}
}

func TestAPIAdmin(t *testing.T) {
	body := `{"policy":"fw","key":"k"}`
	tests := []struct {
		name   string
		token  string
		auth   string
		remote string
		code   int
	}{
		{"no token configured, loopback", "", "", "127.0.0.1:5000", 204},
		{"no token configured, IPv6 loopback", "", "", "[::1]:5000", 204},
		{"no token configured, remote", "", "", "203.0.113.9:5000", 403},
		{"no token configured, forged forwarding header ignored", "", "", "203.0.113.9:5000", 403},
		{"token, none sent", "s3cret", "", "127.0.0.1:5000", 401},
		{"token, wrong", "s3cret", "Bearer nope", "127.0.0.1:5000", 403},
		{"token, wrong scheme", "s3cret", "Basic czNjcmV0", "203.0.113.9:5000", 401},
		{"token, right, from anywhere", "s3cret", "Bearer s3cret", "203.0.113.9:5000", 204},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newAPI(t, &HandlerOptions{AdminToken: tt.token})
			for range 3 {
				e.do(t, "POST", "/v1/check", body, nil, "")
			}
			hdr := map[string]string{"X-Forwarded-For": "127.0.0.1"}
			if tt.auth != "" {
				hdr["Authorization"] = tt.auth
			}
			w := e.do(t, "POST", "/v1/reset", body, hdr, tt.remote)
			if w.Code != tt.code {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.code, w.Body.String())
			}
			if tt.code == 401 && w.Header().Get("WWW-Authenticate") == "" {
				t.Error("401 without WWW-Authenticate")
			}
			after := e.do(t, "POST", "/v1/check", body, nil, "")
			if reset := tt.code == 204; (after.Code == 200) != reset {
				t.Errorf("after reset (%v): check got %d", reset, after.Code)
			}
		})
	}
}

// TestAPIStats: /v1/stats counts decisions of /v1/check and of RLS (not
// peeks) in 5s buckets, oldest first, the last being the current one.
func TestAPIStats(t *testing.T) {
	e := newAPI(t, nil)
	e.clock.Set(t0.Add(-3 * time.Second)) // the bucket before the current one
	for range 4 {
		e.do(t, "POST", "/v1/check", `{"policy":"fw","key":"a"}`, nil, "")
	}
	e.clock.Set(t0.Add(2 * time.Second))
	e.do(t, "POST", "/v1/check", `{"policy":"fw","key":"a"}`, nil, "")
	e.do(t, "POST", "/v1/peek", `{"policy":"fw","key":"a"}`, nil, "")
	rlsServer{svc: e.svc}.ShouldRateLimit(t.Context(), rlsRequest("web", desc("policy=dry", "key=z")))
	w := e.do(t, "GET", "/v1/stats", "", nil, "")
	var got struct {
		BucketMS int64 `json:"bucket_ms"`
		Buckets  int   `json:"buckets"`
		Series   []Series
	}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if got.BucketMS != 5000 || got.Buckets != 60 || len(got.Series) != 3 {
		t.Fatalf("got %+v", got)
	}
	fw, dry := got.Series[0], got.Series[1]
	if fw.Policy != "fw" || len(fw.Allowed) != 60 || len(fw.Denied) != 60 {
		t.Fatalf("fw series %+v", fw)
	}
	last := func(s []int64, back int) int64 { return s[len(s)-1-back] }
	if a, d := last(fw.Allowed, 1), last(fw.Denied, 1); a != 3 || d != 1 {
		t.Errorf("previous bucket: %d allowed, %d denied; want 3, 1", a, d)
	}
	if a, d := last(fw.Allowed, 0), last(fw.Denied, 0); a != 1 || d != 0 {
		t.Errorf("current bucket: %d allowed, %d denied; want 1, 0 (the window turned)", a, d)
	}
	if a := last(dry.Allowed, 0); a != 1 {
		t.Errorf("RLS decision not counted: %v", dry.Allowed)
	}
	// Five minutes later the counts have aged out.
	e.clock.Set(t0.Add(6 * time.Minute))
	w = e.do(t, "GET", "/v1/stats", "", nil, "")
	var again struct{ Series []Series }
	if err := json.Unmarshal(w.Body.Bytes(), &again); err != nil {
		t.Fatal(err)
	}
	for _, s := range again.Series {
		for i := range s.Allowed {
			if s.Allowed[i] != 0 || s.Denied[i] != 0 {
				t.Fatalf("%s: stale counts %v %v", s.Policy, s.Allowed, s.Denied)
			}
		}
	}
}

// TestAPIStatsConfigVersion: /v1/stats carries a config_version that stays
// put between reloads and changes on every one, even when the policy names
// (or the whole configuration) stay the same.
func TestAPIStatsConfigVersion(t *testing.T) {
	e := newAPI(t, nil)
	version := func() float64 {
		t.Helper()
		v, ok := decodeBody(t, e.do(t, "GET", "/v1/stats", "", nil, ""))["config_version"].(float64)
		if !ok {
			t.Fatal("no numeric config_version in /v1/stats")
		}
		return v
	}
	v1 := version()
	if v := version(); v != v1 {
		t.Errorf("config_version %v, then %v without a reload", v1, v)
	}
	e.svc.SetConfig(mustConfig(t, strings.Replace(apiConfig, "fixed_window 3/10s", "fixed_window 5/10s", 1)))
	v2 := version()
	if v2 == v1 {
		t.Errorf("config_version %v unchanged after a reload that changed a limit", v2)
	}
	e.svc.SetConfig(e.svc.Config())
	if v := version(); v == v2 || v == v1 {
		t.Errorf("config_version %v after a second reload, want other than %v and %v", v, v1, v2)
	}
}

func TestAPIHealth(t *testing.T) {
	down := errors.New("connection refused")
	var ready error
	m := NewMetrics()
	e := newAPI(t, &HandlerOptions{Metrics: m, Ready: func(context.Context) error { return ready }})
	mem := memory.New(&memory.Options{Clock: e.clock.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	e.svc = NewService(mem, e.svc.Config(), &ServiceOptions{Clock: e.clock.Now, Metrics: m})
	e.h = e.svc.Handler(&HandlerOptions{Metrics: m, Ready: func(context.Context) error { return ready }})
	if w := e.do(t, "GET", "/healthz", "", nil, ""); w.Code != 200 {
		t.Errorf("healthz %d", w.Code)
	}
	if w := e.do(t, "GET", "/readyz", "", nil, ""); w.Code != 200 {
		t.Errorf("readyz %d", w.Code)
	}
	ready = down
	if w := e.do(t, "GET", "/readyz", "", nil, ""); w.Code != 503 || !strings.Contains(w.Body.String(), "connection refused") {
		t.Errorf("readyz with the store down: %d %s", w.Code, w.Body.String())
	}
	for range 4 {
		e.do(t, "POST", "/v1/check", `{"policy":"fw","key":"m"}`, nil, "")
	}
	w := e.do(t, "GET", "/metrics", "", nil, "")
	body := w.Body.String()
	for _, want := range []string{
		`sluice_decisions_total{outcome="allowed",policy="fw"} 3`,
		`sluice_decisions_total{outcome="denied",policy="fw"} 1`,
		`sluice_near_limit_total{policy="fw"} 1`,
		`sluice_store_latency_seconds_count{op="take",store="memory"} 4`,
		`sluice_store_calls_total{op="take",source="backend",store="memory"} 4`,
		`sluice_config_reloads_total{result="failure"} 0`,
		`sluice_fallback_active 0`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
}

func TestAPIDashboardMount(t *testing.T) {
	e := newAPI(t, nil)
	w := e.do(t, "GET", "/", "", nil, "")
	if w.Code != 200 || !strings.Contains(w.Body.String(), "<html") {
		t.Errorf("placeholder: %d %q", w.Code, w.Body.String())
	}
	dash := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "dashboard "+r.URL.Path) })
	e = newAPI(t, &HandlerOptions{Dashboard: dash})
	if w := e.do(t, "GET", "/app.js", "", nil, ""); w.Body.String() != "dashboard /app.js" {
		t.Errorf("dashboard mount: %q", w.Body.String())
	}
	if w := e.do(t, "GET", "/v1/policies", "", nil, ""); !strings.Contains(w.Body.String(), `"policies"`) {
		t.Errorf("API shadowed by the dashboard: %q", w.Body.String())
	}
}

// TestEnvoyJSONEndpoint: POST /json answers like envoyproxy/ratelimit's.
func TestEnvoyJSONEndpoint(t *testing.T) {
	e := newAPI(t, nil)
	body := `{"domain":"web","descriptors":[{"entries":[{"key":"policy","value":"fw"},{"key":"key","value":"j"}]}],"hitsAddend":3}`
	w := e.do(t, "POST", "/json", body, nil, "")
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"overallCode":"OK"`) {
		t.Errorf("first: %d %s", w.Code, w.Body.String())
	}
	w = e.do(t, "POST", "/json", body, nil, "")
	if w.Code != 429 || !strings.Contains(w.Body.String(), `"overallCode":"OVER_LIMIT"`) {
		t.Errorf("second: %d %s", w.Code, w.Body.String())
	}
	if w := e.do(t, "POST", "/json", `{"domain":`, nil, ""); w.Code != 400 {
		t.Errorf("malformed: %d", w.Code)
	}
	// A bad field is named as Envoy's documents name it, and as sent.
	w = e.do(t, "POST", "/json", `{"domain":"web","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"hits_addend":"x"}`, nil, "")
	if w.Code != 400 || !strings.Contains(w.Body.String(), "field hits_addend (hitsAddend)") {
		t.Errorf("bad hits_addend: %d %s", w.Code, w.Body.String())
	}
	// A descriptor's hits_addend is a wrapper (UInt64Value): it is named,
	// not the wrapper's inner field (value), on any line; an entry's value
	// stays value.
	for _, tc := range []struct{ body, want string }{
		{`{"domain":"web","descriptors":[{"entries":[{"key":"k","value":"v"}],"hits_addend":-1}]}`, "field hits_addend (hitsAddend): -1"},
		{"{\"domain\":\"web\",\n\"descriptors\":[{\"entries\":[{\"key\":\"k\",\"value\":\"v\"}],\n  \"hitsAddend\" : {\"value\":3}}]}", "field hits_addend (hitsAddend): {"},
		{`{"domain":"web","descriptors":[{"entries":[{"key":"k","value":5}]}]}`, "string field value: 5"},
	} {
		w = e.do(t, "POST", "/json", tc.body, nil, "")
		if w.Code != 400 || !strings.Contains(w.Body.String(), tc.want) {
			t.Errorf("%s: %d %s, want %q", tc.body, w.Code, w.Body.String(), tc.want)
		}
	}
	// The client's own value is quoted as sent.
	w = e.do(t, "POST", "/json", `{"domain":"web","descriptors":[{"entries":[{"key":"k","value":"v"}]}],"hitsAddend":"field fooBar"}`, nil, "")
	if w.Code != 400 || !strings.Contains(w.Body.String(), `field fooBar`) {
		t.Errorf("value rewritten: %d %s", w.Code, w.Body.String())
	}
}

// goInternals returns the first Go package prefix or type wording found in a
// problem detail, or "".
func goInternals(detail string) string {
	for _, w := range []string{"server:", "sluice:", "json:", "proto:", "http:", "Go struct", "int64", "checkRequest", "<nil>"} {
		if strings.Contains(detail, w) {
			return w
		}
	}
	return ""
}

// deadStore fails every call, as a store with no failure policy does
// while Redis is away.
type deadStore struct{}

var errDead = errors.New("dial tcp: connection refused")

func (deadStore) Take(context.Context, string, sluice.Limit, int64) (sluice.Decision, error) {
	return sluice.Decision{}, errDead
}

func (deadStore) Peek(context.Context, string, sluice.Limit, int64) (sluice.Decision, error) {
	return sluice.Decision{}, errDead
}

func (deadStore) Reset(context.Context, string, sluice.Limit) error { return errDead }

func (deadStore) Acquire(context.Context, string, sluice.InFlightLimit, int64, string) (sluice.SlotDecision, error) {
	return sluice.SlotDecision{}, errDead
}

func (deadStore) Extend(context.Context, string, sluice.InFlightLimit, string) (bool, error) {
	return false, errDead
}

func (deadStore) Release(context.Context, string, string) (bool, error) { return false, errDead }

// TestAPIStoreDownRetryAfter: every 503 that asks to try again shortly
// says when, in Retry-After, on the JSON API and on /json.
func TestAPIStoreDownRetryAfter(t *testing.T) {
	svc := NewService(deadStore{}, mustConfig(t, `
domain: web
policies:
  - name: fw
    limit: fixed_window 3/min
  - name: jobs
    in_flight: {max: 2, hold: 1m}
`), &ServiceOptions{Logger: slog.New(slog.DiscardHandler)})
	e := &apiEnv{svc: svc, h: svc.Handler(nil)}
	// A well-formed token of policy jobs, key a: no acquire can give one.
	const token = "0123456789abcdef0123456789abcdef.am9icw.YQ"
	for _, tt := range []struct{ path, body string }{
		{"/v1/check", `{"policy":"fw","key":"a"}`},
		{"/v1/peek", `{"policy":"fw","key":"a"}`},
		{"/v1/reset", `{"policy":"fw","key":"a"}`},
		{"/v1/acquire", `{"policy":"jobs","key":"a"}`},
		{"/v1/extend", `{"token":"` + token + `"}`},
		{"/v1/release", `{"token":"` + token + `"}`},
		{"/json", `{"domain":"web","descriptors":[{"entries":[{"key":"policy","value":"fw"},{"key":"key","value":"a"}]}]}`},
	} {
		w := e.do(t, "POST", tt.path, tt.body, nil, "")
		if w.Code != http.StatusServiceUnavailable || w.Header().Get("Retry-After") != "1" {
			t.Errorf("%s with the store down: %d, Retry-After %q; want 503 with Retry-After 1: %s", tt.path, w.Code, w.Header().Get("Retry-After"), w.Body.String())
		}
	}
}
