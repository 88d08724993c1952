package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultLateReplyKeepsConnection: calls whose replies come after their
// callers' deadlines (Redis 30 ms away, callers waiting 20 ms) fail at
// their deadlines, but their commands run on and their connections go
// back to the pool: go-redis with ContextTimeoutEnabled would otherwise
// close each one, and every next call would pay a new connection's
// handshake. A reply that does not come within lateFactor times the
// caller's budget still ends its connection.
func TestFaultLateReplyKeepsConnection(t *testing.T) {
	race.SkipTiming(t)
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	l := sluice.PerSecond(1_000_000)
	for _, tc := range []struct {
		name string
		opts redisstore.Options
	}{{"batched", redisstore.Options{}}, {"MaxBatch 1", redisstore.Options{MaxBatch: 1}}} {
		t.Run(tc.name, func(t *testing.T) {
			proxy.SetDelay(0)
			c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { c.Close() })
			opts := tc.opts
			opts.Prefix = redistest.Prefix(t)
			s := redisstore.New(c, &opts)
			take := func(wait time.Duration) error {
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				_, err := s.Take(ctx, "k", l, 1)
				return err
			}
			if err := take(5 * time.Second); err != nil { // the script loaded, a connection pooled
				t.Fatal(err)
			}

			proxy.SetDelay(15 * time.Millisecond)
			before := proxy.Accepted()
			for i := range 20 {
				st := time.Now()
				if err := take(20 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("call %d waiting 20ms for a 30ms round trip: %v after %v, want context.DeadlineExceeded", i, err, time.Since(st))
				}
			}
			for range 5 {
				if err := take(500 * time.Millisecond); err != nil {
					t.Fatalf("a call waiting 500ms for a 30ms round trip: %v", err)
				}
			}
			// Serial calls overlap only with the late replies before them.
			if n := proxy.Accepted() - before; n > 3 {
				t.Errorf("%d new connections for 25 serial calls, 20 of them answered late; want at most 3", n)
			}

			// Redis 2s away: a caller waiting 20ms ends its command's
			// connection within lateFactor (10) times that, not at the reply.
			open := proxy.Open()
			proxy.SetDelay(time.Second)
			start := time.Now()
			if err := take(20 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a call waiting 20ms for a 2s round trip: %v, want context.DeadlineExceeded", err)
			}
			for proxy.Open() >= open {
				if time.Since(start) > time.Second {
					t.Fatalf("the connection of a call whose reply is 2s away is still open after %v", time.Since(start))
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Logf("connection closed %v after the call started", time.Since(start).Round(time.Millisecond))
		})
	}
}
