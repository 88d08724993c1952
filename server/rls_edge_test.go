package server

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/server/config"
)

// A request-carried limit of 0 blocks, like a configured one, and never
// shares a counter with a configured descriptor of the same entries.
func TestRLSOverrideEdges(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5}
`, clock)
	c := serveRLS(t, svc)
	block := desc("user=a")
	block.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
	if got, want := render(call(t, c, rlsRequest("d", block))), "OVER_LIMIT: OVER/0"; got != want {
		t.Errorf("override of 0: got %q, want %q", got, want)
	}
	one := desc("user=a")
	one.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	two := desc("user=a")
	two.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_HOUR}
	for i, st := range []struct {
		d    *rlcommon.RateLimitDescriptor
		want string
	}{
		{one, "OK: OK/0"},
		{one, "OVER_LIMIT: OVER/0"},
		{two, "OK: OK/1"}, // its own counter
		{desc("user=a"), "OK: OK/4"},
	} {
		if got := render(call(t, c, rlsRequest("d", st.d))); got != st.want {
			t.Errorf("step %d: got %q, want %q", i, got, st.want)
		}
	}
}

// The same counter named twice in one request (Envoy sends the route's and
// the virtual host's remote_address; a policy is reachable by template and
// by name) is one take of both hits, never an error.
func TestRLSDuplicateDescriptors(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, `
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 4}
---
domain: api
policies:
  - name: p
    limit: fixed_window 3/min
    key: "{user}"
`, clock)
	runSteps(t, svc, clock, []rlsStep{
		{0, "d", [][]string{{"remote_address=1.2.3.4"}, {"remote_address=1.2.3.4"}}, 0, "OK: OK/2 OK/2"},
		{0, "d", [][]string{{"remote_address=1.2.3.4"}, {"remote_address=1.2.3.4"}}, 0, "OK: OK/0 OK/0"},
		{0, "d", [][]string{{"remote_address=1.2.3.4"}, {"remote_address=1.2.3.4"}}, 0, "OVER_LIMIT: OVER/0 OVER/0"},
		{0, "api", [][]string{{"user=bob"}, {"policy=p", "user=bob"}}, 0, "OK: OK/1 OK/1"},
		{0, "api", [][]string{{"user=bob"}, {"policy=p", "user=bob"}}, 0, "OVER_LIMIT: OVER/1 OVER/1"},
		// Together over the capacity: over, and nothing taken.
		{0, "api", [][]string{{"user=amy"}, {"user=amy"}, {"user=amy"}, {"user=amy"}}, 0, "OVER_LIMIT: OVER/3 OVER/3 OVER/3 OVER/3"},
		{0, "api", [][]string{{"user=amy"}}, 0, "OK: OK/2"},
	})
}

// Headers describe the enforced descriptor over its limit, with its
// Retry-After, even when a shadow descriptor over its own comes first.
func TestRLSHeadersSkipShadow(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, `
domain: api
policies:
  - name: sh
    limit: fixed_window 1/min
    strategy: shadow
    key: "{a}"
  - name: en
    limit: fixed_window 1/min
    key: "{b}"
`, clock)
	c := serveRLS(t, svc)
	req := rlsRequest("api", desc("a=x"), desc("b=y"))
	call(t, c, req)
	resp := call(t, c, req)
	if got, want := render(resp), "OVER_LIMIT: OK/0 OVER/0"; got != want {
		t.Fatalf("got %q, want %q", got, want)
	}
	headers := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		headers[h.Key] = h.Value
	}
	if got := headers["RateLimit"]; !strings.HasPrefix(got, `"en";r=0;`) {
		t.Errorf("RateLimit %q, want the enforced policy en", got)
	}
	if headers["Retry-After"] != "60" {
		t.Errorf("Retry-After %q, want 60", headers["Retry-After"])
	}
}

// A descriptor path longer than a store key allows still gets decisions:
// the policy name is hashed with the key.
func TestRLSLongDescriptorPath(t *testing.T) {
	long := strings.Repeat("v", 600)
	svc := newMemService(t, `
domain: d
descriptors:
  - key: k
    value: `+long+`
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: other
    rate_limit: {unit: minute, requests_per_unit: 2}
