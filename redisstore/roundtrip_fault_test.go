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

// TestFaultRoundTripFollowsFailover: once a frozen master's replica is
// promoted, Store.RoundTrip (sluice serve's sluice_redis_round_trip_seconds,
// and the slow-Redis line's figure) is the live masters' again. It was the
// slowest lane's ever used, so it stayed at the dead master's last timed-out
// calls for good, and the slow-Redis WARN line named that figure after the
// cluster had recovered.
func TestFaultRoundTripFollowsFailover(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	l := failoverLimit
	s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	keys, masters := keyPerMaster(t, cl, s, l)
	defer takeEach(s, keys, l, 5*time.Millisecond)()
	time.Sleep(300 * time.Millisecond)
	before := s.RoundTrip()
	m := masters[0]
	replicas := cl.ReplicasOf(t, m)
	m.Pause(t)
	_, at := cl.AwaitMaster(t, 10*time.Second, replicas...)
	// Thawed, the old master (a replica now) answers the calls it held,
	// seconds late: that lane's figure climbs to hundreds of ms, and
	// without its node among the masters nothing is sent to bring it down.
	m.Resume(t)
	time.Sleep(1500 * time.Millisecond)
	var after time.Duration
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		after = max(after, s.RoundTrip())
	}
	t.Logf("RoundTrip %v before the freeze, at most %v from 1.5 s to 2.5 s after the promotion (%v after it)",
		before, after, time.Since(at).Round(time.Millisecond))
	if after >= 20*time.Millisecond {
		t.Errorf("RoundTrip up to %v from 1.5 s to 2.5 s after the promotion, want the live masters' (under 20ms; %v before the freeze)", after, before)
	}
}

// TestFaultRoundTripStoppedMaster: with a master stopped (SIGSTOP: its
// port accepts connections, nothing answers) and no failover, RoundTrip
// answers at once, from the slot map in memory, with the figure of calls
// that went before. It listed the masters with go-redis's ForEachMaster,
// which reloads the slot map first, asking nodes one at a time: one that
// asked the stopped master first waited out the 100 ms bound, or on a
// client with go-redis's defaults its 3 s read timeout.
func TestFaultRoundTripStoppedMaster(t *testing.T) {
	race.SkipTiming(t)
	const (
		calls = 20
		bound = 20 * time.Millisecond
	)
	cl := stoppableCluster(t)
	l := failoverLimit
	s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	keys, masters := keyPerMaster(t, cl, s, l)
	for range 20 {
		for _, key := range keys {
			if _, err := s.Take(context.Background(), key, l, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := s.RoundTrip()
	masters[0].Pause(t)
	defer masters[0].Resume(t)
	var slowest time.Duration
	for i := range calls {
		start := time.Now()
		rtt := s.RoundTrip()
		took := time.Since(start)
		slowest = max(slowest, took)
		if took > bound {
			t.Fatalf("RoundTrip %d of %d with a master stopped took %v, want under %v", i+1, calls, took, bound)
		}
		if rtt <= 0 || rtt >= bound {
			t.Fatalf("RoundTrip %d of %d with a master stopped: %v, want the calls' figure (%v before the stop)", i+1, calls, rtt, before)
		}
	}
	t.Logf("RoundTrip %v before the stop; with a master stopped, %d calls answered in at most %v", before, calls, slowest)
}

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
			c := timedClient(t, redis.Options{Addr: proxy.Addr})
			redisstore.DetectRefusals(c)
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
	c := timedClient(t, redis.Options{Addr: proxy.Addr})
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
