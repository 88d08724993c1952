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
	"github.com/sluicehq/sluice/resilient"
)

// TestFaultLeaseTakeAllGrantsTogether: a TakeAll of 4 leased checks whose
// leases have all ended, on a Redis 5 ms away each way, sends its 4
// refills in one GrantAll, one batch: about one round trip (p90 under
// 1.5), with redisstore's default MaxInFlight of 2 as with 4, and through
// a resilient.Store. Sent one after another it took 4 (about 41 ms); sent
// side by side, each a call of its own, 2 with the default (about 22 ms:
// the last two went in the next batch). The failure policy's side of this
// is TestFaultLeaseTakeAllStallOneTimeout's.
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
	const trips = 1.5 // the p90's bound, in round trips
	for _, tc := range []struct {
		inFlight  int // 0: the default
		resilient bool
	}{{4, false}, {0, false}, {0, true}} {
		t.Run(fmt.Sprintf("MaxInFlight %d resilient %v", tc.inFlight, tc.resilient), func(t *testing.T) {
			proxy.SetDelay(0)
			client := redis.NewClient(&redis.Options{Addr: proxy.Addr})
			t.Cleanup(func() { client.Close() })
			var g sluice.Granter = redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), MaxInFlight: tc.inFlight})
			if tc.resilient {
				var err error
				if g, err = resilient.NewMulti(g.(*redisstore.Store), &resilient.Options{Timeout: time.Second}); err != nil {
					t.Fatal(err)
				}
			}
			s, err := lease.New(g, &lease.Options{MaxStaleness: d, Size: 10})
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
			if limit := time.Duration(trips * float64(rtt)); p90 > limit {
				t.Errorf("p90 %v; want under %v (%v round trips of %v)", p90, limit, trips, rtt)
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
