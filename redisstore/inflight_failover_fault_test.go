package redisstore_test

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultInFlightClusterFailover: four stores (as four processes) hold
// slots of one key, 16 holders at a time for 5-25 ms each under Max 8,
// while the key's master is killed and its replica promoted. Sampled each
// millisecond on whichever master serves the key, Redis never holds more
// than Max; in progress at once (from the holders' own accounts) at most
// Max more, those acknowledged but not yet replicated when the master
// died (measured: none); acquires succeed again after the promotion.
func TestFaultInFlightClusterFailover(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	prefix := redistest.Prefix(t)
	const max = 8
	limit := sluice.Concurrent(max, 3*time.Second)
	var stores []*redisstore.Store
	for range 4 {
		stores = append(stores, redisstore.New(cl.Client(t), &redisstore.Options{Prefix: prefix}))
	}
	const key = "failover"
	ctx := context.Background()
	zkey := stores[0].SlotKeys(key)[0]
	master := cl.MasterOf(t, zkey)
	replicas := cl.ReplicasOf(t, master)
	live := redis.NewScript(`local t = redis.call('TIME')
return redis.call('ZCOUNT', KEYS[1], '(' .. string.format('%d', t[1] * 1000000 + t[2]), '+inf')`)

	var inProgress, maxInProgress, maxHeld, acquired, afterPromotion atomic.Int64
	var promoted atomic.Bool
	stop := make(chan struct{})
	var wg sync.WaitGroup
	sampler := cl.Client(t)
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			n, err := live.Run(c, sampler, []string{zkey}).Int64()
			cancel()
			if err == nil && n > maxHeld.Load() {
				maxHeld.Store(n)
			}
		}
	})
	for w := range 16 {
		st := stores[w%len(stores)]
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				slot, d, err := sluice.AcquireSlot(c, st, key, limit, 1)
				cancel()
				if err != nil || !d.Allowed {
					time.Sleep(5 * time.Millisecond)
					continue
				}
				acquired.Add(1)
				if promoted.Load() {
					afterPromotion.Add(1)
				}
				n := inProgress.Add(1)
				for m := maxInProgress.Load(); n > m && !maxInProgress.CompareAndSwap(m, n); m = maxInProgress.Load() {
				}
				time.Sleep(time.Duration(5+rand.IntN(20)) * time.Millisecond)
				inProgress.Add(-1)
				c, cancel = context.WithTimeout(ctx, time.Second)
				_ = slot.Release(c) // failed, it frees at its hold timeout
				cancel()
			}
		})
	}
	time.Sleep(time.Second)
	before := acquired.Load()
	master.Kill()
	_, at := cl.AwaitMaster(t, 15*time.Second, replicas...)
	promoted.Store(true)
	time.Sleep(2 * time.Second)
	close(stop)
	wg.Wait()
	t.Logf("acquired %d before the kill, %d in all, %d after the promotion (at %v); most in progress %d, most held in Redis %d",
		before, acquired.Load(), afterPromotion.Load(), at.Format("15:04:05.000"), maxInProgress.Load(), maxHeld.Load())
	if n := maxHeld.Load(); n > max {
		t.Errorf("Redis held %d at once, Max %d", n, max)
	}
	if n := maxInProgress.Load(); n > 2*max {
		t.Errorf("%d in progress at once, Max %d: more than the acquires a failover can lose", n, max)
	}
	if before == 0 || afterPromotion.Load() == 0 {
		t.Errorf("acquired %d before the kill, %d after the promotion: want both", before, afterPromotion.Load())
	}
}
