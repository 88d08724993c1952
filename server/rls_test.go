package server

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/memory"
)

// rlsStep is one request at clock offset at, and the statuses it must get
// (see codes).
type rlsStep struct {
	at     time.Duration
	domain string
	descs  [][]string
	hits   uint32
	want   string
}

func runSteps(t *testing.T, svc *Service, clock *fakeClock, steps []rlsStep) {
	t.Helper()
	c := serveRLS(t, svc)
	for i, s := range steps {
		clock.Set(t0.Add(s.at))
		req := &rlsv3.RateLimitRequest{Domain: s.domain, HitsAddend: s.hits}
		for _, d := range s.descs {
			req.Descriptors = append(req.Descriptors, desc(d...))
		}
		if got := render(call(t, c, req)); got != s.want {
			t.Errorf("step %d (%s %v hits %d at %v): got %q, want %q", i, s.domain, s.descs, s.hits, s.at, got, s.want)
		}
	}
}

func readFile(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(name)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestEnvoyReadmeExamples loads the configuration examples of
// envoyproxy/ratelimit's README unchanged and checks the decisions the
// README describes for each. One deliberate difference: when a request is
// over the limit, sluice takes nothing from its other descriptors (Example
// 2), where envoyproxy/ratelimit counts the hit against them too.
func TestEnvoyReadmeExamples(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, readFile(t, "testdata/envoy-readme.yaml"), clock)
	type d = []string
	tests := []struct {
		name  string
		steps []rlsStep
	}{
		{"1: two values of one key, 500/s each", []rlsStep{
			{0, "mongo_cps", [][]string{{"database=users"}}, 500, "OK: OK/0"},
			{0, "mongo_cps", [][]string{{"database=users"}}, 0, "OVER_LIMIT: OVER/0"},
			{0, "mongo_cps", [][]string{{"database=default"}}, 0, "OK: OK/499"},
			{0, "mongo_cps", [][]string{{"database=other"}}, 0, "OK: OK/-"},
			{time.Second, "mongo_cps", [][]string{{"database=users"}}, 0, "OK: OK/499"},
		}},
		{"2: nested marketing limit and a per-number limit, in one request", []rlsStep{
			{0, "messaging", [][]string{{"message_type=marketing", "to_number=2061111111"}, {"to_number=2061111111"}}, 4, "OK: OK/1 OK/96"},
			{0, "messaging", [][]string{{"message_type=marketing", "to_number=2061111111"}, {"to_number=2061111111"}}, 0, "OK: OK/0 OK/95"},
			{0, "messaging", [][]string{{"message_type=marketing", "to_number=2061111111"}, {"to_number=2061111111"}}, 0, "OVER_LIMIT: OVER/0 OK/95"},
			{0, "messaging", [][]string{{"to_number=2061111111"}}, 0, "OK: OK/94"},
			{0, "messaging", [][]string{{"message_type=marketing", "to_number=2062222222"}}, 0, "OK: OK/4"},
			{0, "messaging", [][]string{{"message_type=transactional", "to_number=2061111111"}}, 0, "OK: OK/-"},
		}},
		{"3: key+value is more specific than key; 0 blocks", []rlsStep{
			{0, "edge_proxy_per_ip", [][]string{{"remote_address=50.0.0.1"}}, 0, "OK: OK/9"},
			{0, "edge_proxy_per_ip", [][]string{{"remote_address=50.0.0.5"}}, 0, "OVER_LIMIT: OVER/0"},
			{0, "edge_proxy_per_ip", [][]string{{"remote_address=50.0.0.1"}}, 9, "OK: OK/0"},
			{0, "edge_proxy_per_ip", [][]string{{"remote_address=50.0.0.1"}}, 0, "OVER_LIMIT: OVER/0"},
		}},
		{"4: matching needs the same depth", []rlsStep{
			{0, "example4_a", [][]string{{"key=value", "subkey=subvalue"}}, 0, "OK: OK/-"},
			{0, "example4_a", [][]string{{"key=value"}}, 0, "OK: OK/299"},
			{0, "example4_b", [][]string{{"key=value", "subkey=subvalue"}}, 0, "OK: OK/299"},
			{0, "example4_b", [][]string{{"key=value"}}, 0, "OK: OK/-"},
		}},
		{"5: unlimited", []rlsStep{
			{0, "internal", [][]string{{"ldap=anything"}}, 1000, "OK: unl"},
			{0, "internal", [][]string{{"azure=x"}}, 0, "OK: OK/99"},
			{0, "internal", [][]string{{"ldap=a"}, {"azure=x"}}, 0, "OK: unl OK/98"},
		}},
		{"6: shadow_mode never limits", []rlsStep{
			{0, "example6", [][]string{{"service=auth-service", "user=user-a"}}, 10, "OK: OK/0"},
			{0, "example6", [][]string{{"service=auth-service", "user=user-a"}}, 0, "OK: OK/0"},
			{0, "example6", [][]string{{"service=auth-service", "user=user-b"}}, 20, "OK: OK/0"},
			{0, "example6", [][]string{{"service=auth-service", "user=user-b"}}, 0, "OVER_LIMIT: OVER/0"},
		}},
		{"7: replaces", []rlsStep{
			{0, "example7", [][]string{{"key_1=value_1", "user=bkthomps"}}, 0, "OK: OK/4"},
			{0, "example7", [][]string{{"key_2=value_2", "user=bkthomps"}}, 0, "OK: OK/9"},
			// Together only the replacing 10/s limit applies, and the
			// replaced 5/s limit is not touched.
			{0, "example7", [][]string{{"key_1=value_1", "user=bkthomps"}, {"key_2=value_2", "user=bkthomps"}}, 0, "OK: OK/- OK/8"},
			{0, "example7", [][]string{{"key_1=value_1", "user=bkthomps"}}, 0, "OK: OK/3"},
		}},
		{"8: detailed_metric does not change limits", []rlsStep{
			{0, "example8", [][]string{{"key1=unspecified_value"}}, 0, "OK: OK/9"},
			{0, "example8", [][]string{{"key1=unspecified_value2"}}, 0, "OK: OK/9"},
			{0, "example8", [][]string{{"key1=value1"}}, 0, "OK: OK/19"},
		}},
		{"9: wildcard values, one counter per value", []rlsStep{
			{0, "example9", [][]string{{"key1=value_1"}}, 0, "OK: OK/19"},
			{0, "example9", [][]string{{"key1=value_2"}}, 0, "OK: OK/19"},
			{0, "example9", [][]string{{"key1=value_1"}}, 0, "OK: OK/18"},
			{0, "example9", [][]string{{"key1=other"}}, 0, "OK: OK/-"},
		}},
		{"10: value_to_metric does not change limits", []rlsStep{
			{0, "example10", [][]string{{"route=api", "http_method=GET", "subject_id=123"}}, 0, "OK: OK/59"},
			{0, "example10", [][]string{{"route=web", "http_method=POST", "subject_id=456"}}, 0, "OK: OK/59"},
			{0, "example10_wildcard", [][]string{{"user=alice", "action=readfile", "resource=documents"}}, 0, "OK: OK/99"},
			{0, "example10_wildcard", [][]string{{"user=alice", "action=write", "resource=documents"}}, 0, "OK: OK/-"},
		}},
		{"11: share_threshold shares one counter across a wildcard", []rlsStep{
			{0, "example11", [][]string{{"files=files/a.pdf"}}, 5, "OK: OK/5"},
			{0, "example11", [][]string{{"files=files/b.csv"}}, 5, "OK: OK/0"},
			{0, "example11", [][]string{{"files=files/c.txt"}}, 0, "OVER_LIMIT: OVER/0"},
			{0, "example11", [][]string{{"files_no_share=files_no_share/a.pdf"}}, 10, "OK: OK/0"},
			{0, "example11", [][]string{{"files_no_share=files_no_share/b.csv"}}, 0, "OK: OK/9"},
			{0, "example11_metrics", [][]string{{"route=api/v1", "method=GET"}}, 0, "OK: OK/59"},
			{0, "example11_metrics", [][]string{{"route=api/v2", "method=GET"}}, 0, "OK: OK/58"},
		}},
	}
	_ = d{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { runSteps(t, svc, clock, tt.steps) })
	}
}