`, newFakeClock())
	c := serveRLS(t, svc)
	for _, want := range []string{"OK: OK/1", "OK: OK/0", "OVER_LIMIT: OVER/0"} {
		if got := render(call(t, c, rlsRequest("d", desc("k="+long)))); got != want {
			t.Errorf("got %q, want %q", got, want)
		}
	}
	if got, want := render(call(t, c, rlsRequest("d", desc("other="+long)))), "OK: OK/1"; got != want {
		t.Errorf("another descriptor with the long value: got %q, want %q", got, want)
	}
}

// An unlimited rule's replaces still apply, as in envoyproxy/ratelimit
// (which records them before it drops the unlimited limit).
func TestRLSUnlimitedReplaces(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1, name: lim}
  - key: b
    rate_limit:
      unlimited: true
      replaces: [{name: lim}]
`, clock)
	runSteps(t, svc, clock, []rlsStep{
		{0, "d", [][]string{{"a=1"}, {"b=1"}}, 0, "OK: OK/- unl"},
		{0, "d", [][]string{{"a=1"}, {"b=1"}}, 0, "OK: OK/- unl"},
		{0, "d", [][]string{{"a=1"}}, 0, "OK: OK/0"},
		{0, "d", [][]string{{"a=1"}}, 0, "OVER_LIMIT: OVER/0"},
	})
}

// A panic in a gRPC handler is an Internal error, not a dead process.
func TestRecoverUnary(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	_, err := s.recoverUnary(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/x.Y/Z"}, func(context.Context, any) (any, error) {
		panic("boom")
	})
	if status.Code(err) != codes.Internal {
		t.Errorf("err = %v, want Internal", err)
	}
}

// Descriptors naming one counter add their hits without wrapping: huge
// per-descriptor hits_addend are over the limit, not a store error.
func TestRLSHitsSumSaturates(t *testing.T) {
	svc := newMemService(t, `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 5}
`, newFakeClock())
	c := serveRLS(t, svc)
	d1, d2 := desc("k=a"), desc("k=a")
	d1.HitsAddend = wrapperspb.UInt64(math.MaxInt64)
	d2.HitsAddend = wrapperspb.UInt64(2)
	resp, err := c.ShouldRateLimit(context.Background(), rlsRequest("d", d1, d2))
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v, want OVER_LIMIT", err)
	}
	if got := render(resp); got != "OVER_LIMIT: OVER/5 OVER/5" {
		t.Errorf("got %q, want both over with nothing taken", got)
	}
}

// A limit the request carries above sluice.MaxRate is counted at that
// rate, not refused with the whole request.
func TestRLSOverrideAboveMaxRate(t *testing.T) {
	svc := newMemService(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n", newFakeClock())
	c := serveRLS(t, svc)
	o := desc("user=a")
	o.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: math.MaxUint32, Unit: typev3.RateLimitUnit_SECOND}
	resp, err := c.ShouldRateLimit(context.Background(), rlsRequest("d", o, desc("k=x")))
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[1].LimitRemaining != 4 {
		t.Errorf("response %v, want OK and the other descriptor taken", resp)
	}
}

// A limit the request carries with a unit_multiplier counts over a window
// of that many units, and says so in its status, as Envoy's API defines it;
// one whose window would pass sluice.MaxPeriod is refused.
func TestRLSOverrideUnitMultiplier(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n", clock)
	c := serveRLS(t, svc)
	o := desc("user=a")
	o.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 2, Unit: typev3.RateLimitUnit_SECOND,
		UnitMultiplier: wrapperspb.UInt32(10)}
	for _, step := range []struct {
		at   time.Duration
		want rlsv3.RateLimitResponse_Code
	}{
		{time.Second, rlsv3.RateLimitResponse_OK},
		{2 * time.Second, rlsv3.RateLimitResponse_OK},
		{3 * time.Second, rlsv3.RateLimitResponse_OVER_LIMIT},
		{9 * time.Second, rlsv3.RateLimitResponse_OVER_LIMIT}, // 2 per second would admit again
		{10 * time.Second, rlsv3.RateLimitResponse_OK},
	} {
		clock.Set(t0.Add(step.at))
		resp := call(t, c, rlsRequest("d", o))
		st := resp.Statuses[0]
		if resp.OverallCode != step.want {
			t.Errorf("at %v: %v, want %v", step.at, resp.OverallCode, step.want)
		}
		if l := st.CurrentLimit; l.GetRequestsPerUnit() != 2 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_SECOND || l.GetUnitMultiplier().GetValue() != 10 {
			t.Errorf("at %v: current_limit %v, want 2 per 10 × SECOND", step.at, l)
		}
	}
	o.Limit.UnitMultiplier = wrapperspb.UInt32(math.MaxUint32)
	o.Limit.Unit = typev3.RateLimitUnit_YEAR
	_, err := c.ShouldRateLimit(context.Background(), rlsRequest("d", o))
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("a window of 2^32 years: %v, want InvalidArgument", err)
	}
}

