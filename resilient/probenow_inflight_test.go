package resilient

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/storetest"
)

// TestProbeNowWhileProbing: told that the backend is back while a probe
// is in flight (a Sentinel's switch while a probe is out to the dead
// master), a breaker whose probe then fails probes again at once, not a
// ProbeInterval later: sluice serve's breakers closed 1.3 s after a
// Sentinel failover where they closed in under 0.1 s otherwise.
func TestProbeNowWhileProbing(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	f := newFlaky(clock.Now)
	s, err := New(f, &Options{Policy: FailOpen, Clock: clock.Now, ProbeInterval: time.Hour, Timeout: 100 * time.Millisecond, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	lim := sluice.PerSecond(10)
	f.mode.Store(1)
	for i := 0; s.State() != sluice.BreakerOpen; i++ {
		if i > 100 {
			t.Fatal("the breaker never opened")
		}
		s.Take(context.Background(), "k", lim, 1)
		clock.Advance(100 * time.Millisecond)
	}
	clock.Advance(2 * time.Hour) // a probe is due
	f.mode.Store(3)              // it hangs until its deadline
	calls := f.calls.Load()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Take(context.Background(), "k", lim, 1)
	}()
	for f.calls.Load() == calls {
		time.Sleep(time.Millisecond)
	}
	f.mode.Store(0) // the backend is back; the probe out is lost
	if err := s.ProbeNow(context.Background()); err != nil {
		t.Fatalf("ProbeNow with a probe in flight: %v", err)
	}
	<-done
	if st := s.State(); st != sluice.BreakerOpen {
		t.Fatalf("state %v after the probe in flight timed out, want open", st)
	}
	for i := 0; s.State() != sluice.BreakerClosed; i++ {
		if i > 10 {
			t.Fatalf("still %v after %d calls with the backend back; want the next probes due at once", s.State(), i)
		}
		s.Take(context.Background(), "k", lim, 1)
	}
}
