package resilient

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// A probe the backend answered without writing (a release of a slot not
// held) proves reads only, and a backend refusing writes answers those:
// it does not close the breaker, but sends at once the probes that write,
// which do. Before, with nothing but such calls, it stayed half-open.
func TestAnsweredProbeClosesBreaker(t *testing.T) {
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	backend := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	s, err := New(backend, &Options{Logger: discard, ProbeInterval: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	srv.Pause(t)
	for i := 0; s.State() != sluice.BreakerOpen; i++ {
		if i > 100 {
			srv.Resume(t)
			t.Fatalf("breaker %v after %d failed releases", s.State(), i)
		}
		s.Release(ctx, "k", sluice.NewHolderID())
	}
	srv.Resume(t)
	time.Sleep(200 * time.Millisecond) // a probe is due
	if held, err := s.Release(ctx, "k", sluice.NewHolderID()); err != nil || held {
		t.Fatalf("release of a holder never held: %v, %v", held, err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for s.State() != sluice.BreakerClosed {
		if time.Now().After(deadline) {
			t.Fatalf("breaker %v 2s after a probe answered, with nothing else calling; want closed", s.State())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// The probes an answered probe starts (confirm) stop at Close: a breaker
// that would take a million good probes to close keeps them going until
// then, and none is sent after it.
func TestConfirmStopsAtClose(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	b := newFlaky(clk.Now)
	s := newStore(t, b, &Options{Clock: clk.Now, Logger: discard, Timeout: time.Second, FailureThreshold: 1,
		DeadAfter: time.Millisecond, ProbeInterval: time.Second, CloseAfter: 1_000_000})
	ctx, l := context.Background(), sluice.PerMinute(10)
	b.mode.Store(1)
	for range 2 {
		s.Take(ctx, "k", l, 1)
		clk.Advance(10 * time.Millisecond)
	}
	if st := s.State(); st != sluice.BreakerOpen {
		t.Fatalf("breaker %v after failed calls, want open", st)
	}
	b.mode.Store(0)
	clk.Advance(2 * time.Second)
	if _, err := s.Peek(ctx, "k", l, 1); err != nil { // the probe, answered without a write
		t.Fatal(err)
	}
	waitFor(t, "confirm's probes", func() bool { return b.calls.Load() > 100 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * time.Millisecond) // the one in flight at Close
	after := b.calls.Load()
	time.Sleep(100 * time.Millisecond)
	if n := b.calls.Load() - after; n != 0 {
		t.Errorf("%d probes sent in the 100ms after Close, want none", n)
	}
}
