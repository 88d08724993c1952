package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// TestFaultAbandonedAcquire: an acquire that times out while Redis is
// stalled runs when Redis resumes, for a holder nobody knows. AcquireSlot
// releases it in the background, and a failure policy's holder is
// released in Redis too when its Slot is: either way the key's only slot
// is free again within a few seconds of the resume, not after its hold of
// an hour.
func TestFaultAbandonedAcquire(t *testing.T) {
	ctx := context.Background()
	l := sluice.Concurrent(1, time.Hour)
	for _, tc := range []struct {
		name      string
		resilient bool
	}{{"bare store: AcquireSlot errs", false}, {"failure policy: Slot.Release", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			c := srv.Client(t)
			rs := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
			if _, err := rs.Acquire(ctx, "warm", l, 1, "w"); err != nil { // the script loaded
				t.Fatal(err)
			}
			var store sluice.Slots = rs
			if tc.resilient {
				fb := memory.New(nil)
				t.Cleanup(func() { fb.Close() })
				r, err := resilient.New(rs, &resilient.Options{Policy: resilient.FallbackLocal, Timeout: 100 * time.Millisecond, Fallback: fb, Nodes: 1})
				if err != nil {
					t.Fatal(err)
				}
				store = r
			}
			srv.Pause(t)
			wait := 100 * time.Millisecond // the bare store's caller gives up
			if tc.resilient {
				wait = time.Second // the failure policy's Timeout, 100 ms, answers first
			}
			actx, cancel := context.WithTimeout(ctx, wait)
			slot, d, err := sluice.AcquireSlot(actx, store, "k", l, 1)
			cancel()
			switch {
			case tc.resilient && (err != nil || !d.Allowed || d.Source != sluice.SourceFallback):
				t.Fatalf("AcquireSlot with Redis paused = %+v, %v; want the fallback's slot", d, err)
			case !tc.resilient && err == nil:
				t.Fatalf("AcquireSlot with Redis paused = %+v, nil; want an error", d)
			}
			srv.Resume(t)
			if slot != nil {
				if err := slot.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			waitFree(t, rs, l)
		})
	}
	// Under a breaker that opens during the outage, the holders denied by
	// the policy are released past it, straight to Redis.
	t.Run("failure policy: breaker open", func(t *testing.T) {
		srv := redistest.StartServer(t)
		c := srv.Client(t)
		rs := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
		many := sluice.Concurrent(100, time.Hour)
		if _, err := rs.Acquire(ctx, "warm", many, 1, "w"); err != nil {
			t.Fatal(err)
		}
		r, err := resilient.New(rs, &resilient.Options{Policy: resilient.FailClosed, Timeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		srv.Pause(t)
		for end := time.Now().Add(800 * time.Millisecond); time.Now().Before(end); {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			if _, d, err := sluice.AcquireSlot(actx, r, "k", many, 1); err != nil || d.Allowed {
				t.Errorf("AcquireSlot with Redis paused = %+v, %v; want the policy's denial", d, err)
			}
			cancel()
		}
		if r.State() != sluice.BreakerOpen {
			t.Errorf("breaker %v after 800ms of failures, want open", r.State())
		}
		srv.Resume(t)
		waitFree(t, rs, many)
	})
}

// waitFree waits until key k holds no holder in rs, 5 s at most.
func waitFree(t *testing.T, rs *redisstore.Store, l sluice.InFlightLimit) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for {
		holder := sluice.NewHolderID()
		d, err := rs.Acquire(ctx, "k", l, l.Max, holder)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			rs.Release(ctx, "k", holder)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the resume key k still has holders: %+v", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