// A descriptor whose hits_addend exceeds its limit's capacity is over the
// limit with no Retry-After, nor a RateLimit field (whose t would be a
// wait): no wait would admit it.
func TestRLSHitsAboveCapacityNoRetryAfter(t *testing.T) {
	svc := newMemService(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 5}\n", newFakeClock())
	c := serveRLS(t, svc)
	d := desc("k=a")
	d.HitsAddend = wrapperspb.UInt64(6)
	resp, err := c.ShouldRateLimit(context.Background(), rlsRequest("d", d))
	if err != nil {
		t.Fatal(err)
	}
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || resp.Statuses[0].DurationUntilReset.AsDuration() != 0 {
		t.Errorf("response %v, want over the limit, reset 0 (nothing taken: full already)", resp)
	}
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == "Retry-After" || h.Key == "RateLimit" {
			t.Errorf("%s %q for hits no wait admits", h.Key, h.Value)
		}
	}
	if got := rlsHeader(resp, "RateLimit-Policy"); got == "" {
		t.Error("no RateLimit-Policy: the capacity should still be told")
	}
	d.HitsAddend = wrapperspb.UInt64(5) // at capacity: admitted, then one more waits
	if _, err := c.ShouldRateLimit(context.Background(), rlsRequest("d", d)); err != nil {
		t.Fatal(err)
	}
	d.HitsAddend = wrapperspb.UInt64(1)
	resp, err = c.ShouldRateLimit(context.Background(), rlsRequest("d", d))
	if err != nil {
		t.Fatal(err)
	}
	retry, rl := rlsHeader(resp, "Retry-After"), rlsHeader(resp, "RateLimit")
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || retry != "60" || !strings.HasSuffix(rl, ";t=60") {
		t.Errorf("one hit over a full window: %v, Retry-After %q, RateLimit %q; want over, 60, t=60", resp.OverallCode, retry, rl)
	}
}

// rlsHeader returns the value of the header named name that resp asks
// Envoy to add, or "".
func rlsHeader(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}