// TestEnvoyExampleConfig runs envoyproxy/ratelimit's own example config
// (examples/ratelimit/config/example.yaml) through the cases its
// integration tests exercise.
func TestEnvoyExampleConfig(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, readFile(t, "testdata/envoy-example.yaml"), clock)
	runSteps(t, svc, clock, []rlsStep{
		{0, "rl", [][]string{{"foo=x"}}, 0, "OK: OK/1"},
		{0, "rl", [][]string{{"foo=x"}}, 0, "OK: OK/0"},
		{0, "rl", [][]string{{"foo=x"}}, 0, "OVER_LIMIT: OVER/0"},
		{0, "rl", [][]string{{"foo=x", "bar=y"}}, 0, "OK: OK/2"},
		{0, "rl", [][]string{{"foo=x", "bar=banned"}}, 0, "OVER_LIMIT: OVER/0"},
		{0, "rl", [][]string{{"foo=x", "baz=shady"}}, 3, "OK: OK/0"},
		{0, "rl", [][]string{{"foo=x", "baz=shady"}}, 0, "OK: OK/0"},                  // shadow_mode
		{0, "rl", [][]string{{"foo=x", "baz=not-so-shady"}}, 4, "OVER_LIMIT: OVER/3"}, // 4 > 3: never admissible
		{0, "rl", [][]string{{"foo=x", "bay=z"}}, 0, "OK: unl"},
		{0, "rl", [][]string{{"qux=anything"}}, 0, "OK: unl"},
		{0, "rl", [][]string{{"unspec=u1"}}, 0, "OK: OK/1"},
		// bar=banned is named banned_limit; destination_cluster=override
		// replaces it, so only the override's 2/min applies.
		{0, "rl", [][]string{{"foo=y", "bar=banned"}, {"source_cluster=proxy", "destination_cluster=override"}}, 0, "OK: OK/- OK/1"},
		// category=account replaces bkthomps (bar=bkthomps and the
		// bkthomps destination replaced it too).
		{0, "rl", [][]string{{"category=account"}, {"foo=z", "bar=bkthomps"}}, 0, "OK: OK/3 OK/-"},
		{0, "rl", [][]string{{"foo=z", "bar=bkthomps"}}, 0, "OK: OK/0"},
		{0, "rl", [][]string{{"source_cluster=proxy", "destination_cluster=mock"}}, 0, "OK: OK/0"},
		{0, "rl", [][]string{{"source_cluster=proxy", "destination_cluster=mock"}}, 0, "OVER_LIMIT: OVER/0"},
		{time.Minute, "rl", [][]string{{"source_cluster=proxy", "destination_cluster=mock"}}, 0, "OK: OK/0"},
	})
}

