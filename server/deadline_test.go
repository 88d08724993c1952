//go:build unix

package server

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/race"
)

// TestWithBudget: the store budget replaces the caller's deadline; the
// caller's cancellation still reaches the call, its deadline does not.
func TestWithBudget(t *testing.T) {
	end := time.Now().Add(time.Hour)

	parent, cancelParent := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancelParent()
	ctx, cancel := withBudget(parent, end)
	defer cancel()
	if _, ok := ctx.Deadline(); ok {
		t.Error("the budget context kept the caller's deadline")
	}
	if got, _ := ctx.Value(budgetKey{}).(time.Time); !got.Equal(end) {
		t.Errorf("budget %v, want %v", got, end)
	}
	<-parent.Done()
	time.Sleep(10 * time.Millisecond) // AfterFunc would have run by now
	if err := ctx.Err(); err != nil {
		t.Errorf("the caller's deadline ended the call: %v", err)
	}

	parent, cancelParent = context.WithCancel(context.Background())
	ctx, cancel = withBudget(parent, end)
	defer cancel()
	cancelParent()
	select {
	case <-ctx.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the caller's cancellation did not reach the call")
	}
	if !errors.Is(ctx.Err(), context.Canceled) {
		t.Errorf("err %v, want context.Canceled", ctx.Err())
	}
}

// TestFaultRLSDeadline: Envoy's default 20ms deadline with Redis stopped
// (SIGSTOP: connections hang). The store's budget ends 5ms before the
// deadline, so the failure policy answers (the local fallback's OK; under
// error, UNAVAILABLE) instead of the call running into DEADLINE_EXCEEDED
// behind a 50ms decision timeout.
func TestFaultRLSDeadline(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	cfg := writeConfig(t, "policies:\n  - name: api\n    limit: 1000/h\n")
	const (
		deadline = 20 * time.Millisecond
		waves    = 30
		wave     = 2
		calls    = waves * wave
	)
	for _, tt := range []struct {
		name     string
		noPolicy bool
		want     codes.Code
	}{
		{"local", false, codes.OK},
		{"error", true, codes.Unavailable},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv := runServer(t, Options{ConfigFile: cfg, RedisURL: r.url(), NoFailurePolicy: tt.noPolicy, WatchInterval: -1})
			conn := grpctest.Dial(t, srv.GRPCAddr())
			client := rlsv3.NewRateLimitServiceClient(conn)
			req := rlsRequest("sluice", desc("policy=api", "key=k"))
			call(t, client, req) // connected, to Redis too

			r.pause(t)
			defer r.resume(t)
			// Waves of concurrent calls, spaced so that one stall of a busy
			// machine spoils few samples. Under local, calls reach Redis
			// (and need the budget) until the breaker opens.
			var (
				mu   sync.Mutex
				lats []time.Duration
				got  = map[codes.Code]int{}
				wg   sync.WaitGroup
			)
			for range waves {
				for range wave {
					wg.Add(1)
					go func() {
						defer wg.Done()
						ctx, cancel := context.WithTimeout(context.Background(), deadline)
						defer cancel()
						start := time.Now()
						_, err := client.ShouldRateLimit(ctx, req)
						mu.Lock()
						defer mu.Unlock()
						lats = append(lats, time.Since(start))
						got[status.Code(err)]++
					}()
				}
				wg.Wait()
				time.Sleep(deadline)
			}
			slices.Sort(lats)
			p90 := lats[len(lats)*90/100]
			t.Logf("%d calls with a %v deadline: %v; latency p50 %v, p90 %v, max %v",
				calls, deadline, got, lats[len(lats)/2], p90, lats[len(lats)-1])
			// The client sees the policy's answer only if it came before
			// the deadline. A stall of a busy machine (of the server or of
			// this client) can outlast the 5ms margin: at a load of 20 on
			// two cores, 78-100% of calls got the policy's answer, the
			// handler ending about 15ms in. Without the budget, 0-12% do
			// (none under local while the breaker is closed).
			if got[tt.want] < calls*75/100 {
				t.Errorf("%d of %d calls got %v; want at least 75%%", got[tt.want], calls, tt.want)
			}
		})
	}
}
