package server

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/resilient"
)

const slotsConfig = `
policies:
  - name: exports
    key: "{user}"
    in_flight:
      max: 10
      hold: 30s
      reserve: {critical: 0.2, normal: 0.3}
  - name: api
    limit: 100/min
`

// post sends a JSON body to a real listener and decodes the answer.
func post(t *testing.T, base, path, body string) (int, map[string]any, http.Header) {
	t.Helper()
	resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	if resp.StatusCode != http.StatusNoContent {
		if err := json.NewDecoder(resp.Body).Decode(&m); err != nil {
			t.Fatalf("%s: status %d, body not JSON: %v", path, resp.StatusCode, err)
		}
	}
	return resp.StatusCode, m, resp.Header
}

func tokenBody(tok any) string {
	b, _ := json.Marshal(map[string]any{"token": tok})
	return string(b)
}

// serveHTTP serves svc's handler on a real loopback listener.
func serveHTTP(t *testing.T, svc *Service) string {
	t.Helper()
	srv := httptest.NewServer(svc.Handler(nil))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestSlotsAPI walks acquire, denial, shedding, extend, release, a repeated
// release, a forged token and expiry through the JSON API on the memory
// store, each step's answer checked.
func TestSlotsAPI(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, slotsConfig, clock)
	base := serveHTTP(t, svc)
	acquire := func(weight int, prio string) (int, map[string]any, http.Header) {
		req := map[string]any{"policy": "exports", "key": "ann", "weight": weight}
		if prio != "" {
			req["priority"] = prio
		}
		b, _ := json.Marshal(req)
		return post(t, base, "/v1/acquire", string(b))
	}
	// Sheddable requests fit under 5, normal under 8, critical under 10.
	code, first, _ := acquire(4, "sheddable")
	if code != 200 || first["allowed"] != true || first["in_use"] != 4.0 || first["remaining"] != 6.0 || first["limit"] != 10.0 {
		t.Fatalf("first acquire: %d %v", code, first)
	}
	tok := first["token"].(string)
	if code, body, hdr := acquire(2, "sheddable"); code != 503 || body["shed"] != true || hdr.Get("Retry-After") == "" || body["retry_after_estimate"] != true {
		t.Errorf("sheddable over its share: %d %v Retry-After %q, want 503 shed with an estimate", code, body, hdr.Get("Retry-After"))
	}
	if code, body, _ := acquire(4, "normal"); code != 200 || body["in_use"] != 8.0 {
		t.Errorf("normal within its share: %d %v", code, body)
	}
	if code, body, _ := acquire(1, "normal"); code != 503 {
		t.Errorf("normal over its share: %d %v, want 503", code, body)
	}
	if code, body, _ := acquire(2, ""); code != 200 || body["priority"] != "critical" {
		t.Errorf("critical (the default) to the full max: %d %v", code, body)
	}
	code, body, hdr := acquire(1, "critical")
	if code != 429 || body["shed"] != nil || hdr.Get("Retry-After") != "30" {
		t.Errorf("critical over max: %d %v Retry-After %q, want 429 after 30s", code, body, hdr.Get("Retry-After"))
	}

	clock.Set(t0.Add(20 * time.Second))
	if code, body, _ := post(t, base, "/v1/extend", tokenBody(tok)); code != 200 || body["hold_ms"] != 30000.0 {
		t.Errorf("extend: %d %v", code, body)
	}
	clock.Set(t0.Add(40 * time.Second)) // the others expired at 30s; tok holds until 50s
	if code, body, _ := acquire(6, "critical"); code != 200 || body["in_use"] != 10.0 {
		t.Errorf("acquire of 6 with the extended 4 held: %d %v, want in use 10", code, body)
	}
	if code, _, _ := post(t, base, "/v1/release", tokenBody(tok)); code != 204 {
		t.Errorf("release: %d, want 204", code)
	}
	if code, _, _ := post(t, base, "/v1/release", tokenBody(tok)); code != 204 {
		t.Errorf("release again: %d, want 204 (released before)", code)
	}
	if code, body, _ := post(t, base, "/v1/extend", tokenBody(tok)); code != 404 {
		t.Errorf("extend a released token: %d %v, want 404", code, body)
	}

	// A forged token (a holder nobody holds, for a key someone holds)
	// frees nothing.
	code, held, _ := acquire(1, "critical")
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, held)
	}
	before := held["in_use"].(float64)
	forged := sluice.NewHolderID() + held["token"].(string)[32:]
	if code, body, _ := post(t, base, "/v1/release", tokenBody(forged)); code != 404 || !strings.Contains(body["detail"].(string), "nothing was freed") {
		t.Errorf("forged release: %d %v, want 404", code, body)
	}
	if code, body, _ := acquire(1, "critical"); code != 200 || body["in_use"] != before+1 {
		t.Errorf("after the forged release: %d %v, want in use %v", code, body, before+1)
	}

	// A released token edited to name another key is forged: 404.
	code, held2, _ := acquire(1, "critical")
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, held2)
	}
	tok2 := held2["token"].(string)
	if code, _, _ := post(t, base, "/v1/release", tokenBody(tok2)); code != 204 {
		t.Fatalf("release: %d", code)
	}
	edited := slotToken{holder: tok2[:32], policy: "exports", key: "bob"}.String()
	if code, body, _ := post(t, base, "/v1/release", tokenBody(edited)); code != 404 {
		t.Errorf("the released token edited to name key bob: %d %v, want 404", code, body)
	}

	// Acquires are timed, as decisions are.
	resp, err := http.Get(base + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	var stats struct{ Overview Overview }
	err = json.NewDecoder(resp.Body).Decode(&stats)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range stats.Overview.Policies {
		if f.Policy == "exports" && (f.LatencyP50MS <= 0 || f.LatencyP99MS <= 0) {
			t.Errorf("exports in /v1/stats: %+v, want acquire latencies", f)
		}
	}

	// Expiry: a token past its hold is 404, for release and extend.
	clock.Set(t0.Add(2 * time.Minute))
	for _, path := range []string{"/v1/extend", "/v1/release"} {
		if code, body, _ := post(t, base, path, tokenBody(held["token"])); code != 404 {
			t.Errorf("%s of an expired token: %d %v, want 404", path, code, body)
		}
	}
}

