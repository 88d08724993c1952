package resilient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// A real Redis stopped with SIGSTOP while it holds slots: each Acquire is
// answered by the fallback within the timeout, against Max divided by the
// fleet size; a slot Redis granted cannot be released (ErrSlotUnreachable,
// within the timeout) while one the fallback granted is released there;
// the breaker and the failure policy log as for takes. Resumed, Redis
// answers again, and the slots whose release was lost have freed at their
// hold timeout.
func TestFaultSlotsPaused(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	log := &lines{}
	rec := &recorder{}
	const timeout = 100 * time.Millisecond
	s, err := New(redisstore.New(client, nil), &Options{
		Timeout: timeout, ProbeInterval: 50 * time.Millisecond, Nodes: 2,
		Logger: slog.New(log), Observer: rec,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	const hold = 3 * time.Second
	l := sluice.Concurrent(10, hold)
	timed := func(what string, f func() error) {
		t.Helper()
		start := time.Now()
		if err := f(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if el := time.Since(start); el > timeout+margin {
			t.Errorf("%s took %v with a %v timeout", what, el, timeout)
		}
	}
	acquire := func(holder string, want bool, src sluice.Source) {
		t.Helper()
		timed("Acquire("+holder+")", func() error {
			d, err := s.Acquire(ctx, "k", l, 1, holder)
			if err == nil && (d.Allowed != want || d.Source != src) {
				err = fmt.Errorf("%+v; want allowed %v by %v", d, want, src)
			}
			return err
		})
	}
	for i := range 8 {
		acquire(fmt.Sprint("redis", i), true, sluice.SourceBackend)
	}
	start := time.Now()
	srv.Pause(t)
	t.Cleanup(func() { srv.Resume(t) }) // should the test end while it is stopped
	// The fallback admits 10/2 = 5, whatever Redis held.
	for i := range 5 {
		acquire(fmt.Sprint("local", i), true, sluice.SourceFallback)
	}
	acquire("local5", false, sluice.SourceFallback)
	timed("Release of a Redis slot", func() error {
		if ok, err := s.Release(ctx, "k", "redis0"); ok || !errors.Is(err, ErrSlotUnreachable) {
			return fmt.Errorf("%v, %v; want ErrSlotUnreachable", ok, err)
		}
		return nil
	})
	timed("Release of a fallback slot", func() error {
		if ok, err := s.Release(ctx, "k", "local0"); !ok || err != nil {
			return fmt.Errorf("%v, %v; want released", ok, err)
		}
		return nil
	})
	acquire("local6", true, sluice.SourceFallback)
	waitFor(t, "the breaker to open", func() bool {
		s.Acquire(ctx, "k", l, 1, "x")
		return s.State() == sluice.BreakerOpen
	})
	srv.Resume(t)
	waitFor(t, "the breaker to close", func() bool {
		s.Acquire(ctx, "other", l, 1, "probe")
		return s.State() == sluice.BreakerClosed
	})
	if el := time.Since(start); el >= hold {
		t.Fatalf("Redis was away %v, longer than the %v hold: the check below would prove nothing", el, hold)
	}
	// Redis still counts its 8 holders (the release was lost), and perhaps
	// up to 2 more: acquires that timed out while it was stopped ran when it
	// resumed, and hold until their own hold timeout.
	d, err := s.Acquire(ctx, "k", l, 3, "big")
	if err != nil || d.Allowed || d.InUse < 8 || d.Source != sluice.SourceBackend {
		t.Errorf("Acquire(3) after the pause = %+v, %v; want denied by Redis with 8 or more in use", d, err)
	}
	time.Sleep(time.Until(start.Add(hold)))
	d, err = s.Acquire(ctx, "k", l, 3, "big")
	if err != nil || !d.Allowed || d.Expired != 8 {
		t.Errorf("Acquire(3) after the hold = %+v, %v; want allowed, the 8 holders from before the pause expired", d, err)
	}
	if ok, err := s.Release(ctx, "k", "local1"); !ok || err != nil {
		t.Errorf("Release of a fallback slot after the pause = %v, %v; want released in the fallback", ok, err)
	}
	got := strings.Join(log.all(), "\n")
	for _, want := range []string{"resilient: breaker open", "resilient: failure policy on", "resilient: breaker closed", "resilient: failure policy off"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in the log:\n%s", want, got)
		}
	}
	if !slices.Contains(rec.breakers, sluice.BreakerOpen) || rec.count(sluice.SourceFallback) == 0 || rec.errs == 0 {
		t.Errorf("observer saw breakers %v, %d fallback answers, %d errors", rec.breakers, rec.count(sluice.SourceFallback), rec.errs)
	}
}
