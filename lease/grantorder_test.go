package lease_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
)

// TestLeaseTakeAllOppositeOrders: layered TakeAlls over redisstore's
// GrantAll, half checking keys a then b and half b then a, on a Redis
// 1 ms away each way, with leases of 3 units that keep needing refills.
// A check whose key's refill another request holds leaves its TakeAll's
// grant batch before it waits (see grantBatch): waiting inside it, each
// TakeAll's batch waited for a check that waited for the other's, and
// neither ended. Every round ends well within its deadline, each TakeAll
// is all or nothing, and once Close has returned the leases, the units
// taken in Redis are the units admitted plus those the returns kept.
func TestLeaseTakeAllOppositeOrders(t *testing.T) {
	proxy := redistest.StartDelayProxy(t, redistest.Addr(t))
	proxy.SetDelay(time.Millisecond)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { client.Close() })
	rs := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	s, err := lease.New(rs, &lease.Options{MaxStaleness: 20 * time.Millisecond, Size: 3})
	if err != nil {
		t.Fatal(err)
	}
	// Windows of the longest period, so that units neither come back with
	// time nor go stale within the test (with windows of a day, a run across
	// UTC midnight counted two windows): b's run out part way, so that
	// checks deny too.
	la := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 1_000_000, Period: sluice.MaxPeriod}
	lb := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 900, Period: sluice.MaxPeriod}
	orders := [][]sluice.Request{
		{{Key: "a", Limit: la, Cost: 1}, {Key: "b", Limit: lb, Cost: 1}},
		{{Key: "b", Limit: lb, Cost: 1}, {Key: "a", Limit: la, Cost: 1}},
	}
	const (
		rounds   = 20
		workers  = 4 // half in each order
		takes    = 15
		deadline = 5 * time.Second
	)
	var admitted, denied atomic.Int64
	for round := range rounds {
		var wg sync.WaitGroup
		for w := range workers {
			reqs := orders[w%2]
			wg.Go(func() {
				for range takes {
					cctx, cancel := context.WithTimeout(ctx, deadline)
					ds, err := s.TakeAll(cctx, reqs)
					cancel()
					if err != nil {
						t.Errorf("round %d: TakeAll: %v", round, err)
						return
					}
					switch {
					case ds[0].Allowed && ds[1].Allowed:
						admitted.Add(1)
					case reqs[0].Key == "a" && !ds[1].Allowed, reqs[0].Key == "b" && !ds[0].Allowed:
						denied.Add(1) // only b runs out
					default:
						t.Errorf("round %d: %v denied: %+v", round, reqs, ds)
					}
				}
			})
		}
		done := make(chan struct{})
		go func() { wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(deadline):
			t.Fatalf("round %d: the TakeAlls still waiting after %v: deadlocked", round, deadline)
		}
		if t.Failed() {
			return
		}
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if denied.Load() == 0 || admitted.Load() == 0 {
		t.Fatalf("%d admitted, %d denied; want both", admitted.Load(), denied.Load())
	}
	var used int64
	for _, r := range orders[0] {
		d, err := rs.Peek(ctx, r.Key, r.Limit, 1)
		if err != nil {
			t.Fatal(err)
		}
		used += r.Limit.Rate - d.Remaining
	}
	// Each admission spent a unit of each key; a denial none.
	if want := 2*admitted.Load() + int64(st.Forfeited+st.Lost); used != want {
		t.Errorf("%d units taken in Redis; want %d: %d admitted twice, %d forfeited, %d lost (stats %+v)", used, want, admitted.Load(), st.Forfeited, st.Lost, st)
	}
	t.Logf("%d admitted, %d denied; stats %+v", admitted.Load(), denied.Load(), st)
}
