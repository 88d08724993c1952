package resilient

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// After an outage, the releases sent again in the background through a
// resilient store drain as soon as Redis is back, with nothing else
// calling: they took one every 3 s (a half-open breaker lets one probe
// through at a time, the retries all came in the same instant, and those
// refused waited a whole backoff), and a probe answered "not held" never
// closed the breaker, so the rest waited out their holds (15 s).
func TestFaultRetriedReleasesDrainAfterOutage(t *testing.T) {
	race.SkipTiming(t)
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	backend := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	s, err := New(backend, &Options{Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	limit := sluice.Concurrent(100, 20*time.Second)
	var slots []*sluice.Slot
	for range 16 {
		slot, d, err := sluice.AcquireSlot(ctx, s, "k", limit, 1)
		if err != nil || slot == nil {
			t.Fatal(d, err)
		}
		slots = append(slots, slot)
	}
	srv.Pause(t)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			srv.Resume(t)
		}
	})
	until := time.Now().Add(limit.Hold)
	for i, slot := range slots {
		if err := slot.Release(ctx); err == nil {
			t.Fatalf("release %d with Redis stopped: nil error", i)
		}
		if err := sluice.RetryRelease(s, "k", slot.Holder(), until, nil); err != nil {
			t.Fatal(err)
		}
		// A release that reached Redis all the same, or never held: its
		// retry is answered "not held".
		if err := sluice.RetryRelease(s, "k", sluice.NewHolderID(), until, nil); err != nil {
			t.Fatal(err)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second) // a shutdown's wait
	n := sluice.WaitReleases(wctx)
	cancel()
	if n != 32 {
		t.Fatalf("WaitReleases with Redis stopped: %d left, want all 32", n)
	}
	srv.Resume(t)
	resumed = true
	back := time.Now()
	for sluice.PendingReleases() > 0 {
		if time.Since(back) > 10*time.Second {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	took := time.Since(back)
	t.Logf("released in the background %v after Redis came back (%d left)", took, sluice.PendingReleases())
	if took > 2*time.Second {
		t.Errorf("the releases drained %v after Redis came back, want about a second", took)
	}
	d, err := backend.Acquire(ctx, "k", sluice.Concurrent(1, time.Second), 1, sluice.NewHolderID())
	if err != nil || !d.Allowed {
		t.Errorf("a slot still held after the releases drained: %+v, %v", d, err)
	}
}
