package grpclimit_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/grpclimit"
	"github.com/sluicehq/sluice/memory"
)

// Two calls a minute per API key, for unary calls and streams alike; a
// denied client reads how long to wait from the status's RetryInfo.
func Example() {
	store := memory.New(nil)
	defer store.Close()
	limits, err := grpclimit.New(store, []grpclimit.Rule{
		{Name: "per-key", Limit: sluice.PerMinute(2), Key: grpclimit.Metadata("x-api-key")},
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(grpc.UnaryInterceptor(limits.Unary()), grpc.StreamInterceptor(limits.Stream()))
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln := bufconn.Listen(1 << 20) // in memory; a real server listens on TCP
	go srv.Serve(ln)
	defer srv.Stop()

	conn, err := grpc.NewClient("passthrough:///example",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return ln.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-api-key", "alice")
	for range 3 {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		st := status.Convert(err)
		var wait time.Duration
		for _, d := range st.Details() {
			if ri, ok := d.(*errdetails.RetryInfo); ok {
				wait = ri.RetryDelay.AsDuration().Round(time.Second)
			}
		}
		fmt.Println(st.Code(), wait)
	}
	// Output:
	// OK 0s
	// OK 0s
	// ResourceExhausted 30s
}
