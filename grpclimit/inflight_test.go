package grpclimit

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// gate is a health service whose calls and streams wait in their handlers
// until the test lets them go (or the client goes away).
type gate struct {
	healthpb.UnimplementedHealthServer
	entered chan struct{}
	leave   chan struct{}
}

func newGate() *gate { return &gate{entered: make(chan struct{}, 16), leave: make(chan struct{})} }

func (g *gate) Check(ctx context.Context, req *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if req.Service == "pass" {
		return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
	}
	g.entered <- struct{}{}
	select {
	case <-g.leave:
	case <-ctx.Done():
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (g *gate) Watch(_ *healthpb.HealthCheckRequest, ss healthpb.Health_WatchServer) error {
	g.entered <- struct{}{}
	select {
	case <-g.leave:
	case <-ss.Context().Done():
	}
	return nil
}

// background makes a Check the gate holds; its error arrives when it ends.
func background(client healthpb.HealthClient, ctx context.Context) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		done <- err
	}()
	return done
}

// A unary call holds its slot until its handler returns; a call refused
// is RESOURCE_EXHAUSTED with RetryInfo, QuotaFailure and retry-after.
func TestInFlightUnary(t *testing.T) {
	t.Parallel()
	g := newGate()
	client := serveHealth(t, slotStore(t), nil, &Options{InFlight: oneAtATime}, g)
	done := background(client, context.Background())
	<-g.entered
	var header metadata.MD
	_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}, grpc.Header(&header))
	delay, subject := retryDelay(t, err)
	if delay != time.Hour || subject != "one" || len(header.Get("retry-after")) != 1 {
		t.Errorf("refusal: RetryInfo %v, subject %q, retry-after %q", delay, subject, header.Get("retry-after"))
	}
	close(g.leave)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "pass"}); err != nil {
		t.Errorf("after the first returned: %v", err)
	}
}

// A stream holds its slot until its handler returns: here, when the
// client cancels it.
func TestInFlightStream(t *testing.T) {
	t.Parallel()
	g := newGate()
	client := serveHealth(t, slotStore(t), nil, &Options{InFlight: oneAtATime}, g)
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := client.Watch(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	<-g.entered
	if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("while the stream holds: %v, want ResourceExhausted", err)
	}
	cancel()
	stream.Recv()
	var err2 error
	for range 100 { // the handler returns soon after the cancel reaches it
		_, err2 = client.Check(context.Background(), &healthpb.HealthCheckRequest{Service: "pass"})
		if status.Code(err2) != codes.ResourceExhausted {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err2 != nil {
		t.Errorf("after the stream ended: %v", err2)
	}
}

// Slots first, rate units second: a rate denial releases the slot.
func TestInFlightThenRate(t *testing.T) {
	t.Parallel()
	obs := &middlewaretest.Slots{}
	rate := []Rule{{Name: "rate", Limit: sluice.PerHour(1), Key: Global()}}
	client := serveHealth(t, slotStore(t), rate, &Options{InFlight: oneAtATime, Observer: obs}, healthServing{})
	for i, want := range []codes.Code{codes.OK, codes.ResourceExhausted, codes.ResourceExhausted} {
		if _, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{}); status.Code(err) != want {
			t.Errorf("call %d: %v, want %v", i, err, want)
		}
	}
	if a, r := obs.Get("one/acquire/allowed"), obs.Get("one/release/allowed"); a != 3 || r != 3 {
		t.Errorf("acquires %d, releases %d; want 3 and 3", a, r)
	}
}

// A panicking handler releases its slot, and the panic goes on.
func TestInFlightPanic(t *testing.T) {
	t.Parallel()
	in, err := New(slotStore(t), nil, &Options{InFlight: oneAtATime})
	if err != nil {
		t.Fatal(err)
	}
	info := &grpc.UnaryServerInfo{FullMethod: "/svc/M"}
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Errorf("recovered %v, want the handler's panic", v)
			}
		}()
		in.Unary()(context.Background(), nil, info, func(context.Context, any) (any, error) { panic("boom") })
	}()
	if _, err := in.Unary()(context.Background(), nil, info, func(context.Context, any) (any, error) { return nil, nil }); err != nil {
		t.Errorf("after the panic: %v (slot not released)", err)
	}
}

