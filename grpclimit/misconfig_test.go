package grpclimit

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// errorCount counts the decisions observed as store failures.
type errorCount struct{ n atomic.Int64 }

func (c *errorCount) ObserveDecision(e sluice.DecisionEvent) {
	if e.Outcome == sluice.OutcomeError {
		c.n.Add(1)
	}
}
func (*errorCount) ObserveStore(sluice.StoreEvent)     {}
func (*errorCount) ObserveBreaker(sluice.BreakerEvent) {}

// A limit the store refuses at a call (a lease store's Options.For leasing
// a sliding window log) is Internal with the generic message of every
// misconfiguration, not Unavailable with a RetryInfo as for a Redis
// outage; the rule and the cause go to Options.Logger, and the call is
// observed as an error outcome. Over a real listener and Redis.
func TestRedisStoreRefusesRuleIsInternal(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	rs := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clk.Now})
	ls, err := lease.New(rs, &lease.Options{Clock: clk.Now, For: func(string, sluice.Limit) time.Duration { return time.Second }})
	if err != nil {
		t.Fatal(err)
	}
	obs := &errorCount{}
	var logs logBuffer
	client := serve(t, ls, []Rule{{Name: "log", Limit: sluice.PerMinute(3).WithAlgorithm(sluice.SlidingWindowLog), Key: Global()}},
		&Options{Clock: clk.Now, Observer: obs, Logger: slog.New(slog.NewJSONHandler(&logs, nil))})
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	if st.Code() != codes.Internal || st.Message() != "grpclimit: rate limiter misconfigured" {
		t.Fatalf("%v, want Internal \"grpclimit: rate limiter misconfigured\"", err)
	}
	if len(st.Details()) != 0 {
		t.Errorf("details %v, want none: no wait mends a configuration", st.Details())
	}
	if n := obs.n.Load(); n != 1 {
		t.Errorf("observed %d error outcomes, want 1: a misconfiguration shows where errors do", n)
	}
	lines := logs.lines(t)
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
