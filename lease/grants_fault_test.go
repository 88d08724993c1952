package lease_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultLeaseTakeAllGrantsTogether: a TakeAll of 4 leased checks whose
// leases have all ended, on a Redis 5 ms away each way, sends its 4
// refills at once: with 4 batches in flight it takes about one round trip
// (p90 under 2), and with redisstore's default of 2 the last two go
// together in the next batch (under 3). Sent one after another, as
// before, it took 4 (about 41 ms). The failure policy's side of this is
// TestFaultLeaseTakeAllStallOneTimeout's.
//
//	go test -run TestFaultLeaseTakeAllGrantsTogether -v ./lease/
func TestFaultLeaseTakeAllGrantsTogether(t *testing.T) {
	race.SkipTiming(t)
	const (
		delay   = 5 * time.Millisecond
		d       = 50 * time.Millisecond
		samples = 60
	)
	proxy := redistest.StartDelayProxy(t, redistest.Addr(t))
	for _, tc := range []struct {
		inFlight int
		trips    float64 // the p90's bound, in round trips
	}{{4, 2}, {0, 3}} {
		t.Run(fmt.Sprintf("MaxInFlight %d", tc.inFlight), func(t *testing.T) {
			proxy.SetDelay(0)
			client := redis.NewClient(&redis.Options{Addr: proxy.Addr})
			t.Cleanup(func() { client.Close() })
			rs := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), MaxInFlight: tc.inFlight})
			s, err := lease.New(rs, &lease.Options{MaxStaleness: d, Size: 10})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close(ctx) })
			l := sluice.PerSecond(100_000)
			reqs := make([]sluice.Request, 4)
			for i := range reqs {
				reqs[i] = sluice.Request{Key: fmt.Sprint("k", i), Limit: l, Cost: 1}
			}
			takeAll := func() time.Duration {
				t.Helper()
				start := time.Now()
				ds, err := s.TakeAll(ctx, reqs)
				took := time.Since(start)
				if err != nil {
					t.Fatal(err)
				}
				for i, dec := range ds {
					if !dec.Allowed || dec.Source != sluice.SourceBackend {
						t.Fatalf("check %d = %+v; want admitted by a grant", i, dec)
					}
				}
				return took
			}
			// Scripts loaded and 4 connections pooled, without the delay
			// (a new connection's handshake is several round trips).
			for range 5 {
				takeAll()
				time.Sleep(d + 5*time.Millisecond)
			}
			proxy.SetDelay(delay)
			rtt := roundTrip(t, client)
			lat := make([]time.Duration, samples)
			for i := range lat {
				time.Sleep(d + 5*time.Millisecond) // every lease ends: 4 refills
				lat[i] = takeAll()
			}
			slices.Sort(lat)
			p50, p90, top := lat[samples/2], lat[samples*9/10], lat[samples-1]
			t.Logf("round trip %v; a TakeAll of 4 refills: p50 %v, p90 %v, max %v", rtt, p50, p90, top)
			if limit := time.Duration(tc.trips * float64(rtt)); p90 > limit {
				t.Errorf("p90 %v; want under %v (%v round trips of %v)", p90, limit, tc.trips, rtt)
			}
			if top > 200*time.Millisecond {
				t.Errorf("slowest TakeAll %v; want under 200ms", top)
			}
		})
	}
}

// roundTrip is the median of a few PINGs' round trips on client.
func roundTrip(t *testing.T, client *redis.Client) time.Duration {
	t.Helper()
	var rtts []time.Duration
	for range 9 {
		start := time.Now()
		if err := client.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		rtts = append(rtts, time.Since(start))
	}
	slices.Sort(rtts)
	return rtts[len(rtts)/2]
}
