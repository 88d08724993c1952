package grpclimit

import (
	"context"
	"errors"
	"log/slog"
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
	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/memory"
)

// The failure log is paced per rule and kind of failure, and the calls it
// held back are counted when the period ends, though no call follows:
// 20 calls rule "a" cannot weigh are two lines accounting for all 20;
// rule "b"'s key failure and rule "c"'s weighing, within the same period,
// have lines of their own at once. Over a real server and client.
func TestMisconfiguredLogPaced(t *testing.T) {
	t.Parallel()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
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
	var logs logBuffer
	in, err := New(store, rules, &Options{Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	in.failures.pace.Every = every
	srv := grpc.NewServer(grpc.UnaryInterceptor(in.Unary()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	client := healthpb.NewHealthClient(grpctest.Serve(t, srv))

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
	if lines := logs.lines(t); inOne && len(lines) != 3 {
		t.Errorf("lines at once %v, want one per rule", lines)
	}
	time.Sleep(every + every/2)
	counted := map[string]int64{}
	lines := logs.lines(t)
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
