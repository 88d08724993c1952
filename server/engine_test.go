package server

import (
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	io_prometheus_client "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// Configurations of the tests below.
const checkOnlyConfig = `
domain: api
policies:
  - name: p
    limit: fixed_window 10/min
    cost: 2
    key: "{user}"
`

const penaltyConfig = `
domain: api
policies:
  - name: login
    limit: fixed_window 1/min
    strategy: penalty
    penalty: 1h
    key: "{user}"
`

const shadowModeConfig = `
domain: d
descriptors:
  - key: dark
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: lit
    rate_limit: {unit: minute, requests_per_unit: 1}
`

// bothTransports serves a memory-store service over RLS and the JSON API.
func bothTransports(t *testing.T, yaml string, clock *fakeClock) (*Service, rlsv3.RateLimitServiceClient, *apiEnv) {
	t.Helper()
	svc := newMemService(t, yaml, clock)
	return svc, serveRLS(t, svc), &apiEnv{svc: svc, h: svc.Handler(nil), clock: clock}
}

// A check that only looks, on both transports: a descriptor's hits_addend
// present and 0, and a JSON "cost": 0. The request-level hits_addend 0 and
// an omitted cost keep their defaults (the policy's cost).
func TestCheckOnlyOnBothTransports(t *testing.T) {
	clock := newFakeClock()
	svc, c, e := bothTransports(t, checkOnlyConfig, clock)
	look := desc("user=u")
	look.HitsAddend = wrapperspb.UInt64(0)
	remaining := func(body string) string {
		t.Helper()
		w := e.do(t, "POST", "/v1/check", body, nil, "")
		if w.Code != 200 {
			t.Fatalf("%s: %d %s", body, w.Code, w.Body)
		}
		return w.Header().Get("X-RateLimit-Remaining")
	}
	for i, st := range []struct {
		name string
		do   func() string
		want string
	}{
		{"rls default hits: the policy's cost", func() string { return render(call(t, c, rlsRequest("api", desc("user=u")))) }, "OK: OK/8"},
		{"rls request hits_addend 0: the default", func() string {
			return render(call(t, c, &rlsv3.RateLimitRequest{Domain: "api", HitsAddend: 0, Descriptors: rlsRequest("api", desc("user=u")).Descriptors}))
		}, "OK: OK/6"},
		{"rls descriptor hits_addend 0: look", func() string { return render(call(t, c, rlsRequest("api", look))) }, "OK: OK/6"},
		{"json cost omitted: the policy's cost", func() string { return remaining(`{"policy":"p","key":"u"}`) }, "4"},
		{"json cost 0: look", func() string { return remaining(`{"policy":"p","key":"u","cost":0}`) }, "4"},
		{"json cost 1", func() string { return remaining(`{"policy":"p","key":"u","cost":1}`) }, "3"},
	} {
		if got := st.do(); got != st.want {
			t.Errorf("step %d, %s: got %q, want %q", i, st.name, got, st.want)
		}
	}
	// Looking at an exhausted key is never over the limit.
	remaining(`{"policy":"p","key":"u","cost":3}`)
	if got := remaining(`{"policy":"p","key":"u","cost":0}`); got != "0" {
		t.Errorf("look at an exhausted key: remaining %q, want 0 and 200", got)
	}
	if got, want := render(call(t, c, rlsRequest("api", look))), "OK: OK/0"; got != want {
		t.Errorf("rls look at an exhausted key: %q, want %q", got, want)
	}
	var stats int64
	for _, s := range svc.Stats().Snapshot() {
		for _, n := range s.Allowed {
			stats += n
		}
	}
	if stats != 5 {
		t.Errorf("%d decisions counted, want 5 (looks are not counted)", stats)
	}
}

// The service gains the middleware's Penalty strategy: a violation blocks
// the key for the penalty, across both transports, until a reset.
func TestPenaltyPolicy(t *testing.T) {
	clock := newFakeClock()
	_, c, e := bothTransports(t, penaltyConfig, clock)
	check := func() (int, string) {
		w := e.do(t, "POST", "/v1/check", `{"policy":"login","key":"eve"}`, nil, "")
		return w.Code, w.Header().Get("Retry-After")
	}
	if code, _ := check(); code != 200 {
		t.Fatalf("first: %d", code)
	}
	if code, retry := check(); code != 429 || retry != "3600" {
		t.Fatalf("violation: %d, Retry-After %q; want 429 and the hour's block", code, retry)
	}
	clock.Set(t0.Add(10 * time.Minute)) // the window is long over; the block holds
	if code, retry := check(); code != 429 || retry != "3000" {
		t.Errorf("blocked: %d, Retry-After %q; want 429, 3000", code, retry)
	}
	if got, want := render(call(t, c, rlsRequest("api", desc("user=eve")))), "OVER_LIMIT: OVER/"; !strings.HasPrefix(got, want) {
		t.Errorf("rls while blocked: %q, want %q...", got, want)
	}
	if w := e.do(t, "POST", "/v1/reset", `{"policy":"login","key":"eve"}`, nil, ""); w.Code != 204 {
		t.Fatalf("reset: %d %s", w.Code, w.Body)
	}
	if code, _ := check(); code != 200 {
		t.Errorf("after a reset: %d, want 200 (the block ends too)", code)
	}
}

// A blocked descriptor's headers never carry an empty policy name.
func TestBlockedHeadersNamed(t *testing.T) {
	svc := newMemService(t, `
domain: d
descriptors:
  - key: path
    value: /admin
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 0, name: banned}
`, newFakeClock())
	c := serveRLS(t, svc)
	for _, tt := range []struct{ desc, want string }{
		{"path=/admin", `"d.path_/admin";q=0`},
		{"ip=1.2.3.4", `"banned";q=0`},
	} {
		resp := call(t, c, rlsRequest("d", desc(tt.desc)))
		var policy string
		for _, h := range resp.ResponseHeadersToAdd {
			if h.Key == "RateLimit-Policy" {
				policy = h.Value
			}
		}
		if !strings.HasPrefix(policy, tt.want) {
			t.Errorf("%s: RateLimit-Policy %q, want %s...", tt.desc, policy, tt.want)
		}
	}
}

// The JSON API refuses a key for an Envoy-format policy that no descriptor
// reaches (it would make a counter no request shares), and a key written
// as the descriptor's entries shares the RLS's counter.
func TestJSONKeysOfEnvoyPolicies(t *testing.T) {
	clock := newFakeClock()
	_, c, e := bothTransports(t, `
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: path
    value: /api/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 3}
`, clock)
	for _, tt := range []struct {
		policy, key string
		code        int
	}{
		{"d.remote_address", "1.2.3.4", 400},
		{"d.remote_address", "path=/api/x", 400},
		{"d.remote_address", "remote_address=1.2.3.4,x=y", 400},
		{"d.remote_address", "remote_address=1.2.3.4", 200},
		{"d.path_/api/*", "path=/api/x", 400}, // shared: the pattern is the key
		{"d.path_/api/*", "path=/api/*", 200},
	} {
		w := e.do(t, "POST", "/v1/check", `{"policy":"`+tt.policy+`","key":"`+tt.key+`"}`, nil, "")
		if w.Code != tt.code {
			t.Errorf("%s %s: %d %s, want %d", tt.policy, tt.key, w.Code, w.Body, tt.code)
		}
	}
	if got, want := render(call(t, c, rlsRequest("d", desc("remote_address=1.2.3.4")))), "OK: OK/1"; got != want {
		t.Errorf("rls after one JSON check: %q, want %q (one counter)", got, want)
	}
	if got, want := render(call(t, c, rlsRequest("d", desc("path=/api/y")))), "OK: OK/1"; got != want {
		t.Errorf("rls on the shared pattern: %q, want %q", got, want)
	}
}

// A request for an unknown domain is answered OK, counted every time and
// logged once per domain; the remembered domains are bounded, so random
// domains grow neither memory nor the log past the bound.
func TestUnknownDomains(t *testing.T) {
	var logs strings.Builder
	m := NewMetrics()
	mem := memory.New(nil)
	t.Cleanup(func() { mem.Close() })
	svc := NewService(mem, mustConfig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"),
		&ServiceOptions{Metrics: m, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	rls := rlsServer{svc: svc}
	ask := func(domain string) {
		t.Helper()
		resp, err := rls.ShouldRateLimit(t.Context(), rlsRequest(domain, desc("k=v")))
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("%s: %v, %v", domain, resp, err)
		}
	}
	ask("x")
	ask("x")
	ask("y")
	if got := strings.Count(logs.String(), "unknown domain"); got != 2 {
		t.Errorf("%d log lines, want 2:\n%s", got, logs.String())
	}
	for i := range maxUnknownDomains + 5 {
		ask(fmt.Sprintf("random-%d", i))
	}
	if got, want := strings.Count(logs.String(), "\n"), maxUnknownDomains+1; got != want {
		t.Errorf("%d log lines, want %d (one per remembered domain, one saying so)", got, want)
	}
	if got := len(svc.unknown); got != maxUnknownDomains {
		t.Errorf("%d domains remembered, want %d", got, maxUnknownDomains)
	}
	var dto io_prometheus_client.Metric
	if err := m.unknown.Write(&dto); err != nil {
		t.Fatal(err)
	}
	if got, want := dto.GetCounter().GetValue(), float64(maxUnknownDomains+8); got != want {
		t.Errorf("sluice_rls_unknown_domain_requests_total = %v, want %v", got, want)
	}
}

// A shadow_mode descriptor takes its hits only when the request is
// admitted, like every shadow rule in sluice: it counts what enforcing
// would have let through. (envoyproxy/ratelimit counts every hit: after
// the denied request below it would report 3 remaining, not 4.)
func TestShadowModeCountsOnlyAdmitted(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, shadowModeConfig, clock)
	runSteps(t, svc, clock, []rlsStep{
		{0, "d", [][]string{{"dark=x"}, {"lit=y"}}, 0, "OK: OK/4 OK/0"},
		{0, "d", [][]string{{"dark=x"}, {"lit=y"}}, 0, "OVER_LIMIT: OK/4 OVER/0"},
		{0, "d", [][]string{{"dark=x"}}, 0, "OK: OK/3"},
	})
}

// unit_multiplier: a window of unit×N aligned on multiples of it since the
// Unix epoch, reported with the unit as written and its multiplier.
func TestRLSUnitMultiplier(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2, unit_multiplier: 5}
`, clock)
	c := serveRLS(t, svc)
	clock.Set(t0.Add(7 * time.Minute)) // t0 starts a day: windows [5m, 10m), [10m, 15m)
	resp := call(t, c, rlsRequest("d", desc("k=a")))
	st := resp.Statuses[0]
	if st.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || st.CurrentLimit.GetRequestsPerUnit() != 2 ||
		st.CurrentLimit.GetUnitMultiplier().GetValue() != 5 || st.DurationUntilReset.AsDuration() != 3*time.Minute {
		t.Errorf("status %v, want 2 per 5 × MINUTE, reset in 3m", st)
	}
	for _, step := range []struct {
		at   time.Duration
		want string
	}{
		{9 * time.Minute, "OK: OK/0"},
		{9*time.Minute + 59*time.Second, "OVER_LIMIT: OVER/0"},
		{10 * time.Minute, "OK: OK/1"},
	} {
		clock.Set(t0.Add(step.at))
		if got := render(call(t, c, rlsRequest("d", desc("k=a")))); got != step.want {
			t.Errorf("at %v: %q, want %q", step.at, got, step.want)
		}
	}
}

// TestLeaseFleetSize: a lease holds at most 1/(2 × fleet size) of the
// burst, the fleet size being what ServiceOptions.FleetSize reports (sluice
// serve passes the count it discovers in Redis).
func TestLeaseFleetSize(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	store := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	cfg := mustConfig(t, "policies:\n  - name: hot\n    limit: 100/min\n    lease: 1s\n")
	svc := NewService(store, cfg, &ServiceOptions{Clock: clock.Now, FleetSize: func() int { return 10 }})
	for range 40 {
		if r := check(t, svc, "hot", "k"); !r.Allowed {
			t.Fatalf("denied: %+v", r.Decision)
		}
	}
	st := svc.LeaseStats()
	if st.Local == 0 || st.Granted > 5*st.Grants {
		t.Errorf("lease stats %+v: want local decisions from leases of at most 100 / (2 × 10) = 5 units", st)
	}
	t.Logf("40 decisions: %d local, %d units in %d grants", st.Local, st.Granted, st.Grants)
	// The dashboard's statistics count the same local decisions.
	var local int64
	for _, n := range svc.Stats().Snapshot()[0].Local {
		local += n
	}
	if uint64(local) != st.Local {
		t.Errorf("statistics count %d local decisions, the lease store %d", local, st.Local)
	}
}

// TestLeaseLongName: a policy whose name is too long for its keys to keep
// it (they carry its hash) is leased as its configuration says.
func TestLeaseLongName(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	store := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	name := strings.Repeat("p", 600)
	cfg := mustConfig(t, "policies:\n  - name: "+name+"\n    limit: 1000/10s\n    lease: 5s\n")
	svc := NewService(store, cfg, &ServiceOptions{Clock: clock.Now})
	for range 40 {
		if r := check(t, svc, name, "k"); !r.Allowed {
			t.Fatalf("denied: %+v", r.Decision)
		}
	}
	if st := svc.LeaseStats(); st.Local == 0 || st.Grants == 0 {
		t.Errorf("lease stats %+v: want local decisions", st)
	}
}

// policyOf names the policy of every store key its calls use: a rate key,
// an in-flight key and a Penalty policy's block key, so that a partial
// failure started by block-key calls can end on evidence.
func TestPolicyOfEveryKey(t *testing.T) {
	m := memory.New(nil)
	t.Cleanup(func() { m.Close() })
	svc := NewService(m, mustConfig(t, `
policies:
  - name: otp
    limit: 5/min
    strategy: penalty
    penalty: 1m
  - name: jobs
    in_flight: {max: 2, hold: 1m}
`), &ServiceOptions{Logger: slog.New(slog.DiscardHandler)})
	otp := svc.keyer.Base("otp")
	key, block := svc.keyer.Keys(svc.keyer.LimitStem(otp, sluice.PerMinute(5)), "alice", true)
	slot, _ := svc.keyer.Keys(svc.keyer.Base("jobs"), "alice", false)
	for k, want := range map[string]string{key: "otp", block: "otp", slot: "jobs", "elsewhere:alice": ""} {
		if got := svc.policyOf(k); got != want {
			t.Errorf("policyOf(%q) = %q, want %q", k, got, want)
		}
	}
}
