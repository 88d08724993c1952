package sluice_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/nilctx"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

func newMemory(t *testing.T, now func() time.Time) *memory.Store {
	s := memory.New(&memory.Options{Clock: now})
	t.Cleanup(func() { s.Close() })
	return s
}

func TestNewLimiterErrors(t *testing.T) {
	t.Parallel()
	if _, err := sluice.NewLimiter(nil, sluice.PerSecond(1), nil); !errors.Is(err, sluice.ErrInvalidLimit) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
		t.Errorf("nil store: %v, want ErrInvalidLimit and ErrStoreNotBuilt", err)
	}
	if _, err := sluice.NewLimiter(newMemory(t, nil), sluice.Limit{}, nil); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("zero limit: %v", err)
	}
}

func TestLimiterPrefixAndMethods(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := storetest.NewClock(storetest.T0)
	s := newMemory(t, clock.Now)
	login, err := sluice.NewLimiter(s, sluice.PerMinute(3), &sluice.Options{Prefix: "login:"})
	if err != nil {
		t.Fatal(err)
	}
	api, _ := sluice.NewLimiter(s, sluice.PerMinute(3), &sluice.Options{Prefix: "api:"})

	if d, err := login.AllowN(ctx, "alice", 3); err != nil || !d.Allowed || d.Remaining != 0 {
		t.Fatalf("AllowN: %+v %v", d, err)
	}
	if d, _ := login.Allow(ctx, "alice"); d.Allowed || d.RetryAfter != 20*time.Second {
		t.Fatalf("Allow on exhausted key: %+v", d)
	}
	// Same key under another prefix is another state.
	if d, _ := api.Peek(ctx, "alice"); d.Remaining != 3 {
		t.Errorf("prefixes share state: %+v", d)
	}
	if d, _ := s.Peek(ctx, "login:alice", login.Limit(), 1); d.Remaining != 0 {
		t.Errorf("prefix not applied: %+v", d)
	}
	if err := login.Reset(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if d, _ := login.Peek(ctx, "alice"); d.Remaining != 3 {
		t.Errorf("after Reset: %+v", d)
	}
	// The key bound applies to the joined key.
	long := strings.Repeat("k", sluice.MaxKeyLen-len("login:"))
	if _, err := login.Allow(ctx, long); err != nil {
		t.Errorf("key of MaxKeyLen bytes: %v", err)
	}
	for _, f := range []func() error{
		func() error { _, err := login.Allow(ctx, ""); return err },
		func() error { _, err := login.Peek(ctx, long+"k"); return err },
		func() error { return login.Reset(ctx, "") },
		func() error { _, err := login.Wait(ctx, ""); return err },
	} {
		if err := f(); !errors.Is(err, sluice.ErrInvalidKey) {
			t.Errorf("bad key: %v", err)
		}
	}
	if _, err := login.AllowN(ctx, "bob", 4); !errors.Is(err, sluice.ErrCostExceedsBurst) {
		t.Errorf("cost over burst: %v", err)
	}
}

func TestWait(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	l, _ := sluice.NewLimiter(newMemory(t, nil), sluice.PerSecond(50).WithBurst(1), nil)
	for i := range 3 { // the 2nd and 3rd each wait about 20ms
		d, err := l.Wait(ctx, "k")
		if err != nil || !d.Allowed {
			t.Fatalf("Wait %d: %+v %v", i, d, err)
		}
	}
}

func TestWaitDeadline(t *testing.T) {
	t.Parallel()
	l, _ := sluice.NewLimiter(newMemory(t, nil), sluice.PerHour(1), nil)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := l.Wait(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	// The next unit is an hour away: WaitN gives up at once rather than
	// sleeping until the deadline.
	d, err := l.Wait(ctx, "k")
	if !errors.Is(err, context.DeadlineExceeded) || d.Allowed || d.RetryAfter < 59*time.Minute {
		t.Errorf("Wait past deadline = %+v, %v", d, err)
	}
}

func TestWaitCancel(t *testing.T) {
	t.Parallel()
	l, _ := sluice.NewLimiter(newMemory(t, nil), sluice.PerHour(1), nil)
	ctx, cancel := context.WithCancel(context.Background())
	if _, err := l.Wait(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	go func() { time.Sleep(10 * time.Millisecond); cancel() }()
	if _, err := l.Wait(ctx, "k"); !errors.Is(err, context.Canceled) {
		t.Errorf("Wait after cancel: %v", err)
	}
}

// A nil context is context.Background() to every Limiter method, as to
// the stores: WaitN dereferenced it once the key was denied (its own wait,
// and a second waiter's joining the line), and panicked.
func TestNilContextIsBackground(t *testing.T) {
	t.Parallel()
	var nilCtx context.Context
	store := newMemory(t, nil)
	l, _ := sluice.NewLimiter(store, sluice.PerSecond(20).WithBurst(1), nil)
	nilctx.Call(t, "Allow", func() error { _, err := l.Allow(nilCtx, "a"); return err })
	nilctx.Call(t, "Peek", func() error { _, err := l.Peek(nilCtx, "a"); return err })
	nilctx.Call(t, "Reset", func() error { return l.Reset(nilCtx, "a") })
	for i := range 3 { // the 2nd and 3rd are denied and wait
		nilctx.Call(t, "Wait", func() error {
			d, err := l.Wait(nilCtx, "w")
			if err == nil && !d.Allowed {
				t.Errorf("Wait %d: %+v, not allowed", i, d)
			}
			return err
		})
	}
	// A waiter that finds a line joins it without taking.
	var done sync.WaitGroup
	done.Add(1)
	go func() {
		defer done.Done()
		nilctx.Call(t, "WaitN in line", func() error { _, err := l.WaitN(nilCtx, "q", 1); return err })
	}()
	nilctx.Call(t, "WaitN first", func() error { _, err := l.WaitN(nilCtx, "q", 1); return err })
	nilctx.Call(t, "WaitN", func() error { _, err := l.WaitN(nilCtx, "q", 1); return err })
	done.Wait()
	nilctx.Call(t, "AcquireSlot+Extend+Release", func() error {
		slot, _, err := sluice.AcquireSlot(nilCtx, store, "s", sluice.Concurrent(1, time.Minute), 1)
		if err != nil {
			return err
		}
		if err := slot.Extend(nilCtx); err != nil {
			return err
		}
		return slot.Release(nilCtx)
	})
}

// A policy reloaded with another Period keeps its keys (Prefix and key name
// the policy, not its limit): the new Limiter reads state the old one wrote.
// A window counted in seconds once read as days overflowed and recursed
// until the process died (fatal stack overflow); read as minutes it denied
// with negative waits. Now the old window is stale and the key starts
// fresh under the new limit.
func TestLimiterPeriodReload(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowCounter} {
		for _, to := range []time.Duration{24 * time.Hour, time.Minute} {
			s := newMemory(t, nil)
			before, _ := sluice.NewLimiter(s, sluice.Limit{Algorithm: a, Rate: 5, Period: time.Second}, &sluice.Options{Prefix: "api:"})
			after, _ := sluice.NewLimiter(s, sluice.Limit{Algorithm: a, Rate: 5, Period: to}, &sluice.Options{Prefix: "api:"})
			for range 3 {
				if _, err := before.Allow(ctx, "k"); err != nil {
					t.Fatal(err)
				}
			}
			for i := range 6 {
				d, err := after.Allow(ctx, "k")
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed != (i < 5) || d.RetryAfter < 0 || d.RetryAfter > 2*to || d.ResetAfter <= 0 || d.ResetAfter > 2*to {
					t.Fatalf("%v to %v, take %d after 3 under 1s: %+v; want %d of 5 allowed, waits within the new period", a, to, i+1, d, min(i+1, 5))
				}
			}
		}
	}
}

// A zero or nil Limiter refuses every call with a typed error, and a zero
// Limit's figures are zeros: nothing panics.
func TestZeroValuesDoNotPanic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for name, l := range map[string]*sluice.Limiter{"zero": {}, "nil": nil} {
		if _, err := l.Allow(ctx, "k"); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%s Limiter: Allow err = %v, want ErrInvalidLimit", name, err)
		}
		if _, err := l.Peek(ctx, "k"); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%s Limiter: Peek err = %v, want ErrInvalidLimit", name, err)
		}
		if err := l.Reset(ctx, "k"); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%s Limiter: Reset err = %v, want ErrInvalidLimit", name, err)
		}
		if _, err := l.Wait(ctx, "k"); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("%s Limiter: Wait err = %v, want ErrInvalidLimit", name, err)
		}
		if got := l.Limit(); got != (sluice.Limit{}) {
			t.Errorf("%s Limiter: Limit = %v", name, got)
		}
	}
	if got := (sluice.Limit{}).Interval(); got != 0 {
		t.Errorf("zero Limit's Interval = %v, want 0", got)
	}
	if got := sluice.ReturnAllowance(sluice.Limit{}, 5, 1); got != 0 {
		t.Errorf("ReturnAllowance under a zero Limit = %d, want 0", got)
	}
}

func TestLimiterStoreAndPrefix(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	l, err := sluice.NewLimiter(store, sluice.PerSecond(1), &sluice.Options{Prefix: "api:"})
	if err != nil {
		t.Fatal(err)
	}
	if l.Store() != sluice.Store(store) || l.Prefix() != "api:" {
		t.Errorf("Store, Prefix = %v, %q; want the store and \"api:\"", l.Store(), l.Prefix())
	}
	var zero *sluice.Limiter
	if zero.Store() != nil || zero.Prefix() != "" {
		t.Error("a nil Limiter has a store or a prefix")
	}
}
