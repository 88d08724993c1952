package resilient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/releasetest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// flaky's slots fail as its takes do.

func (f *flaky) Acquire(ctx context.Context, key string, l sluice.InFlightLimit, weight int64, holder string) (sluice.SlotDecision, error) {
	if err := f.fail(ctx); err != nil {
		return sluice.SlotDecision{}, err
	}
	return f.Store.Acquire(ctx, key, l, weight, holder)
}

func (f *flaky) Extend(ctx context.Context, key string, l sluice.InFlightLimit, holder string) (bool, error) {
	if err := f.fail(ctx); err != nil {
		return false, err
	}
	return f.Store.Extend(ctx, key, l, holder)
}

func (f *flaky) Release(ctx context.Context, key string, holder string) (bool, error) {
	if err := f.fail(ctx); err != nil {
		return false, err
	}
	return f.Store.Release(ctx, key, holder)
}

// slotFixture is a Store over a flaky backend with a fallback of its own,
// both on clk, the breaker as slow to open as the tests need.
type slotFixture struct {
	s   *Store
	b   *flaky
	fb  *memory.Store
	clk *storetest.Clock
}

func newSlotFixture(t *testing.T, o Options) slotFixture {
	t.Helper()
	f := slotFixture{clk: storetest.NewClock(t0)}
	f.b = newFlaky(f.clk.Now)
	f.fb = memory.New(&memory.Options{Clock: f.clk.Now, SweepInterval: -1})
	t.Cleanup(func() { f.fb.Close() })
	o.Clock, o.Timeout, o.Fallback = f.clk.Now, slow, f.fb
	var err error
	if f.s, err = New(f.b, &o); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.s.Close() })
	return f
}

// While the backend is down, each policy answers Acquire: the fallback
// admits Max divided by the fleet size (at least 1, a heavier weight taking
// the whole share), open admits all, closed none.
func TestSlotsPolicies(t *testing.T) {
	t.Parallel()
	l := sluice.Concurrent(10, time.Minute)
	for _, tt := range []struct {
		name    string
		opts    Options
		weight  int64
		allowed int // of 12 acquires
		source  sluice.Source
	}{
		{"local", Options{}, 1, 10, sluice.SourceFallback},
		{"local over 3 nodes", Options{Nodes: 3}, 1, 3, sluice.SourceFallback},
		{"local over 3 nodes, weight 2", Options{Nodes: 3}, 2, 1, sluice.SourceFallback},
		{"local over more nodes than slots", Options{Nodes: 20}, 1, 1, sluice.SourceFallback},
		{"local, weight above the share", Options{Nodes: 4}, 3, 1, sluice.SourceFallback},
		{"open", Options{Policy: FailOpen}, 1, 12, sluice.SourceFailOpen},
		{"closed", Options{Policy: FailClosed, ProbeInterval: 3 * time.Second}, 1, 0, sluice.SourceFailClosed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := newSlotFixture(t, tt.opts)
			s := f.s
			f.b.mode.Store(1)
			allowed := 0
			for i := range 12 {
				d, err := s.Acquire(context.Background(), "k", l, tt.weight, fmt.Sprint("h", i))
				if err != nil {
					t.Fatalf("Acquire: %v", err)
				}
				if d.Source != tt.source {
					t.Errorf("Source %v, want %v", d.Source, tt.source)
				}
				if d.Allowed {
					allowed++
				} else if tt.source == sluice.SourceFallback && d.RetryAfter != time.Minute {
					t.Errorf("fallback denial: RetryAfter %v, want the 1m hold", d.RetryAfter)
				}
			}
			if allowed != tt.allowed {
				t.Errorf("allowed %d of 12, want %d", allowed, tt.allowed)
			}
		})
	}
}

