package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/internal/header"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/server/config"
)

// startServerConfig runs the service on a private redis-server with the
// configuration cfg, listening on loopback for HTTP and gRPC.
func startServerConfig(t *testing.T, cfg string) *Server {
	t.Helper()
	r := redistest.StartServer(t)
	file := writeConfig(t, strings.TrimLeft(cfg, "\n"))
	return runServer(t, Options{ConfigFile: file, RedisURL: "redis://" + r.Addr, NoFailurePolicy: true})
}

// postJSON posts body to the service's /json and decodes its answer.
func postJSON(t *testing.T, srv *Server, req *rlsv3.RateLimitRequest) (int, *rlsv3.RateLimitResponse) {
	t.Helper()
	body, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+srv.HTTPAddr()+"/json", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out rlsv3.RateLimitResponse
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(b, &out); err != nil {
		t.Fatalf("/json answered %d %q: %v", resp.StatusCode, b, err)
	}
	return resp.StatusCode, &out
}

func headerList(resp *rlsv3.RateLimitResponse) string {
	var out []string
	for _, h := range resp.ResponseHeadersToAdd {
		out = append(out, h.Key+": "+h.Value)
	}
	return strings.Join(out, "; ")
}

// TestRLSShadowNeverSuppliesHeaders: a shadow descriptor (a shadow
// policy, shadow_mode, a shadow_mode block) over its limit beside an
// enforced one leaves the headers to the enforced one, and alone gets no
// headers at all, over gRPC and /json alike: a dry run changes nothing a
// client sees. Before, the shadow descriptor, closest to its limit, named
// the headers (X-RateLimit-Remaining: 0 on an admitted request).
func TestRLSShadowNeverSuppliesHeaders(t *testing.T) {
	srv := startServerConfig(t, `
policies:
  - name: shadowy
    limit: fixed_window 3/h
    strategy: shadow
    key: "{sh}"
  - name: api
    limit: fixed_window 10/h
    key: "{api_key}"
---
domain: edge
descriptors:
  - key: dry
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: gone
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	rls := dialRLS(t, srv.GRPCAddr())
	for _, tt := range []struct {
		name     string
		domain   string
		shadow   []*rlcommon.RateLimitDescriptor
		enforced *rlcommon.RateLimitDescriptor
		policy   string // the enforced descriptor's header name
	}{
		{"shadow policy", config.DefaultDomain, []*rlcommon.RateLimitDescriptor{desc("sh=a")}, desc("api_key=k"), "api"},
		{"shadow_mode", "edge", []*rlcommon.RateLimitDescriptor{desc("dry=a")}, desc("user=u"), "edge.user"},
		{"shadow_mode block", "edge", []*rlcommon.RateLimitDescriptor{desc("gone=a")}, desc("user=v"), "edge.user"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Four hits: the shadow descriptor is over its limit, or blocked.
			for range 4 {
				call(t, rls, rlsRequest(tt.domain, tt.shadow...))
			}
			resp := call(t, rls, rlsRequest(tt.domain, append(tt.shadow, tt.enforced)...))
			if resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("shadow and enforced: %s, want OK", render(resp))
			}
			if got, want := rlsHeader(resp, "RateLimit"), `"`+tt.policy+`";r=9;`; !strings.HasPrefix(got, want) {
				t.Errorf("shadow first, then enforced: RateLimit %q, want %s... (headers %s)", got, want, headerList(resp))
			}
			if got := rlsHeader(resp, "X-RateLimit-Limit"); got != "10" {
				t.Errorf("X-RateLimit-Limit %q, want 10, the enforced limit's", got)
			}
			// Enforced first: the same choice.
			resp = call(t, rls, rlsRequest(tt.domain, append([]*rlcommon.RateLimitDescriptor{tt.enforced}, tt.shadow...)...))
			if got, want := rlsHeader(resp, "RateLimit"), `"`+tt.policy+`";r=8;`; !strings.HasPrefix(got, want) {
				t.Errorf("enforced first: RateLimit %q, want %s... (headers %s)", got, want, headerList(resp))
			}
			// Shadow alone: admitted, and nothing to tell.
			resp = call(t, rls, rlsRequest(tt.domain, tt.shadow...))
			if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.ResponseHeadersToAdd) != 0 {
				t.Errorf("shadow alone: %s with headers %q, want OK and none", render(resp), headerList(resp))
			}
			// The JSON form answers the same.
			code, jr := postJSON(t, srv, rlsRequest(tt.domain, append(tt.shadow, tt.enforced)...))
			if got, want := rlsHeader(jr, "RateLimit"), `"`+tt.policy+`";r=7;`; code != http.StatusOK || !strings.HasPrefix(got, want) {
				t.Errorf("/json: %d with RateLimit %q, want 200 and %s...", code, got, want)
			}
			code, jr = postJSON(t, srv, rlsRequest(tt.domain, tt.shadow...))
			if code != http.StatusOK || len(jr.ResponseHeadersToAdd) != 0 {
				t.Errorf("/json shadow alone: %d with headers %q, want 200 and none", code, headerList(jr))
			}
		})
	}
}

// TestRLSBlockNoRetryAfter: a block (requests_per_unit: 0, or a limit of
// 0 the request carries) has capacity 0, so a hit is over it and no wait
// admits it: no Retry-After and no RateLimit (whose t on a denial is a
// wait), as for any hits above a limit's capacity, while X-RateLimit-Limit
// and RateLimit-Policy tell the capacity. Its reset is now:
// duration_until_reset 0 and X-RateLimit-Reset now. Before, a block said
// Retry-After and duration_until_reset of the window's end.
func TestRLSBlockNoRetryAfter(t *testing.T) {
	svc := newRedisService(t, redistest.Client(t), `
domain: d
descriptors:
  - key: ip
    value: 10.0.0.1
    rate_limit: {unit: minute, requests_per_unit: 0, name: banned}
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 1}
`)
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

// Descriptors naming one counter whose hits together exceed its capacity
// are never admissible: over the limit with no Retry-After and no
// RateLimit (whose t would be a wait), as one such descriptor is. Against
// Redis, sluice-format and Envoy-format limits.
func TestRLSMergedHitsAboveCapacityNoRetryAfterRedis(t *testing.T) {
	svc := newRedisService(t, redistest.Client(t), `
policies:
  - name: api
    limit: sliding_window_log 5/h
    key: "{api_key}"
---
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: sliding_window_log}
`)
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

// is_negative_hits only looks, on sluice-format policies too: their cost
// stands in for hits the request leaves unsaid, not for negative ones. Over
// gRPC and Envoy's HTTP JSON form (/json), against Redis.
func TestRLSNegativeHitsTakeNothingRedis(t *testing.T) {
	svc := newRedisService(t, redistest.Client(t), `
