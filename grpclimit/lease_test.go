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
	"github.com/sluicehq/sluice/lease"
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