// TestSlotsAPIBadInput: bad requests are 4xx problems and change nothing.
func TestSlotsAPIBadInput(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, slotsConfig, clock)
	base := serveHTTP(t, svc)
	tests := []struct {
		name, path, body string
		code             int
		detail           string
	}{
		{"unknown policy", "/v1/acquire", `{"policy":"nope","key":"k"}`, 404, "there is no policy"},
		{"rate policy", "/v1/acquire", `{"policy":"api","key":"k"}`, 400, "limits a rate"},
		{"check an in-flight policy", "/v1/check", `{"policy":"exports","key":"k"}`, 400, "use /v1/acquire"},
		{"weight zero", "/v1/acquire", `{"policy":"exports","key":"k","weight":0}`, 400, "weight 0 outside 1..10"},
		{"weight above max", "/v1/acquire", `{"policy":"exports","key":"k","weight":11}`, 400, "weight 11 outside 1..10"},
		{"unknown priority", "/v1/acquire", `{"policy":"exports","key":"k","priority":"urgent"}`, 400, `priority "urgent" is unknown`},
		{"empty priority", "/v1/acquire", `{"policy":"exports","key":"k","priority":""}`, 400, `priority "" is unknown`},
		{"null priority", "/v1/acquire", `{"policy":"exports","key":"k","priority":null}`, 400, `field "priority" is null`},
		{"null weight", "/v1/acquire", `{"policy":"exports","key":"k","weight":null}`, 400, `field "weight" is null`},
		{"weight never admitted at its priority", "/v1/acquire", `{"policy":"exports","key":"k","weight":6,"priority":"sheddable"}`, 400, `weight 6 can never be admitted at priority sheddable: policy "exports" keeps 5 of 10`},
		{"empty key", "/v1/acquire", `{"policy":"exports","key":""}`, 400, "key is required"},
		{"no policy", "/v1/acquire", `{"key":"k"}`, 400, "policy is required"},
		{"malformed token", "/v1/release", `{"token":"abc"}`, 400, "token is not one acquire returned"},
		{"empty token", "/v1/extend", `{"token":""}`, 400, "token is not one acquire returned"},
		{"token of an unknown policy", "/v1/release", tokenBody(slotToken{holder: sluice.NewHolderID(), policy: "nope", key: "k"}.String()), 404, "nothing was freed"},
		// A fourth part that names no instance was never issued: not a
		// stopped instance's slot (404), nor a second's wait for it.
		{"token naming no instance", "/v1/release", tokenBody(slotToken{holder: sluice.NewHolderID(), policy: "exports", key: "k", member: "e\x96Y"}.String()), 400, "token is not one acquire returned"},
		{"token naming no instance (extend)", "/v1/extend", tokenBody(slotToken{holder: sluice.NewHolderID(), policy: "exports", key: "k", member: "host-1"}.String()), 400, "token is not one acquire returned"},
		{"token with a key acquire refuses", "/v1/release", tokenBody(slotToken{holder: sluice.NewHolderID(), policy: "exports", key: strings.Repeat("k", sluice.MaxKeyLen+1)}.String()), 400, "token is not one acquire returned"},
		{"unknown field", "/v1/release", `{"token":"x","slot":1}`, 400, "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body, _ := post(t, base, tt.path, tt.body)
			if code != tt.code || !strings.Contains(body["detail"].(string), tt.detail) {
				t.Errorf("%d %v, want %d with %q", code, body, tt.code, tt.detail)
			}
		})
	}
	// None of it took a slot: the whole max is still free.
	res, err := svc.Acquire(context.Background(), "exports", "k", 10, sluice.PriorityCritical)
	if err != nil || !res.Decision.Allowed {
		t.Errorf("acquire of the whole max after bad input: %+v, %v", res.Decision, err)
	}
}

