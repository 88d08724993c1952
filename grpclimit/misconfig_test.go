package grpclimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/storetest"
)

// A limit the store refuses at a call (a lease store's Options.For leasing
// a sliding window log) is Internal with the generic message of every
// misconfiguration, not Unavailable with a RetryInfo as for a Redis
// outage; the rule and the cause go to Options.Logger, and the call is
// observed as an error outcome. Over a real listener and Redis.
func TestRedisStoreRefusesRuleIsInternal(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	rs := middlewaretest.Redis(t, clk)
	ls, err := lease.New(rs, &lease.Options{Clock: clk.Now, For: func(string, sluice.Limit) time.Duration { return time.Second }})
	if err != nil {
		t.Fatal(err)
	}
	obs := &middlewaretest.Decisions{}
	var logs logtest.Log
	client := serve(t, ls, []Rule{{Name: "log", Limit: sluice.PerMinute(3).WithAlgorithm(sluice.SlidingWindowLog), Key: Global()}},
		&Options{Clock: clk.Now, Observer: obs, Logger: logs.Logger()})
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	if st.Code() != codes.Internal || st.Message() != "grpclimit: rate limiter misconfigured" {
		t.Fatalf("%v, want Internal \"grpclimit: rate limiter misconfigured\"", err)
	}
	if len(st.Details()) != 0 {
		t.Errorf("details %v, want none: no wait mends a configuration", st.Details())
	}
	if n := obs.Get("log/error"); n != 1 {
		t.Errorf("observed %d error outcomes, want 1: a misconfiguration shows where errors do", n)
	}
	lines := logs.Records(t)
	if len(lines) != 1 {
		t.Fatalf("log lines %v, want one", lines)
	}
	l := lines[0]
	errText, _ := l["error"].(string)
	if l["level"] != "ERROR" || l["msg"] != "grpclimit: store refuses rule" || l["method"] != "/grpc.health.v1.Health/Check" ||
		!strings.Contains(errText, `rule "log"`) || !strings.Contains(errText, "cannot grant") {
		t.Errorf("log line %v, want ERROR \"grpclimit: store refuses rule\" naming the method, the rule and the cause", l)
	}
}

// A call a rule cannot weigh (Cost below 1) or key (its key function
// fails) gets Internal with a generic message: no rule name, package or
// error reaches the client. The detail goes to the Observer (an error for
// the rule) and to the log, once, saying which it was. Over a real server
// and client.
func TestMisconfiguredCallIsGeneric(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	for _, tt := range []struct {
		name, msg, detail string
		rule              Rule
	}{
		{
			name: "cost", msg: "grpclimit: rule cannot weigh call", detail: "invalid cost",
			rule: Rule{Name: "per-key", Limit: sluice.PerMinute(10), Key: Global(),
				Cost: func(context.Context, string) int64 { return 0 }},
		},
		{
			name: "key", msg: "grpclimit: rule cannot key call", detail: "vault sealed",
			rule: Rule{Name: "per-key", Limit: sluice.PerMinute(10),
				Key: func(context.Context, string) (string, error) { return "", errors.New("vault sealed") }},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs logtest.Log
			obs := &middlewaretest.Decisions{}
			client := serve(t, store, []Rule{tt.rule}, &Options{
				Observer: obs,
				Logger:   logs.Logger(),
			})
			for i := range 3 {
				_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
				st, _ := status.FromError(err)
				if st.Code() != codes.Internal || st.Message() != "grpclimit: rate limiter misconfigured" {
					t.Fatalf("call %d: %v, want Internal \"grpclimit: rate limiter misconfigured\"", i, err)
				}
				if len(st.Details()) != 0 {
					t.Errorf("call %d: details %v, want none", i, st.Details())
				}
			}
			if got := obs.Get("per-key/error"); got != 3 {
				t.Errorf("observed errors %d, want 3", got)
			}
			lines := logs.Records(t)
			if len(lines) != 1 {
				t.Fatalf("log lines %v, want one (the next within a minute are counted, not written)", lines)
			}
			l := lines[0]
			errText, _ := l["error"].(string)
			if l["level"] != "ERROR" || l["msg"] != tt.msg || l["method"] != "/grpc.health.v1.Health/Check" ||
				!strings.Contains(errText, `rule "per-key"`) || !strings.Contains(errText, tt.detail) {
				t.Errorf("log line %v, want ERROR %q naming the method, the rule and %q", l, tt.msg, tt.detail)
			}
		})
	}
}

// The failure log is paced per rule and kind of failure, and the calls it
// held back are counted when the period ends, though no call follows:
// 20 calls rule "a" cannot weigh are two lines accounting for all 20;
// rule "b"'s key failure and rule "c"'s weighing, within the same period,
// have lines of their own at once. Over a real server and client.
func TestMisconfiguredLogPaced(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	const every = time.Second
	failing := func(ctx context.Context) string {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-fail"); len(v) > 0 {
			return v[0]
		}
		return ""
	}
	weigh := func(rule string) func(context.Context, string) int64 {
		return func(ctx context.Context, _ string) int64 {
			if failing(ctx) == rule {
				return 0
			}
			return 1
		}
	}
	rules := []Rule{
		{Name: "a", Limit: sluice.PerMinute(1000), Key: Global(), Cost: weigh("a")},
		{Name: "b", Limit: sluice.PerMinute(1000), Key: func(ctx context.Context, _ string) (string, error) {
			if failing(ctx) == "b" {
				return "", errors.New("vault sealed")
			}
			return "k", nil
		}},
		{Name: "c", Limit: sluice.PerMinute(1000), Key: Global(), Cost: weigh("c")},
	}
	var logs logtest.Log
	in, err := New(store, rules, &Options{Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	in.failures.pace.Every = every
	client := healthOn(t, grpc.NewServer(grpc.UnaryInterceptor(in.Unary())), health.NewServer())

	calls := map[string]int64{"a": 20, "b": 1, "c": 3}
	start := time.Now()
	for _, rule := range []string{"a", "b", "c"} {
		for range calls[rule] {
			ctx := metadata.AppendToOutgoingContext(context.Background(), "x-fail", rule)
			_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
			if status.Code(err) != codes.Internal {
				t.Fatalf("rule %s: %v, want Internal", rule, err)
			}
		}
	}
	// The line counts hold when the calls fit in one period; the
	// accounting holds anyway.
	inOne := time.Since(start) < every/2
	if lines := logs.Records(t); inOne && len(lines) != 3 {
		t.Errorf("lines at once %v, want one per rule", lines)
	}
	time.Sleep(every + every/2)
	counted := map[string]int64{}
	lines := logs.Records(t)
	for _, l := range lines {
		errText, _ := l["error"].(string)
		n, _ := l["calls_not_logged"].(float64)
		for rule := range calls {
			if strings.HasPrefix(errText, `rule "`+rule+`"`) {
				counted[rule] += 1 + int64(n)
			}
		}
	}
	if inOne && len(lines) != 5 {
		t.Errorf("lines %v, want 5: one per rule at once, then one for a's 19 and one for c's 2 held back", lines)
	}
	for rule, want := range calls {
		if counted[rule] != want {
			t.Errorf("rule %s: lines account for %d calls, want %d", rule, counted[rule], want)
		}
	}
}