// A holder's Extend and Release go where it was granted: a fallback grant
// to the fallback (even once the backend is back), a backend grant to the
// backend; a backend grant's release while the backend is down is an
// ErrSlotUnreachable error and frees nothing anywhere, and its slot frees
// at its hold timeout.
func TestSlotsReleaseWhereGranted(t *testing.T) {
	t.Parallel()
	f := newSlotFixture(t, Options{Logger: slog.New(slog.DiscardHandler)})
	s, b, fb, clk, ctx := f.s, f.b, f.fb, f.clk, context.Background()
	l := sluice.Concurrent(2, 10*time.Second)
	mustAcquire := func(holder string, src sluice.Source) {
		t.Helper()
		d, err := s.Acquire(ctx, "k", l, 1, holder)
		if err != nil || !d.Allowed || d.Source != src {
			t.Fatalf("Acquire(%s) = %+v, %v; want allowed by %v", holder, d, err, src)
		}
	}
	mustAcquire("redis", sluice.SourceBackend)
	b.mode.Store(1)
	mustAcquire("local", sluice.SourceFallback)
	if ok, err := s.Release(ctx, "k", "redis"); ok || !errors.Is(err, ErrSlotUnreachable) {
		t.Errorf("Release of a backend grant while down = %v, %v; want ErrSlotUnreachable", ok, err)
	}
	if ok, err := s.Extend(ctx, "k", l, "redis"); ok || !errors.Is(err, ErrSlotUnreachable) {
		t.Errorf("Extend of a backend grant while down = %v, %v; want ErrSlotUnreachable", ok, err)
	}
	clk.Advance(5 * time.Second)
	if ok, err := s.Extend(ctx, "k", l, "local"); err != nil || !ok {
		t.Errorf("Extend of a fallback grant while down = %v, %v", ok, err)
	}
	b.mode.Store(0)
	clk.Advance(2 * time.Second) // past ProbeInterval: the breaker probes and closes
	for range 3 {
		mustAcquire("probe", sluice.SourceBackend)
	}
	if got := s.State(); got != sluice.BreakerClosed {
		t.Fatalf("breaker %v, want closed", got)
	}
	calls := b.calls.Load()
	clk.Advance(5 * time.Second) // past the first hold, inside the extended one
	if ok, err := s.Release(ctx, "k", "local"); err != nil || !ok {
		t.Errorf("Release of the extended fallback grant = %v, %v; want true", ok, err)
	}
	// The backend failed the acquire that the fallback then granted, perhaps
	// after running it: the release frees it there too, in the background.
	for deadline := time.Now().Add(5 * time.Second); b.calls.Load() == calls; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the fallback grant's Release never asked the backend to release it too")
		}
	}
	if ok, err := s.Release(ctx, "k", "local"); err != nil || ok {
		t.Errorf("second Release = %v, %v; want false (now the backend's answer)", ok, err)
	}
	if d, err := fb.Acquire(ctx, "k", l, 2, "check"); err != nil || !d.Allowed {
		t.Errorf("the fallback still holds the released slot: %+v, %v", d, err)
	}
	// The lost release: the backend freed "redis" at its hold timeout.
	if d, err := s.Acquire(ctx, "k", l, 1, "after"); err != nil || !d.Allowed || d.InUse != 2 || d.Expired != 1 {
		t.Errorf("Acquire after the hold = %+v, %v; want allowed beside probe, redis expired", d, err)
	}
}

