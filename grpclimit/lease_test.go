package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/lease"
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
	rs := middlewaretest.Redis(t, clk)
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

// TestLease: the interceptors take a lease.Store as they take any store.
// On a frozen clock, grants of 4 units of 10/min answer one call in four
// from the store and the others from the lease; the ratelimit metadata's
// r is the key's figure (the store's at the grant plus what the lease has
// not spent: in one process, what an exact limiter says) and t the grant's
// reset, and the eleventh call waits for the next unit.
func TestLease(t *testing.T) {
	t.Parallel()
	clk, mem := fakeStore(t)
	ls, err := lease.New(mem, &lease.Options{MaxStaleness: time.Second, Size: 4, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	client := serve(t, ls, []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: Global()}}, &Options{Clock: clk.Now})
	want := []string{"r=9;t=24", "r=8;t=24", "r=7;t=24", "r=6;t=24", "r=5;t=48", "r=4;t=48", "r=3;t=48", "r=2;t=48", "r=1;t=60", "r=0;t=60"}
	for i, w := range want {
		var header metadata.MD
		if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Header(&header)); err != nil {
			t.Fatalf("call %d: %v", i+1, err)
		}
		if got, w := strings.Join(header.Get("ratelimit"), ","), `"api";`+w; got != w {
			t.Errorf("call %d: ratelimit metadata %q, want %q", i+1, got, w)
		}
	}
	_, err = client.Check(context.Background(), &healthpb.HealthCheckRequest{})
	if delay, _ := retryDelay(t, err); delay != 6*time.Second {
		t.Errorf("RetryInfo %v, want 6s: the next unit of 10/min", delay)
	}
	if st := ls.Stats(); fmt.Sprint(st.Local, st.Grants, st.Granted) != "7 4 10" {
		t.Errorf("lease stats %+v, want 7 local decisions and 10 units in 4 grants", st)
	}
}
