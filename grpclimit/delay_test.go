package grpclimit

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/line"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/openloop"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// A call a Delay rule holds whose client cancels it, or whose deadline
// passes while it waits behind another, is no denial: the interceptor
// returns the context's code (Canceled, DeadlineExceeded), as for a store
// call its context ended, not ResourceExhausted, and the Observer counts
// no denial, as httplimit's and the service's do not. On frozen clocks
// (memory and a real Redis), so that a held call stays held: 1/s with a
// burst of 10, all taken (Redis keeps the key 10s of real time).
func TestDelayAbandoned(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(t0)
	mem := memory.New(&memory.Options{Clock: clock.Now})
	t.Cleanup(func() { mem.Close() })
	for name, store := range map[string]sluice.Store{
		"memory": mem,
		"redis":  middlewaretest.Redis(t, clock),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obs := &middlewaretest.Decisions{}
			in, err := New(store, []Rule{{Name: "d", Limit: sluice.PerSecond(1).WithBurst(10), Key: Global(), Strategy: Delay, MaxDelay: 10 * time.Second}},
				&Options{Observer: obs, Clock: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			// What the interceptor returned, seen from the one outside it.
			returned := make(chan codes.Code, 4)
			outer := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
				resp, err := h(ctx, req)
				returned <- status.Code(err)
				return resp, err
			}
			client := healthOn(t, grpc.NewServer(grpc.ChainUnaryInterceptor(outer, in.Unary())), health.NewServer())
			check := func(ctx context.Context) error {
				_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
				return err
			}
			for i := range 10 {
				if err := check(context.Background()); err != nil {
					t.Fatalf("call %d of the burst: %v", i, err)
				}
				<-returned
			}

			// A client that cancels while held.
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(200*time.Millisecond, cancel)
			if err := check(ctx); status.Code(err) != codes.Canceled {
				t.Fatalf("call cancelled while held: %v, want Canceled", err)
			}
			if code := <-returned; code != codes.Canceled {
				t.Errorf("call cancelled while held: the interceptor returned %v, want Canceled", code)
			}

			// A deadline the 2s wait fits, behind a call held first (then
			// cancelled).
			first, stop := context.WithCancel(context.Background())
			firstDone := make(chan struct{})
			go func() {
				defer close(firstDone)
				check(first)
			}()
			checks, err := in.rules.Collect(call{context.Background(), "/grpc.health.v1.Health/Check"}, nil)
			if err != nil || len(checks) != 1 {
				t.Fatalf("Collect: %v, %v", checks, err)
			}
			for deadline := time.Now().Add(5 * time.Second); !line.Waiting(store, checks[0].Key) && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			ctx, cancel = context.WithTimeout(context.Background(), 2500*time.Millisecond)
			err = check(ctx)
			cancel()
			if status.Code(err) != codes.DeadlineExceeded {
				t.Errorf("call whose deadline passed while held: %v, want DeadlineExceeded", err)
			}
			// The server's deadline, or the client's cancel sent as its own
			// passed: whichever ended the call's context first.
			if code := <-returned; code != codes.DeadlineExceeded && code != codes.Canceled {
				t.Errorf("call whose deadline passed while held: the interceptor returned %v, want DeadlineExceeded or Canceled", code)
			}
			stop()
			<-firstDone
			if code := <-returned; code != codes.Canceled {
				t.Errorf("the call ahead, cancelled: the interceptor returned %v, want Canceled", code)
			}
			if n := obs.Get("d/denied"); n != 0 {
				t.Errorf("Observer counted %d denials, want none: no call was answered one", n)
			}
			if n := obs.Get("d/allowed"); n != 10 {
				t.Errorf("Observer counted %d admitted, want the burst's 10", n)
			}
		})
	}
}

// checkWithin makes a call with a deadline of d.
func checkWithin(client healthpb.HealthClient, d time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
	return err
}

// A Delay rule refuses at once a call whose deadline comes before its
// units could: ResourceExhausted with the wait it would have needed, as
// past MaxDelay, not DeadlineExceeded at the deadline. First denied, and
// a newcomer that finds a line. Not parallel: it watches this process's
// lines.
func TestDelayDeadline(t *testing.T) {
	store := middlewaretest.Memory(t)
	for _, tc := range []struct {
		name    string
		limit   sluice.Limit
		waiting bool // another call is held in line first
		least   time.Duration
	}{
		{"first", sluice.PerMinute(1), false, 50 * time.Second},
		{"line", sluice.PerSecond(1), true, 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := serve(t, store, []Rule{{Name: "d", Limit: tc.limit, Key: Global(), Strategy: Delay, MaxDelay: time.Hour}},
				&Options{Prefix: "deadline-" + tc.name + ":"})
			if err := checkWithin(client, time.Minute); err != nil {
				t.Fatal(err)
			}
			held := make(chan error, 1)
			if tc.waiting {
				go func() { held <- checkWithin(client, 10*time.Second) }()
				for line.Len() == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			err := checkWithin(client, 200*time.Millisecond)
			if code := status.Code(err); code != codes.ResourceExhausted {
				t.Fatalf("call with a 200ms deadline: %v; want ResourceExhausted at once", err)
			}
			if delay, _ := retryDelay(t, err); delay < tc.least {
				t.Errorf("RetryInfo %v, want at least %v", delay, tc.least)
			}
			if tc.waiting {
				if err := <-held; err != nil {
					t.Errorf("held call: %v", err)
				}
			}
		})
	}
}

// An open-loop schedule of calls with 500ms deadlines through a Delay rule
// with a long MaxDelay: a call the line cannot serve by its deadline is
// refused at once (ResourceExhausted), never held to DeadlineExceeded.
func TestDelayDeadlineOpenLoop(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	store := middlewaretest.Memory(t)
	limit := sluice.PerSecond(10)
	openloop.Replay(t, 4, limit, func(t *testing.T, name string) func() bool {
		client := serve(t, store, []Rule{{Name: "d", Limit: limit, Key: Global(), Strategy: Delay, MaxDelay: 5 * time.Second}},
			&Options{Prefix: "deadline-" + name + ":"})
		return func() bool {
			err := checkWithin(client, 500*time.Millisecond)
			if code := status.Code(err); code != codes.OK && code != codes.ResourceExhausted {
				t.Errorf("call: %v; want OK or ResourceExhausted", err)
			}
			return err == nil
		}
	})
}