func TestParseToken(t *testing.T) {
	tok := slotToken{holder: sluice.NewHolderID(), policy: "p.1", key: "user=a,b"}
	for _, tok := range []slotToken{tok, {holder: tok.holder, policy: "p", key: "k", member: instanceID()}, {holder: tok.holder, policy: "p", key: "k", member: "web-7:1:0a1b2c"}, {holder: tok.holder, policy: "p", key: "k", open: true}} {
		got, err := parseToken(tok.String())
		if err != nil || got != tok {
			t.Errorf("round trip: %+v, %v; want %+v", got, err, tok)
		}
	}
	// An open grant's holder checks itself; a store's fails (but once in 2^32).
	if h := newOpenHolder(); !isOpenHolder(h) || len(h) != 32 {
		t.Errorf("open holder %q does not check", h)
	}
	if isOpenHolder(tok.holder) {
		t.Errorf("store holder %q passes for an open grant's", tok.holder)
	}
	for _, bad := range []string{"", "a.b.c", tok.holder + ".." + "eA", strings.ToUpper(tok.holder) + tok.String()[32:], "zz" + tok.String()[2:], tok.String() + ".x",
		tok.String() + "." + b64.EncodeToString([]byte("host-1")), tok.String() + "." + b64.EncodeToString([]byte("h:1:0A1B2C")),
		tok.String() + "." + b64.EncodeToString([]byte("h\x96:1:0a1b2c")), tok.String() + "." + b64.EncodeToString([]byte("h\n:1:0a1b2c")),
		tok.String() + "." + b64.EncodeToString([]byte(":1:0a1b2c")), tok.String() + "." + b64.EncodeToString([]byte("h:x:0a1b2c")),
		tok.holder + "." + b64.EncodeToString([]byte("p")) + "." + b64.EncodeToString([]byte(strings.Repeat("k", sluice.MaxKeyLen+1)))} {
		if _, err := parseToken(bad); !errors.Is(err, ErrBadToken) {
			t.Errorf("parseToken(%q) = %v, want ErrBadToken", bad, err)
		}
	}
}

// newSlotsService is a Service on slotsConfig with metrics, on a memory
// store driven by a fake clock.
func newSlotsService(t *testing.T) (*fakeClock, *Service, *Metrics) {
	t.Helper()
	clock := newFakeClock()
	store := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	m := NewMetrics()
	return clock, NewService(store, mustConfig(t, slotsConfig), &ServiceOptions{Clock: clock.Now, Metrics: m}), m
}