// TestHitsAddend: request-level hits_addend, per-descriptor hits_addend
// (which wins, and 0 means check only), and no quota leak when one
// descriptor is over.
func TestHitsAddend(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, `
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 5}
`, clock)
	c := serveRLS(t, svc)
	hit := func(n uint64) *wrapperspb.UInt64Value { return wrapperspb.UInt64(n) }
	steps := []struct {
		name  string
		hits  uint32
		ha    *wrapperspb.UInt64Value
		hb    *wrapperspb.UInt64Value
		want  string
		after string // a, b remaining afterwards, peeked with hits 0
	}{
		{"default one hit each", 0, nil, nil, "OK: OK/9 OK/4", "OK: OK/9 OK/4"},
		{"request hits 3", 3, nil, nil, "OK: OK/6 OK/1", "OK: OK/6 OK/1"},
		{"descriptor hits win", 3, hit(1), hit(0), "OK: OK/5 OK/1", "OK: OK/5 OK/1"},
		{"b over: a keeps its quota", 0, hit(2), hit(2), "OVER_LIMIT: OK/5 OVER/1", "OK: OK/5 OK/1"},
		{"b exactly", 0, hit(5), hit(1), "OK: OK/0 OK/0", "OK: OK/0 OK/0"},
	}
	negative := desc("a=x")
	negative.HitsAddend, negative.IsNegativeHits = hit(3), true
	if got, want := render(call(t, c, rlsRequest("d", negative))), "OK: OK/10"; got != want {
		t.Errorf("negative hits: got %q, want %q (checked, nothing taken)", got, want)
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			da, db := desc("a=x"), desc("b=y")
			da.HitsAddend, db.HitsAddend = s.ha, s.hb
			if got := render(call(t, c, &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: s.hits, Descriptors: []*rlcommon.RateLimitDescriptor{da, db}})); got != s.want {
				t.Errorf("got %q, want %q", got, s.want)
			}
			pa, pb := desc("a=x"), desc("b=y")
			pa.HitsAddend, pb.HitsAddend = hit(0), hit(0)
			if got := render(call(t, c, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{pa, pb}})); got != s.after {
				t.Errorf("afterwards got %q, want %q", got, s.after)
			}
		})
	}
}

