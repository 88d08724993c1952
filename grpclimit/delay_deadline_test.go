package grpclimit

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/line"
	"github.com/sluicehq/sluice/internal/openloop"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/memory"
)

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
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
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
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
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
