package grpclimit

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
)

// TestLease: the interceptors take a lease.Store as they take any store.
// On a frozen clock, grants of 4 units of 10/min answer one call in four
// from the store and the others from the lease; the ratelimit metadata's
// r is what is left in the lease and t the grant's reset, and the eleventh
// call waits for the next unit.
func TestLease(t *testing.T) {
	t.Parallel()
	clk, mem := fakeStore(t)
	ls, err := lease.New(mem, &lease.Options{MaxStaleness: time.Second, Size: 4, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	client := serve(t, ls, []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: Global()}}, &Options{Clock: clk.Now})
	want := []string{"r=3;t=24", "r=2;t=24", "r=1;t=24", "r=0;t=24", "r=3;t=48", "r=2;t=48", "r=1;t=48", "r=0;t=48", "r=1;t=60", "r=0;t=60"}
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