// TestRLSResponseFields checks a status's current_limit,
// duration_until_reset and the response headers.
func TestRLSResponseFields(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 2, name: two}
  - key: tb
    rate_limit: {unit: second, requests_per_unit: 10, algorithm: token_bucket}
`, clock)
	c := serveRLS(t, svc)
	clock.Set(t0.Add(15 * time.Second))
	resp := call(t, c, rlsRequest("d", desc("k=v")))
	s := resp.Statuses[0]
	if s.CurrentLimit.GetRequestsPerUnit() != 2 || s.CurrentLimit.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || s.CurrentLimit.GetName() != "two" {
		t.Errorf("current_limit = %v", s.CurrentLimit)
	}
	if got, want := s.DurationUntilReset.AsDuration(), 45*time.Second; got != want {
		t.Errorf("duration_until_reset = %v, want %v (the window's end)", got, want)
	}
	call(t, c, rlsRequest("d", desc("k=v")))
	resp = call(t, c, rlsRequest("d", desc("k=v")))
	headers := map[string]string{}
	for _, h := range resp.ResponseHeadersToAdd {
		headers[h.Key] = h.Value
	}
	want := map[string]string{
		"X-RateLimit-Limit": "2", "X-RateLimit-Remaining": "0", "Retry-After": "45",
		"RateLimit-Policy": `"d.k";q=2;w=60`, "RateLimit": `"d.k";r=0;t=45`,
		"X-RateLimit-Reset": itoa(t0.Add(time.Minute).Unix()),
	}
	for k, v := range want {
		if headers[k] != v {
			t.Errorf("header %s = %q, want %q", k, headers[k], v)
		}
	}
	// Another algorithm through the extra field: a token bucket refills
	// one token per 100ms.
	call(t, c, &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 10, Descriptors: []*rlcommon.RateLimitDescriptor{desc("tb=1")}})
	clock.Set(t0.Add(15*time.Second + 250*time.Millisecond))
	if got, want := render(call(t, c, rlsRequest("d", desc("tb=1")))), "OK: OK/1"; got != want {
		t.Errorf("token bucket after 250ms: got %q, want %q", got, want)
	}
}

func TestRLSRequestOverride(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, "domain: d\n", clock)
	c := serveRLS(t, svc)
	d := desc("user=a")
	d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: typev3.RateLimitUnit_HOUR}
	if got, want := render(call(t, c, rlsRequest("d", d))), "OK: OK/0"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := render(call(t, c, rlsRequest("d", d))), "OVER_LIMIT: OVER/0"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := render(call(t, c, rlsRequest("unknown", d))), "OK: OK/-"; got != want {
		t.Errorf("unknown domain: got %q, want %q", got, want)
	}
}

func TestRLSBadRequests(t *testing.T) {
	svc := newMemService(t, "domain: d\n", newFakeClock())
	c := serveRLS(t, svc)
	many := make([]*rlcommon.RateLimitDescriptor, MaxDescriptors+1)
	for i := range many {
		many[i] = desc(fmt.Sprintf("a=%d", i))
	}
	wide := make([]string, MaxDescriptorEntries+1)
	for i := range wide {
		wide[i] = fmt.Sprintf("k%d=v", i)
	}
	for name, req := range map[string]*rlsv3.RateLimitRequest{
		"empty domain":     rlsRequest("", desc("a=b")),
		"no descriptors":   rlsRequest("d"),
		"too many":         rlsRequest("d", many...),
		"too many entries": rlsRequest("d", desc(wide...)),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := c.ShouldRateLimit(t.Context(), req)
			if status.Code(err) != codes.InvalidArgument {
				t.Errorf("err = %v, want InvalidArgument", err)
			}
		})
	}
}

// TestSluicePoliciesOverRLS: sluice-format policies answer descriptors that
// fill their key templates, or name them with a leading policy entry; a
// policy's cost applies when the request sets no hits; overrides apply per
// key; shadow policies never limit.
func TestSluicePoliciesOverRLS(t *testing.T) {
	clock := newFakeClock()
	svc := newMemService(t, `
