package lease_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
)

// Leases on a real Redis, dated by its TIME: 4 Stores (the processes of a
// fleet) × 8 goroutines on one hot key admit what the bound allows over
// the run and no more, and most decisions are answered in memory.
func TestRedis(t *testing.T) {
	client := redistest.Client(t)
	for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket, sluice.FixedWindow, sluice.SlidingWindowCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			t.Parallel()
			rs := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
			l := sluice.PerHour(2000).WithAlgorithm(alg)
			const d = 50 * time.Millisecond
			var admitted, local, cached atomic.Int64
			var wg sync.WaitGroup
			start := time.Now()
			for range 4 {
				s, err := lease.New(rs, &lease.Options{MaxStaleness: d, Size: 50})
				if err != nil {
					t.Fatal(err)
				}
				for range 8 {
					wg.Go(func() {
						for range 100 {
							dec, err := s.Take(ctx, "hot", l, 1)
							if err != nil {
								t.Error(err)
								return
							}
							if dec.Allowed {
								admitted.Add(1)
							}
							switch dec.Source {
							case sluice.SourceLease:
								local.Add(1)
							case sluice.SourceDenyCache:
								cached.Add(1)
							}
						}
					})
				}
				t.Cleanup(func() { s.Close(ctx) })
			}
			wg.Wait()
			elapsed := time.Since(start)
			bound := l.Capacity() + int64((elapsed+d)/l.Interval())
			if alg == sluice.FixedWindow || alg == sluice.SlidingWindowCounter {
				bound = 2 * l.Rate // the run may cross one window's edge
			}
			// Short of the capacity by at most what the leases hold at the
			// end and a unit per return (each is a little older than zero).
			got := admitted.Load()
			if got > bound || got < l.Capacity()-4*50-40 {
				t.Errorf("admitted %d of 3200 requests in %v; want at most %d and at least %d", got, elapsed, bound, l.Capacity()-4*50-40)
			}
			t.Logf("admitted %d of 3200 in %v (bound %d); %d answered by a lease, %d by a remembered denial", got, elapsed, bound, local.Load(), cached.Load())
			if local.Load() < got*9/10 {
				t.Errorf("%d of %d admissions answered by a lease, want most", local.Load(), got)
			}
		})
	}
}
