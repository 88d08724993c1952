package grpclimit

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// A stream that outlives its hold keeps its slot: the interceptor extends
// it while the handler runs. Two servers, each on its own resilient store
// over one Redis: three streams on A take the three slots and run for 2.5
// holds, and B is refused all along; once they end, B is admitted.
func TestInFlightStreamExtended(t *testing.T) {
	t.Parallel()
	const hold = 600 * time.Millisecond
	prefix := redistest.Prefix(t)
	rules := []InFlightRule{{Name: "streams", Limit: sluice.Concurrent(3, hold), Key: Global()}}
	serveOn := func(g *gate) healthpb.HealthClient {
		store, err := resilient.New(redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: prefix}), nil)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { store.Close() })
		return serveHealth(t, store, nil, &Options{InFlight: rules}, g)
	}
	ga, gb := newGate(), newGate()
	a, b := serveOn(ga), serveOn(gb)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var streams []healthpb.Health_WatchClient
	for range 3 {
		s, err := a.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		streams = append(streams, s)
		<-ga.entered
	}
	for end := time.Now().Add(hold * 5 / 2); time.Now().Before(end); time.Sleep(hold / 4) {
		if _, err := b.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "pass"}); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("B while A's three streams run: %v, want ResourceExhausted (A's slots lost)", err)
		}
	}
	cancel()
	for _, s := range streams {
		s.Recv()
	}
	var err error
	for range 100 { // the handlers return soon after the cancel reaches them
		if _, err = b.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "pass"}); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err != nil {
		t.Errorf("B after A's streams ended: %v", err)
	}
}