// In-flight denials never enter the deny cache: a slot can free at any
// instant, so the next Acquire after a release is the backend's to answer,
// and a cached rate denial of the same key does not touch its slots.
func TestSlotsNotDenyCached(t *testing.T) {
	t.Parallel()
	f := newSlotFixture(t, Options{})
	s, ctx, l := f.s, context.Background(), sluice.Concurrent(1, time.Minute)
	if d, err := s.Acquire(ctx, "k", l, 1, "a"); err != nil || !d.Allowed {
		t.Fatalf("Acquire(a) = %+v, %v", d, err)
	}
	for range 3 {
		d, err := s.Acquire(ctx, "k", l, 1, "b")
		if err != nil || d.Allowed || d.Source != sluice.SourceBackend {
			t.Fatalf("Acquire(b) = %+v, %v; want the backend's denial", d, err)
		}
	}
	rate := sluice.PerMinute(1)
	for range 2 { // the second denial comes from the deny cache
		if _, err := s.Take(ctx, "k", rate, 1); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := s.Release(ctx, "k", "a"); err != nil || !ok {
		t.Fatalf("Release(a) = %v, %v", ok, err)
	}
	calls := f.b.calls.Load()
	d, err := s.Acquire(ctx, "k", l, 1, "b")
	if err != nil || !d.Allowed || d.Source != sluice.SourceBackend {
		t.Errorf("Acquire(b) right after the release = %+v, %v; want allowed by the backend", d, err)
	}
	if got := f.b.calls.Load() - calls; got != 1 {
		t.Errorf("%d backend calls, want 1", got)
	}
	if d, err := s.Take(ctx, "k", rate, 1); err != nil || d.Source != sluice.SourceDenyCache {
		t.Errorf("the rate denial: %+v, %v; want still cached", d, err)
	}
}

// Bad input is refused before any store is touched, and does not count
// against the backend.
func TestSlotsBadInput(t *testing.T) {
	t.Parallel()
	f := newSlotFixture(t, Options{})
	s, ctx := f.s, context.Background()
	if _, err := s.Acquire(ctx, "k", sluice.Concurrent(0, time.Second), 1, "h"); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("Acquire with max 0: %v", err)
	}
	if _, err := s.Extend(ctx, "k", sluice.Concurrent(1, 0), "h"); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("Extend with hold 0: %v", err)
	}
	if _, err := s.Release(ctx, "k", ""); !errors.Is(err, sluice.ErrInvalidHolder) {
		t.Errorf("Release of an empty holder: %v", err)
	}
	if got := f.b.calls.Load(); got != 0 {
		t.Errorf("%d backend calls for bad input", got)
	}
	var zero Store
	if _, err := zero.Acquire(ctx, "k", sluice.Concurrent(1, time.Second), 1, "h"); !errors.Is(err, ErrZeroStore) {
		t.Errorf("zero Store: %v", err)
	}
	plain, err := New(rateOnly{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Acquire(ctx, "k", sluice.Concurrent(1, time.Second), 1, "h"); !errors.Is(err, ErrNoSlots) {
		t.Errorf("a backend without slots: %v", err)
	}
}

// rateOnly is a backend that keeps no slots.
type rateOnly struct{ sluice.Store }

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
	for _, want := range []string{"resilient: breaker open", "resilient: breaker closed", "policy=local"} {
		if !strings.Contains(got, want) {
			t.Errorf("no %q in the log:\n%s", want, got)
		}
	}
	if !slices.Contains(rec.breakers, sluice.BreakerOpen) || rec.count(sluice.SourceFallback) == 0 || rec.errs == 0 {
		t.Errorf("observer saw breakers %v, %d fallback answers, %d errors", rec.breakers, rec.count(sluice.SourceFallback), rec.errs)
	}
}

// A holder the fallback granted and that the caller resends once the
// backend is back is held by the backend alone: its fallback slot is
// freed, not left taken until its hold.
func TestSlotsResendFreesFallback(t *testing.T) {
	t.Parallel()
	f := newSlotFixture(t, Options{Logger: slog.New(slog.DiscardHandler)})
	s, b, fb, clk, ctx := f.s, f.b, f.fb, f.clk, context.Background()
	l := sluice.Concurrent(1, 10*time.Second)
	b.mode.Store(1)
	if d, err := s.Acquire(ctx, "k", l, 1, "h"); err != nil || !d.Allowed || d.Source != sluice.SourceFallback {
		t.Fatalf("Acquire while down = %+v, %v; want the fallback's", d, err)
	}
	b.mode.Store(0)
	clk.Advance(2 * time.Second) // past ProbeInterval
	if d, err := s.Acquire(ctx, "k", l, 1, "h"); err != nil || !d.Allowed || d.Source != sluice.SourceBackend {
		t.Fatalf("the resend = %+v, %v; want the backend's", d, err)
	}
	if d, err := fb.Acquire(ctx, "k", l, 1, "other"); err != nil || !d.Allowed {
		t.Errorf("the fallback still holds the resent holder's slot: %+v, %v", d, err)
	}
}