// An unknown domain is logged clipped, with its length, beside at most
// maxDomainsLogged configured ones: a client's domain must not make a log
// line as long as itself. One longer than maxDomainLen is refused.
func TestRLSUnknownDomainLogBounded(t *testing.T) {
	var yaml strings.Builder
	for i := range 15 {
		if i > 0 {
			yaml.WriteString("---\n")
		}
		fmt.Fprintf(&yaml, "domain: d%02d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n", i)
	}
	var logs syncBuffer
	mem := memory.New(nil)
	t.Cleanup(func() { mem.Close() })
	svc := NewService(mem, mustConfig(t, yaml.String()), &ServiceOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	c := serveRLS(t, svc)

	long := strings.Repeat("x", maxDomainLen-1) + "\n"
	if got, want := render(call(t, c, rlsRequest(long, desc("k=v")))), "OK: OK/-"; got != want {
		t.Errorf("long unknown domain: %q, want %q", got, want)
	}
	line := logs.String()
	if len(line) > 600 || !strings.Contains(line, `…(512 bytes)`) || strings.Contains(line, "\\n") || !strings.Contains(line, "d09 …(15 domains)]") {
		t.Errorf("log line of %d bytes:\n%s", len(line), line)
	}
	// The same clipped form is remembered: logged once.
	call(t, c, rlsRequest(long, desc("k=v")))
	if got := strings.Count(logs.String(), "unknown domain"); got != 1 {
		t.Errorf("%d log lines, want 1", got)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.ShouldRateLimit(ctx, rlsRequest(strings.Repeat("y", 1<<20), desc("k=v")))
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "domain of 1048576 bytes exceeds 512") {
		t.Errorf("1 MiB domain: %v, want InvalidArgument naming its length", err)
	}
	if got := strings.Count(logs.String(), "unknown domain"); got != 1 || len(logs.String()) > 600 {
		t.Errorf("after a 1 MiB domain, %d bytes of log:\n%.1000s", len(logs.String()), logs.String())
	}
}

// TestRLSStatelessRulesObserved: descriptors that match a block
// (requests_per_unit: 0, configured or carried in the request) or an
// unlimited rule, which the engine never sees, are decisions like the
// others, through a real gRPC client: counted in the metrics and the
// statistics (and so the overview) under the rule's path, blocks in the
// top keys' denials; an unlimited rule counts only in admitted requests.
func TestRLSStatelessRulesObserved(t *testing.T) {
	clock := newFakeClock()
	m := NewMetrics()
	store := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	cfg := mustConfig(t, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: remote_address
    value: 50.0.0.5
    rate_limit: {unit: second, requests_per_unit: 0}
  - key: path
    value: /health
    rate_limit: {unlimited: true}
  - key: dry
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 0}
`)
	svc := NewService(store, cfg, &ServiceOptions{Clock: clock.Now, Metrics: m})
	stateless := cfg.Stateless()
	if len(stateless) != 3 {
		t.Fatalf("stateless rules %q, want 3", stateless)
	}
	var blocked, dry, health string
	for _, name := range stateless {
		switch {
		case strings.Contains(name, "50.0.0.5"):
			blocked = name
		case strings.Contains(name, "dry"):
			dry = name
		default:
			health = name
		}
	}
	c := serveRLS(t, svc)
	block := desc()
	block.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 0, Unit: typev3.RateLimitUnit_MINUTE}
	block.Entries = desc("user=u").Entries
	for _, s := range []struct {
		descs []*rlcommon.RateLimitDescriptor
		want  rlsv3.RateLimitResponse_Code
	}{
		{[]*rlcommon.RateLimitDescriptor{desc("remote_address=50.0.0.5")}, rlsv3.RateLimitResponse_OVER_LIMIT},
		{[]*rlcommon.RateLimitDescriptor{desc("remote_address=50.0.0.5")}, rlsv3.RateLimitResponse_OVER_LIMIT},
		{[]*rlcommon.RateLimitDescriptor{desc("path=/health")}, rlsv3.RateLimitResponse_OK},
		{[]*rlcommon.RateLimitDescriptor{desc("path=/health")}, rlsv3.RateLimitResponse_OK},
		{[]*rlcommon.RateLimitDescriptor{desc("path=/health"), desc("remote_address=50.0.0.5")}, rlsv3.RateLimitResponse_OVER_LIMIT},
		{[]*rlcommon.RateLimitDescriptor{desc("dry=x")}, rlsv3.RateLimitResponse_OK},
		{[]*rlcommon.RateLimitDescriptor{block}, rlsv3.RateLimitResponse_OVER_LIMIT},
	} {
		if got := call(t, c, rlsRequest("edge", s.descs...)); got.OverallCode != s.want {
			t.Fatalf("%v: %v, want %v", s.descs, got.OverallCode, s.want)
		}
	}
	// A descriptor's hits_addend 0 only looks: no decision.
	look := desc("remote_address=50.0.0.5")
	look.HitsAddend = wrapperspb.UInt64(0)
	call(t, c, rlsRequest("edge", look))

	for _, w := range []struct {
		policy, outcome string
		n               float64
	}{
		{blocked, "denied", 3}, {health, "allowed", 2}, {dry, "shadow_denied", 1}, {config.OverrideName("edge"), "denied", 1},
		{"blocked", "denied", -1}, // the engine's stand-in is no policy
	} {
		if got := decisionCount(t, m, w.policy, w.outcome); got != w.n {
			t.Errorf("decisions{policy=%q,outcome=%s} = %v, want %v", w.policy, w.outcome, got, w.n)
		}
	}
	o := svc.mon.overview(svc.Stats().Snapshot())
	figures := map[string]PolicyFigures{}
	for _, f := range o.Policies {
		figures[f.Policy] = f
	}
	if f := figures[blocked]; f.Denied != 3 || f.Allowed != 0 {
		t.Errorf("overview of the block: %+v, want 3 denied", f)
	}
	if f := figures[health]; f.Allowed != 2 || f.Denied != 0 {
		t.Errorf("overview of the unlimited rule: %+v, want 2 allowed", f)
	}
	if f := figures[dry]; f.Denied != 1 {
		t.Errorf("overview of the shadow block: %+v, want 1 (shadow) denied", f)
	}
	top := svc.mon.top.Lists(TopN)
	found := false
	for _, e := range top.Denials {
		if e.Policy == blocked && e.Key == "remote_address=50.0.0.5" && e.Count == 3 {
			found = true
		}
		if e.Policy == health {
			t.Errorf("the unlimited rule among the top denials: %+v", e)
		}
	}
	if !found {
		t.Errorf("the block's key not among the top denials, 3 times: %+v", top.Denials)
	}
}

// A descriptor entry with an empty value is counted under that empty
// value, as envoyproxy/ratelimit counts it: every request sending it shares
// one budget, so an empty value never escapes the limit (docs/service.md).
func TestRLSEmptyValueSharesOneBudget(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, `
domain: edge
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: tier
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 1}
`, clock)
	c := serveRLS(t, svc)
	for i, want := range []string{"OK: OK/1", "OK: OK/0", "OVER_LIMIT: OVER/0"} {
		if got := render(call(t, c, rlsRequest("edge", desc("remote_address=")))); got != want {
			t.Errorf("empty remote_address, request %d: got %q, want %q", i+1, got, want)
		}
		if i == 0 {
			if got := render(call(t, c, rlsRequest("edge", desc("tier=gold", "user=")))); got != "OK: OK/0" {
				t.Errorf("empty user: got %q, want OK/0", got)
			}
		}
	}
	if got := render(call(t, c, rlsRequest("edge", desc("tier=gold", "user=")))); got != "OVER_LIMIT: OVER/0" {
		t.Errorf("empty user, second request: got %q, want OVER/0", got)
	}
	if got := render(call(t, c, rlsRequest("edge", desc("remote_address=10.0.0.1")))); got != "OK: OK/1" {
		t.Errorf("another address: got %q, want its own budget (OK/1)", got)
	}
}