policies:
  - name: api
    limit: fixed_window 5/min
    key: "{api_key}"
  - name: costly
    limit: fixed_window 10/min
    cost: 3
    key: "{user}"
`)
	c, base := serveRLS(t, svc), serveHTTP(t, svc)
	for range 6 {
		neg := desc("api_key=n1")
		neg.IsNegativeHits = true
		if got, want := render(call(t, c, rlsRequest("sluice", neg))), "OK: OK/5"; got != want {
			t.Fatalf("negative hits on api: got %q, want %q (looked, nothing taken)", got, want)
		}
		neg = desc("user=u1")
		neg.IsNegativeHits = true
		if got, want := render(call(t, c, rlsRequest("sluice", neg))), "OK: OK/10"; got != want {
			t.Fatalf("negative hits on costly: got %q, want %q", got, want)
		}
	}
	jsonCall := func(body string) (int, string) {
		t.Helper()
		resp, err := http.Post(base+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			OverallCode string
			Statuses    []struct{ LimitRemaining int }
		}
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, &out); err != nil || len(out.Statuses) != 1 {
			t.Fatalf("/json: %d %s", resp.StatusCode, b)
		}
		return out.Statuses[0].LimitRemaining, out.OverallCode
	}
	for range 6 {
		if rem, code := jsonCall(`{"domain":"sluice","descriptors":[{"entries":[{"key":"api_key","value":"n2"}],"is_negative_hits":true}]}`); rem != 5 || code != "OK" {
			t.Fatalf("/json negative hits: %s, %d remaining; want OK, 5", code, rem)
		}
	}
	// The counters are untouched: a real hit takes the first unit, or the
	// policy's cost.
	if got, want := render(call(t, c, rlsRequest("sluice", desc("api_key=n1")))), "OK: OK/4"; got != want {
		t.Errorf("hit after negative hits: got %q, want %q", got, want)
	}
	if got, want := render(call(t, c, rlsRequest("sluice", desc("user=u1")))), "OK: OK/7"; got != want {
		t.Errorf("costly hit after negative hits: got %q, want %q", got, want)
	}
	if rem, _ := jsonCall(`{"domain":"sluice","descriptors":[{"entries":[{"key":"api_key","value":"n2"}]}]}`); rem != 4 {
		t.Errorf("/json hit after negative hits: %d remaining, want 4", rem)
	}
}

// checkResetAgrees fails unless the head status's duration_until_reset
// is the reset the headers state: X-RateLimit-Reset is now plus it
// (rounded up, now somewhere in [before, after]), and an admitted
// response's RateLimit t is it in seconds.
func checkResetAgrees(t *testing.T, what string, resp *rlsv3.RateLimitResponse, before, after time.Time) time.Duration {
	t.Helper()
	d := resp.Statuses[0].GetDurationUntilReset().AsDuration()
	reset, err := strconv.ParseInt(rlsHeader(resp, "X-RateLimit-Reset"), 10, 64)
	if err != nil {
		t.Fatalf("%s: X-RateLimit-Reset: %v (headers %s)", what, err, headerList(resp))
	}
	if lo, hi := ceilUnix(before.Add(d)), ceilUnix(after.Add(d)); reset < lo || reset > hi {
		t.Errorf("%s: X-RateLimit-Reset %d, but duration_until_reset %v says %d..%d", what, reset, d, lo, hi)
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OK {
		if got, want := rlsHeader(resp, "RateLimit"), ";t="+strconv.FormatInt(header.CeilSeconds(d), 10); !strings.HasSuffix(got, want) {
			t.Errorf("%s: RateLimit %q, but duration_until_reset %v says %s", what, got, d, want)
		}
	}
	return d
}

func ceilUnix(t time.Time) int64 {
	if t.Nanosecond() > 0 {
		return t.Unix() + 1
	}
	return t.Unix()
}

// TestRLSResetAgreesWithHeaders: duration_until_reset and the headers'
// reset (X-RateLimit-Reset, RateLimit's t) are one figure, how long until
// the key is full again. A fixed-window key nothing has been taken from (a
// look, or hits above the capacity, which take nothing) is full already:
// 0 in both, where duration_until_reset said the window's end before.
func TestRLSResetAgreesWithHeaders(t *testing.T) {
	svc := newRedisService(t, redistest.Client(t), `
