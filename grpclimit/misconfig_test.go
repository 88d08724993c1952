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
	"github.com/sluicehq/sluice/internal/unbuilt"
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

// New refuses a store that was never built: it used to be accepted and
// then fail every call with Internal.
func TestNewRefusesUnbuiltStore(t *testing.T) {
	t.Parallel()
	rules := []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: Global()}}
	for _, u := range unbuilt.Stores() {
		if in, err := New(u.Store, rules, nil); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("New(%s): %v, %v; want ErrInvalidConfig and ErrStoreNotBuilt", u.Name, in, err)
		}
	}
}

// A nil *Interceptor (New's error ignored) fails every call, unary and
// stream, with Internal naming the cause: it neither panics nor lets calls
// through unlimited. Over a real server and client.
func TestNilInterceptor(t *testing.T) {
	t.Parallel()
	var in *Interceptor
	client := healthOn(t, grpc.NewServer(grpc.UnaryInterceptor(in.Unary()), grpc.StreamInterceptor(in.Stream())), health.NewServer())
	ctx := context.Background()
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	checkNilStatus(t, "unary", err)
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = stream.Recv()
	}
	checkNilStatus(t, "stream", err)
}

func checkNilStatus(t *testing.T, what string, err error) {
	t.Helper()
	if st, _ := status.FromError(err); st.Code() != codes.Internal || !strings.Contains(st.Message(), "nil *grpclimit.Interceptor") {
		t.Errorf("%s call through a nil Interceptor: %v; want Internal naming it", what, err)
	}
}

// The interceptors refuse nil arguments with Internal rather than
// panicking: grpc never passes them, but a hand-made chain might.
func TestInterceptorNilArguments(t *testing.T) {
	t.Parallel()
	var in Interceptor
	ok := func(context.Context, any) (any, error) { return nil, nil }
	for name, err := range map[string]error{
		"nil info": func() error { _, err := in.Unary()(context.Background(), nil, nil, ok); return err }(),
		"nil handler": func() error {
			_, err := in.Unary()(context.Background(), nil, &grpc.UnaryServerInfo{FullMethod: "/a/b"}, nil)
			return err
		}(),
		"nil stream": in.Stream()(nil, nil, &grpc.StreamServerInfo{FullMethod: "/a/b"}, func(any, grpc.ServerStream) error { return nil }),
	} {
		if status.Code(err) != codes.Internal {
			t.Errorf("%s: %v, want Internal", name, err)
		}
	}
}

// A nil context (or a stream whose Context is nil) is refused with
// Internal too: keying the call on its metadata, or handing the handler
// nil, panicked.
func TestInterceptorNilContext(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	in, err := New(store, []Rule{
		{Name: "per-key", Limit: sluice.PerSecond(5), Key: Metadata("x-api-key")},
		{Name: "global", Limit: sluice.PerSecond(1), Key: Global(), Strategy: Delay, MaxDelay: time.Second},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var nilCtx context.Context
	ok := func(context.Context, any) (any, error) { return nil, nil }
	for i := range 2 { // the second would be delayed
		func() {
			defer func() {
				if p := recover(); p != nil {
					t.Errorf("unary call %d with a nil context panicked: %v", i, p)
				}
			}()
			_, err := in.Unary()(nilCtx, nil, &grpc.UnaryServerInfo{FullMethod: "/a/b"}, ok)
			if status.Code(err) != codes.Internal {
				t.Errorf("unary call %d with a nil context: %v, want Internal", i, err)
			}
		}()
	}
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Errorf("stream with a nil context panicked: %v", p)
			}
		}()
		err := in.Stream()(nil, nilContextStream{}, &grpc.StreamServerInfo{FullMethod: "/a/b"}, func(any, grpc.ServerStream) error { return nil })
		if status.Code(err) != codes.Internal {
			t.Errorf("stream with a nil context: %v, want Internal", err)
		}
	}()
}

// nilContextStream is a hand-made stream whose Context is nil; nothing
// else of it may be called.
type nilContextStream struct{ grpc.ServerStream }

func (nilContextStream) Context() context.Context { return nil }

type cvUser struct{ id string }

func (u *cvUser) String() string { return u.id }

type cvPanicky struct{}

func (cvPanicky) String() string { panic("boom") }

type cvKey struct{}

// An auth interceptor storing a nil *user for an anonymous caller: the
// per-user rule does not apply (ErrNoKey) and the per-IP rule limits the
// call; a panicking String method is Internal, logged. Without a recovery
// interceptor either one used to kill the server process. Over a real
// server and client.
func TestContextValueTypedNil(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	var logs logtest.Log
	in, err := New(store, []Rule{
		{Name: "per-user", Limit: sluice.PerMinute(1), Key: ContextValue(cvKey{})},
		{Name: "per-ip", Limit: sluice.PerMinute(2), Key: PeerIP()},
	}, &Options{Logger: logs.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	var value any = (*cvUser)(nil)
	auth := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		return h(context.WithValue(ctx, cvKey{}, value), req)
	}
	client := healthOn(t, grpc.NewServer(grpc.ChainUnaryInterceptor(auth, in.Unary())), health.NewServer())
	ctx := context.Background()
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		if status.Code(err) != want {
			t.Errorf("call %d with a nil *user: %v, want %v", i, err, want)
		}
		if st, _ := status.FromError(err); want == codes.ResourceExhausted && !strings.Contains(st.Message(), "per-ip") {
			t.Errorf("call %d: %q, want the per-ip rule named", i, st.Message())
		}
	}
	value = cvPanicky{} // no call in flight: the handler reads it after this write
	_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Internal {
		t.Errorf("a panicking String method: %v, want Internal", err)
	}
	if l := logs.Records(t); len(l) != 1 || !strings.Contains(l[0]["error"].(string), "panicked") {
		t.Errorf("log %v, want one line saying the String method panicked", l)
	}
}
