package grpclimit

import (
	"context"
	"errors"
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

// Over a lease store whose MaxStaleness applies to every limit, a sliding
// window log rule is answered exactly, never an error; a rule the store
// refuses for every key fails New.
func TestLeaseLogRule(t *testing.T) {
	t.Parallel()
	clk, mem := fakeStore(t)
	ls, err := lease.New(mem, &lease.Options{MaxStaleness: time.Second, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	client := serve(t, ls, []Rule{{Name: "log", Limit: sluice.PerMinute(2).WithAlgorithm(sluice.SlidingWindowLog), Key: Global()}}, &Options{Clock: clk.Now})
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if got := status.Code(err); got != want {
			t.Fatalf("call %d: %v, want %v", i+1, err, want)
		}
	}
	long, err := lease.New(mem, &lease.Options{MaxStaleness: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(long, []Rule{{Name: "fast", Limit: sluice.PerSecond(10), Key: Global()}}, nil); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, lease.ErrInvalidStaleness) {
		t.Errorf("MaxStaleness above a rule's period: New err = %v, want ErrInvalidConfig and lease.ErrInvalidStaleness", err)
	}
}

// A Penalty rule's block limit (one unit per Penalty) is checked at New
// too: a lease store whose staleness is longer than the Penalty fails
// every call under the rule otherwise.
func TestRedisLeasePenaltyCheckedAtNew(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	rs := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clk.Now})
	ls, err := lease.New(rs, &lease.Options{MaxStaleness: time.Second, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{Name: "login", Limit: sluice.Limit{Rate: 2, Period: 10 * time.Second}, Key: Global(), Strategy: Penalty, Penalty: 200 * time.Millisecond}
	if _, err := New(ls, []Rule{rule}, nil); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, lease.ErrInvalidStaleness) {
		t.Fatalf("Penalty shorter than MaxStaleness: New err = %v, want ErrInvalidConfig and lease.ErrInvalidStaleness", err)
	}
	rule.Penalty = 2 * time.Second
	client := serve(t, ls, []Rule{rule}, &Options{Clock: clk.Now})
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
		if got := status.Code(err); got != want {
			t.Fatalf("call %d: %v, want %v", i+1, err, want)
		}
	}
}