// AbandonSlot releases in the backend only a holder whose backend Acquire
// failed (it may have run there), straight past the open breaker; a holder
// the breaker kept from the backend is not sent at all.
func TestSlotsAbandonOnlySent(t *testing.T) {
	t.Parallel()
	f := newSlotFixture(t, Options{Policy: FailClosed, Logger: slog.New(slog.DiscardHandler)})
	s, b, ctx := f.s, f.b, context.Background()
	l := sluice.Concurrent(2, 10*time.Second)
	b.mode.Store(1)
	for s.State() != sluice.BreakerOpen { // failed acquires, sent, until the breaker opens
		if _, err := s.Acquire(ctx, "k", l, 1, sluice.NewHolderID()); err != nil {
			t.Fatal(err)
		}
		f.clk.Advance(100 * time.Millisecond)
	}
	if _, err := s.Acquire(ctx, "k", l, 1, "kept"); err != nil { // the breaker keeps it from the backend
		t.Fatal(err)
	}
	calls := b.calls.Load()
	s.AbandonSlot("k", "kept")
	time.Sleep(50 * time.Millisecond)
	if got := b.calls.Load(); got != calls {
		t.Errorf("abandoning a holder never sent made %d backend calls", got-calls)
	}
	// One sent while the backend failed is released there, the breaker open.
	b.mode.Store(0)
	s.sent.put(slotRef{"k", "sent"}, slotGrant{expires: f.clk.Now().Add(time.Minute)}, f.clk.Now())
	s.AbandonSlot("k", "sent")
	for deadline := time.Now().Add(5 * time.Second); b.calls.Load() == calls; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("abandoning a holder sent to the backend made no backend call")
		}
	}
}

// ReleaseOnce releases where the slot is held and remembers it there. A
// Redis slot's release whose answer is lost while Redis is stopped
// (ErrSlotUnreachable; Redis runs it as it resumes) is told released
// before when sent again; a slot the fallback granted is remembered in
// the fallback, and its release sent again, racing or later, even once
// Redis is back, is told so too.
func TestFaultSlotsReleaseOnce(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	s := newStore(t, redisstore.New(client, nil), &Options{Timeout: 100 * time.Millisecond, ProbeInterval: 50 * time.Millisecond, Logger: discard})
	ctx := context.Background()
	const remember = 10 * time.Second
	l := sluice.Concurrent(10, time.Minute)
	release := func(key, h string, released, before bool) {
		t.Helper()
		r, b, err := s.ReleaseOnce(ctx, key, h, remember)
		if err != nil || r != released || b != before {
			t.Fatalf("ReleaseOnce(%s, %s) = %v, %v, %v; want %v, %v", key, h, r, b, err, released, before)
		}
	}
	racing := func(key, h string) {
		t.Helper()
		var now, before atomic.Int64
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				r, b, err := s.ReleaseOnce(ctx, key, h, remember)
				switch {
				case err != nil || !r:
					t.Errorf("ReleaseOnce(%s, %s) racing = %v, %v, %v; want released", key, h, r, b, err)
				case b:
					before.Add(1)
				default:
					now.Add(1)
				}
			})
		}
		wg.Wait()
		if now.Load() != 1 || before.Load() != 3 {
			t.Errorf("ReleaseOnce(%s, %s) racing: %d released now, %d before; want 1 and 3", key, h, now.Load(), before.Load())
		}
	}
	acquire := func(key, h string, weight int64, src sluice.Source) {
		t.Helper()
		if d, err := s.Acquire(ctx, key, l, weight, h); err != nil || !d.Allowed || d.Source != src {
			t.Fatalf("Acquire(%s, %s) = %+v, %v; want allowed by %v", key, h, d, err, src)
		}
	}
	acquire("k", "r", 10, sluice.SourceBackend)
	release("k", "nobody", false, false) // loads the script
	srv.Pause(t)
	t.Cleanup(func() { srv.Resume(t) }) // should the test end while it is stopped
	if r, b, err := s.ReleaseOnce(ctx, "k", "r", remember); r || b || !errors.Is(err, ErrSlotUnreachable) {
		t.Fatalf("ReleaseOnce with Redis stopped = %v, %v, %v; want ErrSlotUnreachable", r, b, err)
	}
	acquire("fb", "f", 1, sluice.SourceFallback)
	acquire("fb", "g", 1, sluice.SourceFallback)
	release("fb", "f", true, false)
	release("fb", "f", true, true)
	racing("fb", "g")
	if ok, err := s.Extend(ctx, "fb", l, "f"); ok || err != nil {
		t.Errorf("Extend of a released fallback slot = %v, %v; want not held", ok, err)
	}
	srv.Resume(t)
	waitFor(t, "the breaker to close", func() bool {
		s.Acquire(ctx, "other", l, 1, "probe")
		return s.State() == sluice.BreakerClosed
	})
	release("k", "r", true, true) // Redis ran the lost one, and remembered it
	acquire("k", "z", 10, sluice.SourceBackend)
	release("fb", "f", true, true) // still the fallback's
	release("fb", "g", true, true)
	acquire("k2", "r2", 1, sluice.SourceBackend)
	racing("k2", "r2")
}