// TestSlotsMetrics: acquires by priority and outcome, releases by outcome,
// the weight held and the holds expired through this instance.
func TestSlotsMetrics(t *testing.T) {
	clock, svc, m := newSlotsService(t)
	ctx := context.Background()
	acquire := func(weight int64, p sluice.Priority) SlotResult {
		t.Helper()
		res, err := svc.Acquire(ctx, "exports", "ann", weight, p)
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	held := acquire(3, sluice.PrioritySheddable)
	acquire(3, sluice.PrioritySheddable) // shed: 6 > 5
	acquire(5, sluice.PriorityCritical)
	acquire(5, sluice.PriorityCritical) // denied: 13 > 10
	if err := svc.Release(ctx, held.Token); err != nil {
		t.Fatal(err)
	}
	if err := svc.Release(ctx, held.Token); err != nil {
		t.Fatal(err)
	}
	g := m.Registry()
	promtest.Expect(t, g, "sluice_inflight_acquires_total", map[string]string{"policy": "exports", "priority": "sheddable", "outcome": "allowed"}, 1)
	promtest.Expect(t, g, "sluice_inflight_acquires_total", map[string]string{"policy": "exports", "priority": "sheddable", "outcome": "shed"}, 1)
	promtest.Expect(t, g, "sluice_inflight_acquires_total", map[string]string{"policy": "exports", "priority": "critical", "outcome": "allowed"}, 1)
	promtest.Expect(t, g, "sluice_inflight_acquires_total", map[string]string{"policy": "exports", "priority": "critical", "outcome": "denied"}, 1)
	promtest.Expect(t, g, "sluice_inflight_calls_total", map[string]string{"policy": "exports", "call": "release", "outcome": "released"}, 1)
	promtest.Expect(t, g, "sluice_inflight_calls_total", map[string]string{"policy": "exports", "call": "release", "outcome": "released_before"}, 1)
	promtest.Expect(t, g, "sluice_inflight_held", map[string]string{"policy": "exports"}, 5)
	promtest.Expect(t, g, "sluice_inflight_expired_total", map[string]string{"policy": "exports"}, 0) // from the load on
	// Past the hold, the unreleased 5 has expired: the gauge drops it at
	// once, and the next acquire on its key finds it and counts its weight.
	clock.Set(t0.Add(31 * time.Second))
	if got := metricValue(t, g, "sluice_inflight_held", map[string]string{"policy": "exports"}); got != 0 {
		t.Errorf("held after the hold = %v, want 0", got)
	}
	acquire(1, sluice.PriorityNormal)
	if got := metricValue(t, g, "sluice_inflight_expired_total", map[string]string{"policy": "exports"}); got != 5 {
		t.Errorf("expired weight after the next acquire = %v, want 5", got)
	}
	if got := metricValue(t, g, "sluice_inflight_held", map[string]string{"policy": "exports"}); got != 1 {
		t.Errorf("held = %v, want 1", got)
	}
}

// TestReleasesCostNoKeys: the releases a store remembers live with the
// slot's key, so one client acquiring and releasing over and over never
// fills the memory store's key bound (it did at MaxKeys releases within a
// hold, one key each), and a repeated release is still told "released".
func TestReleasesCostNoKeys(t *testing.T) {
	t.Parallel()
	clock := newFakeClock()
	store := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1, MaxKeys: 5000, Shards: 1})
	t.Cleanup(func() { store.Close() })
	svc := NewService(store, mustConfig(t, slotsConfig), &ServiceOptions{Clock: clock.Now})
	ctx := context.Background()
	var first string
	for i := range 12_000 {
		res, err := svc.Acquire(ctx, "exports", "ann", 1, sluice.PriorityCritical)
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("cycle %d: acquire = %+v, %v", i, res.Decision, err)
		}
		if err := svc.Release(ctx, res.Token); err != nil {
			t.Fatalf("cycle %d: release: %v", i, err)
		}
		if i == 0 {
			first = res.Token
		}
	}
	if err := svc.Release(ctx, first); err != nil {
		t.Errorf("the first token, released again: %v; want released before", err)
	}
	if n := store.HeldKeys(); n != 1 {
		t.Errorf("keys with in-flight state: %d, want 1 (the slot's)", n)
	}
}

// downSlots is a slot store whose backend is down: every call fails.
type downSlots struct{ *memory.Store }

func (downSlots) Acquire(context.Context, string, sluice.InFlightLimit, int64, string) (sluice.SlotDecision, error) {
	return sluice.SlotDecision{}, errors.New("down")
}

func (downSlots) Release(context.Context, string, string) (bool, error) {
	return false, errors.New("down")
}

