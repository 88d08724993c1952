package grpclimit

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// A call costing more than its rule's capacity fails ResourceExhausted
// whatever the store says: with Redis down and no failure policy too,
// without the figures the store would have given, while a call the store
// must decide is Unavailable.
func TestRedisDownCostOverCapacity(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	cost := func(ctx context.Context, _ string) int64 {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get("x-cost"); len(v) > 0 {
			n, _ := strconv.ParseInt(v[0], 10, 64)
			return n
		}
		return 1
	}
	hc := serve(t, store, []Rule{{Name: "big", Limit: sluice.PerMinute(10), Key: Global(), Cost: cost}}, &Options{AllowedHeaders: AllHeaders})
	var hdr metadata.MD
	ctx := metadata.AppendToOutgoingContext(context.Background(), "x-cost", "11")
	_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&hdr))
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("cost 11 of 10, Redis down: %v, want ResourceExhausted", err)
	}
	for _, d := range st.Details() {
		if _, ok := d.(*errdetails.RetryInfo); ok {
			t.Errorf("a RetryInfo %v", d)
		}
	}
	for _, k := range []string{"retry-after", "ratelimit", "x-ratelimit-remaining", "x-ratelimit-reset"} {
		if v := hdr.Get(k); len(v) > 0 {
			t.Errorf("%s: %q, want none", k, v)
		}
	}
	if v := hdr.Get("x-ratelimit-limit"); len(v) != 1 || v[0] != "10" {
		t.Errorf("x-ratelimit-limit %q, want 10", v)
	}
	if _, err := hc.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.Unavailable {
		t.Errorf("cost 1, Redis down: %v, want Unavailable", err)
	}
}
