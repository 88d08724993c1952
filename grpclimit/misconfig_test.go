package grpclimit

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
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
// a sliding window log) is Internal naming the cause, not Unavailable
// with a RetryInfo as for a Redis outage, observed as an error outcome. Over a real listener and Redis.
func TestRedisStoreRefusesRuleIsInternal(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	rs := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clk.Now})
	ls, err := lease.New(rs, &lease.Options{Clock: clk.Now, For: func(string, sluice.Limit) time.Duration { return time.Second }})
	if err != nil {
		t.Fatal(err)
	}
	obs := &errorCount{}
	client := serve(t, ls, []Rule{{Name: "log", Limit: sluice.PerMinute(3).WithAlgorithm(sluice.SlidingWindowLog), Key: Global()}},
		&Options{Clock: clk.Now, Observer: obs})
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	st := status.Convert(err)
	if st.Code() != codes.Internal {
		t.Fatalf("%v, want Internal", err)
	}
	for _, s := range []string{"misconfigured", `rule "log"`, "cannot grant"} {
		if !strings.Contains(st.Message(), s) {
			t.Errorf("message %q does not say %q", st.Message(), s)
		}
	}
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			t.Errorf("a RetryInfo %v: no wait mends a configuration", d)
		}
	}
	if n := obs.n.Load(); n != 1 {
		t.Errorf("observed %d error outcomes, want 1: a misconfiguration shows where errors do", n)
	}
}