// A slot FailOpen granted holds nothing; its release is remembered by the
// Store itself: told released before when sent again, not held to an
// extend.
func TestSlotsReleaseOnceOpen(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	s := newStore(t, redisstore.New(client, nil), &Options{Policy: FailOpen, Logger: discard})
	ctx := context.Background()
	l := sluice.Concurrent(1, time.Minute)
	if d, err := s.Acquire(ctx, "k", l, 1, "o"); err != nil || !d.Allowed || d.Source != sluice.SourceFailOpen {
		t.Fatalf("Acquire = %+v, %v; want allowed by FailOpen", d, err)
	}
	for i, before := range []bool{false, true, true} {
		if r, b, err := s.ReleaseOnce(ctx, "k", "o", time.Minute); err != nil || !r || b != before {
			t.Errorf("ReleaseOnce #%d = %v, %v, %v; want released, before %v", i+1, r, b, err, before)
		}
		if ok, err := s.Extend(ctx, "k", l, "o"); ok || err != nil {
			t.Errorf("Extend after ReleaseOnce #%d = %v, %v; want not held", i+1, ok, err)
		}
	}
	if _, _, err := s.ReleaseOnce(ctx, "k", "o", 0); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("ReleaseOnce remembering 0 = %v, want ErrInvalidLimit", err)
	}
	var m *MultiStore
	if _, _, err := m.ReleaseOnce(ctx, "k", "o", time.Minute); !errors.Is(err, ErrZeroStore) {
		t.Errorf("nil MultiStore: ReleaseOnce = %v, want ErrZeroStore", err)
	}
}

// With sluice.MaxBackgroundReleases at work, the backend release of a
// holder whose backend Acquire failed is not sent, and says so:
// TryAbandonSlot returns ErrRetriesFull, AcquireSlot sets ReleaseDropped
// on the policy's denial, and a release of a fallback slot whose backend
// release is dropped logs a line. Before, all three were silent. Not
// parallel: it fills the process's bound.
func TestAbandonNotSentSaysSo(t *testing.T) {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	backend := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	l := sluice.Concurrent(5, time.Minute)

	closed := newStore(t, backend, &Options{Policy: FailClosed, Logger: discard})
	if _, err := closed.Acquire(ctx, "k", l, 1, "sent"); err != nil {
		t.Fatal(err)
	}
	logs := &logtest.Log{}
	local := newStore(t, backend, &Options{Policy: FallbackLocal, Name: "local", Logger: logs.TextLogger()})
	if d, err := local.Acquire(ctx, "k", l, 1, "fallback"); err != nil || !d.Allowed || d.Source != sluice.SourceFallback {
		t.Fatalf("Acquire = %+v, %v; want allowed by the fallback", d, err)
	}

	releasetest.Fill(t, time.Now().Add(2*time.Second))
	if err := closed.TryAbandonSlot("k", "sent"); !errors.Is(err, sluice.ErrRetriesFull) {
		t.Errorf("TryAbandonSlot with the bound full = %v, want ErrRetriesFull", err)
	}
	if err := closed.TryAbandonSlot("k", "never"); err != nil {
		t.Errorf("TryAbandonSlot of a holder never sent = %v, want nil (nothing to send)", err)
	}
	slot, d, err := sluice.AcquireSlot(ctx, closed, "k", l, 1)
	if err != nil || slot != nil || d.Source != sluice.SourceFailClosed {
		t.Fatalf("AcquireSlot = %v, %+v, %v; want FailClosed's denial", slot, d, err)
	}
	if !d.ReleaseDropped {
		t.Error("AcquireSlot's denial after a failed backend acquire, its release not sent: ReleaseDropped false")
	}
	if ok, err := local.Release(ctx, "k", "fallback"); err != nil || !ok {
		t.Fatalf("Release of the fallback slot = %v, %v", ok, err)
	}
	want := `level=WARN msg="resilient: release of a slot the backend may hold not sent: too many being sent in the background; it frees at its hold timeout" store=local dropped=1 max_background=1024`
	if got := logs.String(); !strings.Contains(got, want) {
		t.Errorf("log:\n%s\nwant a line with %q", got, want)
	}
}
