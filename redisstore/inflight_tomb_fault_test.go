package redisstore_test

import (
	"context"
	"errors"
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

// TestFaultLateAcquireAfterAbandonedRelease: an acquire that times out
// here but reaches Redis after its abandoned release (held 1.5 s on its
// way, as by a congested link or a connection stuck behind a stall) is
// refused there by the release's tombstone: sampled every millisecond,
// Redis never counts its slot, never holds more than Max, and the acquire
// did run (it removed the tombstone). Without the tombstone Redis held
// that slot for the full 30 s hold, and with Max 2 beside one real holder
// refused every other acquire meanwhile.
//
//   - released first: the abandoned release (sluice.ReleaseAbandoned, as
//     AcquireSlot sends it) reaches Redis at once; its second try, a
//     second later, finds no holder either.
//   - Redis stalled: Redis is stopped (SIGSTOP) after the acquire left; a
//     release that times out and the abandoned release wait in its socket
//     buffers, and run when it resumes (SIGCONT), 300 ms later, still
//     before the acquire.
func TestFaultLateAcquireAfterAbandonedRelease(t *testing.T) {
	race.SkipTiming(t)
	const (
		max   = 2
		late  = 1500 * time.Millisecond // the acquire's way to Redis
		wait  = 50 * time.Millisecond   // the caller's budget
		stall = 300 * time.Millisecond
	)
	l := sluice.Concurrent(max, 30*time.Second)
	for _, stalled := range []bool{false, true} {
		name := "released first"
		if stalled {
			name = "Redis stalled"
		}
		t.Run(name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			proxy := redistest.StartDelayProxy(t, srv.Addr)
			s := redisstore.New(timedClient(t, redis.Options{Addr: proxy.Addr}), &redisstore.Options{Prefix: redistest.Prefix(t)})
			ctx := context.Background()
			const key = "k"
			zkey := s.SlotKeys(key)[0]
			if d, err := s.Acquire(ctx, key, l, 1, "other"); err != nil || !d.Allowed { // and the script loaded
				t.Fatalf("Acquire(other) = %+v, %v", d, err)
			}
			holder := sluice.NewHolderID()

			// Sampled straight from Redis, every millisecond: the holders
			// (deadlines below 2^52; every weight is 1) and the late one.
			sampler := srv.Client(t)
			var most, seen, samples atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Go(func() {
				tick := time.NewTicker(time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
					}
					c, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
					p := sampler.Pipeline()
					n := p.ZCount(c, zkey, "(0", "(4503599627370496")
					h := p.ZScore(c, zkey, "h"+holder)
					_, _ = p.Exec(c)
					cancel()
					if n.Err() != nil {
						continue // stalled
					}
					samples.Add(1)
					if n.Val() > most.Load() {
						most.Store(n.Val())
					}
					if h.Err() == nil {
						seen.Add(1)
					}
				}
			})
			defer func() { close(stop); wg.Wait() }()

			proxy.SetDelay(late)
			start := time.Now()
			actx, cancel := context.WithTimeout(ctx, wait)
			_, err := s.Acquire(actx, key, l, 1, holder)
			cancel()
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Acquire with Redis %v away = %v, want context.DeadlineExceeded", late, err)
			}
			proxy.SetDelay(0) // the release's way is clear
			if stalled {
				srv.Pause(t)
				rctx, cancel := context.WithTimeout(ctx, wait)
				if _, err := s.Release(rctx, key, holder); !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("Release on a stalled Redis = %v, want context.DeadlineExceeded", err)
				}
				cancel()
			}
			sluice.ReleaseAbandoned(s, key, holder)
			if stalled {
				time.Sleep(stall)
				srv.Resume(t)
			}

			// The acquire lands at 1.5 s, after the release's second try.
			time.Sleep(time.Until(start.Add(late + 500*time.Millisecond)))
			if n := sluice.WaitReleases(ctx); n != 0 {
				t.Fatalf("%d releases still at work", n)
			}
			if got := seen.Load(); got != 0 {
				t.Errorf("the late acquire's slot held in %d of %d samples; want none", got, samples.Load())
			}
			if got := most.Load(); got > max {
				t.Errorf("%d held at most, want at most Max %d", got, max)
			}
			if samples.Load() < 500 {
				t.Errorf("%d samples over %v; want one a millisecond", samples.Load(), late)
			}
			// It ran: it found the tombstone and removed it.
			if err := sampler.ZScore(ctx, zkey, "x"+holder).Err(); !errors.Is(err, redis.Nil) {
				t.Errorf("the tombstone is still there (%v): the late acquire has not run", err)
			}
			if d, err := s.Acquire(ctx, key, l, 1, "next"); err != nil || !d.Allowed || d.InUse != 2 {
				t.Errorf("Acquire beside the one holder = %+v, %v; want allowed, 2 in use", d, err)
			}
			t.Logf("%d samples, at most %d held", samples.Load(), most.Load())
		})
	}
}