domain: api
policies:
  - name: per-user-route
    limit: 3/min
    key: "{user}:{route}"
    overrides:
      - match: ["vip:*"]
        limit: 100/min
  - name: expensive
    algorithm: sliding_window_log
    limit: 10/min
    cost: 5
    key: "{tenant}"
  - name: dry
    limit: fixed_window 1/min
    strategy: shadow
    key: "{ip}"
  - name: plain
    limit: 2/min
`, clock)
	runSteps(t, svc, clock, []rlsStep{
		{0, "api", [][]string{{"user=bob", "route=/a"}}, 0, "OK: OK/2"},
		{0, "api", [][]string{{"route=/a", "user=bob"}}, 2, "OK: OK/0"},
		{0, "api", [][]string{{"user=bob", "route=/a"}}, 0, "OVER_LIMIT: OVER/0"},
		{0, "api", [][]string{{"user=vip", "route=x"}}, 0, "OK: OK/99"},
		{0, "api", [][]string{{"tenant=t1"}}, 0, "OK: OK/5"},
		{0, "api", [][]string{{"tenant=t1"}}, 0, "OK: OK/0"},
		{0, "api", [][]string{{"tenant=t1"}}, 0, "OVER_LIMIT: OVER/0"},
		{0, "api", [][]string{{"ip=1.2.3.4"}}, 0, "OK: OK/0"},
		{0, "api", [][]string{{"ip=1.2.3.4"}}, 0, "OK: OK/0"},
		{0, "api", [][]string{{"policy=plain", "key=k"}}, 0, "OK: OK/1"},
		{0, "api", [][]string{{"policy=plain", "other=k"}}, 0, "OK: OK/-"},
		{0, "api", [][]string{{"user=bob"}}, 0, "OK: OK/-"},
	})
	// The JSON API reaches the same state with the rendered key.
	r, err := svc.Peek(t.Context(), "per-user-route", "bob:/a", 1)
	if err != nil || r.Decision.Allowed {
		t.Errorf("Peek(bob:/a) = %+v, %v; want denied", r.Decision, err)
	}
}

// plainStore hides the memory store's TakeAll.
type plainStore struct{ sluice.Store }

// Several limits at once need a store that takes them all-or-nothing: on
// another store such a request fails (UNAVAILABLE, naming the need) rather
// than leak quota, and single-descriptor requests still work.
func TestAllOrNothingWithoutTakeAll(t *testing.T) {
	store := memory.New(&memory.Options{SweepInterval: -1})
	defer store.Close()
	svc := NewService(plainStore{store}, mustConfig(t, `
domain: d
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 50, algorithm: sliding_window_log}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 80, algorithm: sliding_window_log}
`), nil)
	c := serveRLS(t, svc)
	_, err := c.ShouldRateLimit(context.Background(), rlsRequest("d", desc("user=u"), desc("tenant=t")))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), enforce.ErrNeedMultiStore.Error()) {
		t.Errorf("two limits on a plain store: %v, want UNAVAILABLE: %v", err, enforce.ErrNeedMultiStore)
	}
	if got, want := render(call(t, c, rlsRequest("d", desc("tenant=t")))), "OK: OK/79"; got != want {
		t.Errorf("one limit: %s, want %s (nothing leaked)", got, want)
	}
}