// Shedding refusals are UNAVAILABLE with RetryInfo; a priority from
// metadata is believed only from a trusted proxy.
func TestShedUnavailableAndTrustedPriority(t *testing.T) {
	t.Parallel()
	shed := []ShedRule{{Name: "fleet", Capacity: sluice.Concurrent(10, 30*time.Second), Reserve: sluice.Reserve{Critical: 1}}}
	for _, tt := range []struct {
		trusted []string
		want    codes.Code
	}{
		{nil, codes.Unavailable},
		{[]string{"10.0.0.0/8"}, codes.Unavailable},
		{[]string{"127.0.0.1"}, codes.OK},
	} {
		prio, err := PriorityMetadata("x-priority", &PriorityOptions{TrustedProxies: tt.trusted})
		if err != nil {
			t.Fatal(err)
		}
		client := serveHealth(t, slotStore(t), nil, &Options{Shed: shed, Priority: prio}, healthServing{})
		ctx := metadata.AppendToOutgoingContext(context.Background(), "x-priority", "critical")
		_, err = client.Check(ctx, &healthpb.HealthCheckRequest{})
		if status.Code(err) != tt.want {
			t.Errorf("trusted %v: %v, want %v", tt.trusted, err, tt.want)
			continue
		}
		if err == nil {
			continue
		}
		var retry time.Duration
		for _, d := range status.Convert(err).Details() {
			if d, ok := d.(*errdetails.RetryInfo); ok {
				retry = d.RetryDelay.AsDuration()
			}
		}
		if retry != 30*time.Second {
			t.Errorf("RetryInfo %v, want the 30s hold (everything is reserved above normal)", retry)
		}
	}
	if _, err := PriorityMetadata("x-priority", &PriorityOptions{Default: "vip"}); !errors.Is(err, sluice.ErrInvalidPriority) {
		t.Errorf("unknown default: %v", err)
	}
	if _, err := New(slotStore(t), nil, &Options{Shed: []ShedRule{{Name: "s", Workers: 4, Reserve: sluice.Reserve{Normal: 2}}}}); !errors.Is(err, sluice.ErrInvalidPriority) || !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("bad reserve: %v", err)
	}
}

// A shedding rule with neither Capacity nor Workers is refused by New
// saying so, named by its place in Options.Shed (it read "in-flight rule
// 1 ... in-flight max 0").
func TestShedNeitherMessage(t *testing.T) {
	t.Parallel()
	_, err := New(slotStore(t), nil, &Options{
		InFlight: []InFlightRule{{Name: "per-key", Limit: sluice.Concurrent(1, time.Minute), Key: Global()}},
		Shed:     []ShedRule{{Name: "s"}},
	})
	if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Fatalf("%v, want ErrInvalidConfig and sluice.ErrInvalidLimit", err)
	}
	if want := `shed rule 0: invalid rule: "s": neither Capacity (the fleet's) nor Workers (this process's) is set`; !strings.Contains(err.Error(), want) {
		t.Errorf("%q does not say %q", err, want)
	}
}

// healthServing answers every Check at once.
type healthServing struct {
	healthpb.UnimplementedHealthServer
}

func (healthServing) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// slotStore is a memory store on a fake clock: no hold runs out.
func slotStore(t *testing.T) sluice.Store {
	_, store := fakeStore(t)
	return store
}

// oneAtATime admits one call at a time.
var oneAtATime = []InFlightRule{{Name: "one", Limit: sluice.Concurrent(1, time.Hour), Key: Global()}}

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
