package redisstore_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// TestFaultColdStartWarm: resilient over a Store started cold (a new
// client, Redis's script cache empty) against a Redis 40 ms away, with
// resilient's 50 ms timeout. Warmed before it serves, no decision's first
// call pays a handshake or a NOSCRIPT, and the breaker never leaves
// closed. Without Warm the first calls time out and the breaker opened at
// start (measured: once in each of 5 runs).
func TestFaultColdStartWarm(t *testing.T) {
	race.SkipTiming(t)
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	proxy.SetDelay(20 * time.Millisecond)
	for _, warm := range []bool{true, false} {
		t.Run(fmt.Sprint("warm=", warm), func(t *testing.T) {
			if err := srv.Client(t).ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
			redisstore.DetectRefusals(c)
			t.Cleanup(func() { c.Close() })
			store := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
			var logs logtest.Log
			rs, err := resilient.New(store, &resilient.Options{Logger: logs.TextLogger()})
			if err != nil {
				t.Fatal(err)
			}
			if warm {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := store.Warm(ctx)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
			}
			var failed, calls atomic.Int64
			var wg sync.WaitGroup
			end := time.Now().Add(time.Second)
			l := sluice.PerSecond(1_000_000)
			for g := range 8 {
				wg.Go(func() {
					for i := 0; time.Now().Before(end); i++ {
						_, err := rs.Take(context.Background(), fmt.Sprint("k", g, ":", i%10), l, 1)
						calls.Add(1)
						if err != nil {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			opened := strings.Count(logs.String(), "resilient: breaker open")
			t.Logf("warm %v: %d calls, %d failed, breaker opened %d times, %d stalls; state %v", warm, calls.Load(), failed.Load(), opened, store.Stalls(), rs.State())
			if warm && (opened > 0 || rs.State() != sluice.BreakerClosed) {
				t.Errorf("breaker opened %d times after Warm, state %v:\n%.2000s", opened, rs.State(), logs.String())
			}
		})
	}
}

// TestFaultWarmRoundTripFollows: Warm's round trip seeds the lane the
// calls use, and only it, so RoundTrip follows Redis once calls answer:
// warmed 40 ms away, then with Redis near, it falls to the calls' figure.
// Seeded into the unbatched lane too, which a batching Store never sends
// on, it stayed at the warm-up's 40 ms for good (and so did
// sluice_redis_round_trip_seconds).
func TestFaultWarmRoundTripFollows(t *testing.T) {
	race.SkipTiming(t)
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	proxy.SetDelay(20 * time.Millisecond)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	store := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := store.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if rtt := store.RoundTrip(); rtt < 30*time.Millisecond {
		t.Fatalf("RoundTrip after Warm 40ms away: %v", rtt)
	}
	proxy.SetDelay(0)
	l := sluice.PerSecond(1_000_000)
	for i := range 2000 {
		if _, err := store.Take(ctx, fmt.Sprint("k", i%10), l, 1); err != nil {
			t.Fatal(err)
		}
	}
	if rtt := store.RoundTrip(); rtt > 10*time.Millisecond {
		t.Errorf("RoundTrip %v after 2,000 calls with Redis near, warmed 40ms away: still the warm-up's", rtt)
	}
}