domain: d
descriptors:
  - key: fw
    rate_limit: {unit: hour, requests_per_unit: 5}
---
domain: s
policies:
  - name: win
    limit: fixed_window 5/h
    key: "{k}"
  - name: g
    limit: 5/h
    key: "{g}"
`)
	c := serveRLS(t, svc)
	hits := func(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
		d.HitsAddend = wrapperspb.UInt64(n)
		return d
	}
	do := func(what, domain string, d *rlcommon.RateLimitDescriptor, want rlsv3.RateLimitResponse_Code) time.Duration {
		t.Helper()
		before := time.Now()
		resp := call(t, c, rlsRequest(domain, d))
		after := time.Now()
		if resp.OverallCode != want {
			t.Fatalf("%s: %s, want %s", what, render(resp), want)
		}
		return checkResetAgrees(t, what, resp, before, after)
	}
	for _, tt := range []struct {
		what   string
		domain string
		d      *rlcommon.RateLimitDescriptor
		want   rlsv3.RateLimitResponse_Code
	}{
		{"Envoy fixed window, look", "d", hits(desc("fw=fresh"), 0), rlsv3.RateLimitResponse_OK},
		{"Envoy fixed window, hits above capacity", "d", hits(desc("fw=fresh"), 6), rlsv3.RateLimitResponse_OVER_LIMIT},
		{"sluice fixed window, look", "s", hits(desc("k=fresh"), 0), rlsv3.RateLimitResponse_OK},
		{"sluice fixed window, hits above capacity", "s", hits(desc("k=fresh"), 6), rlsv3.RateLimitResponse_OVER_LIMIT},
		{"gcra, look", "s", hits(desc("g=fresh"), 0), rlsv3.RateLimitResponse_OK},
	} {
		if got := do(tt.what, tt.domain, tt.d, tt.want); got != 0 {
			t.Errorf("%s of a key nothing was taken from: duration_until_reset %v, want 0 (full already)", tt.what, got)
		}
	}
	// Once a hit is counted, both say the window's end.
	do("Envoy fixed window, a hit", "d", desc("fw=used"), rlsv3.RateLimitResponse_OK)
	if got := do("Envoy fixed window, look after a hit", "d", hits(desc("fw=used"), 0), rlsv3.RateLimitResponse_OK); got <= 0 || got > time.Hour {
		t.Errorf("look after a hit: duration_until_reset %v, want the window's end", got)
	}
	if got := do("Envoy fixed window, hits above capacity after a hit", "d", hits(desc("fw=used"), 6), rlsv3.RateLimitResponse_OVER_LIMIT); got <= 0 || got > time.Hour {
		t.Errorf("hits above capacity after a hit: duration_until_reset %v, want the window's end", got)
	}
}