// A failure policy's in-flight answers keep their own InUse and Remaining
// (Limit is the policy's) and are never reported as shed: under the
// fallback, this process's share (Max over the fleet) is what is full, a
// 429; fail-closed denies, a 429 too.
func TestSlotsFailurePolicyNotShed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		policy  resilient.Policy
		allowed int
	}{{resilient.FallbackLocal, 5}, {resilient.FailClosed, 0}} {
		fb := memory.New(&memory.Options{SweepInterval: -1})
		t.Cleanup(func() { fb.Close() })
		backend := downSlots{memory.New(&memory.Options{SweepInterval: -1})}
		t.Cleanup(func() { backend.Close() })
		store, err := resilient.New(backend, &resilient.Options{Policy: tc.policy, Fallback: fb, Nodes: 2, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		svc := NewService(store, mustConfig(t, slotsConfig), &ServiceOptions{Logger: slog.New(slog.DiscardHandler)})
		for i := range tc.allowed + 1 {
			res, err := svc.Acquire(context.Background(), "exports", "ann", 1, sluice.PriorityCritical)
			if err != nil {
				t.Fatalf("%v: acquire %d: %v", tc.policy, i, err)
			}
			if want := i < tc.allowed; res.Decision.Allowed != want || res.Shed {
				t.Fatalf("%v: acquire %d = %+v shed %v; want allowed %v, not shed", tc.policy, i, res.Decision, res.Shed, want)
			}
			if d := res.Decision; d.Limit.Max != 10 || tc.policy == resilient.FallbackLocal && d.Remaining != max(5-d.InUse, 0) {
				t.Errorf("%v: acquire %d reports %+v; want the policy's Max, 10, and what is left of this process's share, 5", tc.policy, i, d)
			}
		}
	}
}

// TestSlotsSurviveLimitChange: in-flight keys carry no fingerprint of the
// limit, so a reload that lowers max keeps the slots held: 8 held, max 10
// → 3, an acquire is denied with in_use 8 until releases bring it below 3.
// A release or extend whose token names a policy that is no longer an
// in-flight one is 404, not 400.
func TestSlotsSurviveLimitChange(t *testing.T) {
	_, svc, _ := newSlotsService(t)
	ctx := context.Background()
	var tokens []string
	for range 8 {
		res, err := svc.Acquire(ctx, "exports", "ann", 1, sluice.PriorityCritical)
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("acquire: %+v, %v", res.Decision, err)
		}
		tokens = append(tokens, res.Token)
	}
	svc.SetConfig(mustConfig(t, strings.Replace(slotsConfig, "max: 10", "max: 3", 1)))
	res, err := svc.Acquire(ctx, "exports", "ann", 1, sluice.PriorityCritical)
	if err != nil || res.Decision.Allowed || res.Decision.InUse != 8 {
		t.Fatalf("acquire after max 10 → 3 with 8 held: %+v, %v; want denied, in use 8", res.Decision, err)
	}
	for _, tok := range tokens[:6] {
		if err := svc.Release(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	if res, err := svc.Acquire(ctx, "exports", "ann", 1, sluice.PriorityCritical); err != nil || !res.Decision.Allowed || res.Decision.InUse != 3 {
		t.Errorf("acquire with 2 of max 3 held: %+v, %v; want allowed, in use 3", res.Decision, err)
	}
	svc.SetConfig(mustConfig(t, "policies:\n  - name: exports\n    limit: 100/min\n"))
	if err := svc.Release(ctx, tokens[6]); !errors.Is(err, ErrSlotNotHeld) {
		t.Errorf("release of a token whose policy now limits a rate: %v, want ErrSlotNotHeld (404)", err)
	}
	if _, err := svc.Extend(ctx, tokens[7]); !errors.Is(err, ErrSlotNotHeld) {
		t.Errorf("extend of a token whose policy now limits a rate: %v, want ErrSlotNotHeld (404)", err)
	}
}

// An in-flight key is the client's: its braces never make a Redis Cluster
// hash tag, and escaping keeps distinct keys apart.
func TestSlotKeyCarriesNoBrace(t *testing.T) {
	t.Parallel()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	svc := NewService(store, mustConfig(t, slotsConfig), &ServiceOptions{})
	p := svc.Config().Policy("exports")
	seen := map[string]string{}
	for _, key := range []string{"{x}", "x}", "%7Bx%7D", "{x}%", "ann"} {
		k := svc.slotKey(p, key)
		if strings.ContainsAny(k, "{}") {
			t.Errorf("key %q: store key %q holds a brace", key, k)
		}
		if other, dup := seen[k]; dup {
			t.Errorf("keys %q and %q share the store key %q", key, other, k)
		}
		seen[k] = key
	}
	res, err := svc.Acquire(context.Background(), "exports", "{x}", 1, sluice.PriorityCritical)
	if err != nil || !res.Decision.Allowed {
		t.Fatalf("acquire {x}: %+v, %v", res.Decision, err)
	}
	if err := svc.Release(context.Background(), res.Token); err != nil {
		t.Errorf("release {x}: %v", err)
	}
}
