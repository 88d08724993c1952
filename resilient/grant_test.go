package resilient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

func (f *flaky) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	if err := f.fail(ctx); err != nil {
		return sluice.Grant{}, err
	}
	return f.Store.Grant(ctx, key, l, n)
}

func (f *flaky) Return(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused int64) (int64, error) {
	if err := f.fail(ctx); err != nil {
		return 0, err
	}
	return f.Store.Return(ctx, key, l, g, unused)
}

func (f *flaky) Regrant(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	if err := f.fail(ctx); err != nil {
		return 0, sluice.Grant{}, err
	}
	return f.Store.Regrant(ctx, key, l, g, unused, n)
}

// newGranting returns a flaky backend, a MultiStore on it with opts (nil:
// defaults), and their fake clock.
func newGranting(t *testing.T, opts *Options) (*flaky, *MultiStore, *storetest.Clock) {
	var o Options
	if opts != nil {
		o = *opts
	}
	clk := storetest.NewClock(t0)
	o.Clock, o.Logger = clk.Now, discard
	b := newFlaky(clk.Now)
	t.Cleanup(func() { b.Close() })
	s := newMultiStore(t, b, &o)
	return b, s, clk
}

var ctx = context.Background()

// grantAllDenied grants all of key's 10 units under l, then checks that a
// take is denied and the next one answered from the deny cache.
func grantAllDenied(t *testing.T, s *MultiStore, key string, l sluice.Limit) sluice.Grant {
	t.Helper()
	g, err := s.Grant(ctx, key, l, 10)
	if err != nil || g.Granted != 10 {
		t.Fatalf("Grant = %+v, %v", g, err)
	}
	if d, err := s.Take(ctx, key, l, 1); err != nil || d.Allowed {
		t.Fatalf("Take of an empty key = %+v, %v; want denied", d, err)
	}
	if d, _ := s.Take(ctx, key, l, 1); d.Source != sluice.SourceDenyCache {
		t.Fatalf("second Take = %+v; want the deny cache", d)
	}
	return g
}

// Grants and returns pass through while the breaker lets calls through;
// a failed one, or one the open breaker holds back, is ErrNoGrant, never a
// grant from the fallback.
func TestGrant(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	b, s, clk := newGranting(t, &Options{Observer: rec, DeadAfter: time.Nanosecond})
	l := sluice.PerSecond(10)
	g, err := s.Grant(ctx, "k", l, 4)
	if err != nil || g.Granted != 4 {
		t.Fatalf("Grant = %+v, %v; want 4 granted", g, err)
	}
	if n, err := s.Return(ctx, "k", l, g, 4); err != nil || n != 4 {
		t.Fatalf("Return = %d, %v; want 4 back", n, err)
	}
	if got := rec.count(sluice.SourceBackend); got != 2 {
		t.Fatalf("%d backend events, want 2", got)
	}
	if _, err := s.Grant(ctx, "k", l, 0); !errors.Is(err, sluice.ErrInvalidCost) || errors.Is(err, ErrNoGrant) {
		t.Fatalf("bad input: %v, want ErrInvalidCost", err)
	}
	if _, err := s.Return(ctx, "k", l, g, 5); !errors.Is(err, sluice.ErrInvalidReturn) {
		t.Fatalf("bad return: %v, want ErrInvalidReturn", err)
	}

	b.mode.Store(1)
	for i := 0; s.State() == sluice.BreakerClosed; i++ {
		if _, err := s.Grant(ctx, "k", l, 4); !errors.Is(err, ErrNoGrant) || !errors.Is(err, errDown) {
			t.Fatalf("failed grant: %v, want ErrNoGrant wrapping the backend's error", err)
		}
		if i == 10 {
			t.Fatal("breaker still closed after 10 failed grants")
		}
		clk.Advance(time.Millisecond)
	}
	calls := b.calls.Load()
	if _, err := s.Grant(ctx, "k", l, 4); !errors.Is(err, ErrNoGrant) {
		t.Fatalf("grant with the breaker open: %v, want ErrNoGrant", err)
	}
	if _, err := s.Return(ctx, "k", l, g, 1); !errors.Is(err, ErrNoGrant) {
		t.Fatalf("return with the breaker open: %v, want ErrNoGrant", err)
	}
	if b.calls.Load() != calls {
		t.Fatal("the open breaker let a grant or return through")
	}
	if d, err := s.Take(ctx, "k", l, 1); err != nil || d.Source != sluice.SourceFallback {
		t.Fatalf("Take with the breaker open = %+v, %v; want the fallback", d, err)
	}

	plain := newStore(t, struct{ sluice.Store }{b.Store}, nil)
	if _, err := plain.Grant(ctx, "k", l, 1); !errors.Is(err, ErrNoGrant) {
		t.Fatalf("a backend that cannot grant: %v, want ErrNoGrant", err)
	}
	var zero Store
	if _, err := zero.Grant(ctx, "k", l, 1); !errors.Is(err, ErrZeroStore) {
		t.Fatalf("zero Store: %v, want ErrZeroStore", err)
	}
}

// A return clears the key's cached denials: the units it gives back may
// admit what was denied.
func TestReturnForgetsDenials(t *testing.T) {
	t.Parallel()
	_, s, _ := newGranting(t, nil)
	l := sluice.PerMinute(10)
	g := grantAllDenied(t, s, "k", l)
	if n, err := s.Return(ctx, "k", l, g, 10); err != nil || n != 10 {
		t.Fatalf("Return = %d, %v", n, err)
	}
	if d, err := s.Take(ctx, "k", l, 1); err != nil || !d.Allowed || d.Source != sluice.SourceBackend {
		t.Fatalf("Take after the return = %+v, %v; want allowed by the backend", d, err)
	}
}

// A regrant is one backend call, passed through as a grant is: ErrNoGrant
// when it fails (the backend's error wrapped) or the breaker holds it back
// (ErrNotSent, nothing sent); its return clears the key's cached denials.
// Over a backend that cannot regrant it is a Return and then a Grant.
func TestRegrant(t *testing.T) {
	t.Parallel()
	b, s, clk := newGranting(t, &Options{DeadAfter: time.Nanosecond})
	l := sluice.PerMinute(10)
	g := grantAllDenied(t, s, "k", l)
	calls := b.calls.Load()
	back, next, err := s.Regrant(ctx, "k", l, g, 6, 4)
	if err != nil || back != 6 || next.Granted != 4 || next.Remaining != 2 {
		t.Fatalf("Regrant(6 back, 4) = %d, %+v, %v; want 6 back, 4 granted, 2 left", back, next, err)
	}
	if got := b.calls.Load() - calls; got != 1 {
		t.Fatalf("%d backend calls for a regrant, want 1", got)
	}
	if d, err := s.Take(ctx, "k", l, 1); err != nil || !d.Allowed || d.Source != sluice.SourceBackend {
		t.Fatalf("Take after the regrant = %+v, %v; want allowed by the backend", d, err)
	}
	if _, _, err := s.Regrant(ctx, "k", l, next, 5, 1); !errors.Is(err, sluice.ErrInvalidReturn) || errors.Is(err, ErrNoGrant) {
		t.Fatalf("bad return: %v, want ErrInvalidReturn", err)
	}
	if _, _, err := s.Regrant(ctx, "k", l, next, 1, 0); !errors.Is(err, sluice.ErrInvalidCost) || errors.Is(err, ErrNoGrant) {
		t.Fatalf("bad grant: %v, want ErrInvalidCost", err)
	}

	plain := newStore(t, struct{ sluice.Granter }{b}, nil)
	calls = b.calls.Load()
	back, next2, err := plain.Regrant(ctx, "k", l, next, 4, 3)
	if err != nil || back != 4 || next2.Granted != 3 {
		t.Fatalf("over a backend that cannot regrant: %d, %+v, %v; want 4 back, 3 granted", back, next2, err)
	}
	if got := b.calls.Load() - calls; got != 2 {
		t.Fatalf("%d backend calls over a backend that cannot regrant, want 2 (a return, a grant)", got)
	}

	b.mode.Store(1)
	for i := 0; s.State() == sluice.BreakerClosed; i++ {
		if _, _, err := s.Regrant(ctx, "k", l, next2, 1, 1); !errors.Is(err, ErrNoGrant) || !errors.Is(err, errDown) || errors.Is(err, ErrNotSent) {
			t.Fatalf("failed regrant: %v, want ErrNoGrant wrapping the backend's error", err)
		}
		if i == 10 {
			t.Fatal("breaker still closed after 10 failed regrants")
		}
		clk.Advance(time.Millisecond)
	}
	calls = b.calls.Load()
	if _, _, err := s.Regrant(ctx, "k", l, next2, 1, 1); !errors.Is(err, ErrNoGrant) || !errors.Is(err, ErrNotSent) {
		t.Fatalf("regrant with the breaker open: %v, want ErrNoGrant and ErrNotSent", err)
	}
	if b.calls.Load() != calls {
		t.Fatal("the open breaker let a regrant through")
	}
}

// TakeAllByPolicy answers without the backend, all or nothing: under
// FallbackLocal from the fallback's TakeAll, so that a check the fallback
// denies leaves the others' units in it; one event per check, op "take"
// (no Peeks), and for one check exactly what TakeByPolicy answers and
// tells.
func TestTakeAllByPolicy(t *testing.T) {
	t.Parallel()
	l := sluice.PerMinute(3)
	cause := fmt.Errorf("%w: grant: %w", ErrNoGrant, errDown)
	for _, p := range []Policy{FallbackLocal, FailOpen, FailClosed} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			rec, twin := &StoreEvents{}, &StoreEvents{}
			b, s, _ := newGranting(t, &Options{Policy: p, Observer: rec})
			_, s2, _ := newGranting(t, &Options{Policy: p, Observer: twin})
			rec.Take()
			twin.Take()
			one := []sluice.Request{{Key: "a", Limit: l, Cost: 2}}
			ds, err := s.TakeAllByPolicy(ctx, one, cause)
			d, err2 := s2.TakeByPolicy(ctx, "a", l, 2, cause)
			if err != nil || err2 != nil || len(ds) != 1 || ds[0] != d {
				t.Fatalf("one check: TakeAllByPolicy = %+v, %v; TakeByPolicy = %+v, %v; want the same", ds, err, d, err2)
			}
			if got, want := rec.Take(), twin.Take(); len(got) != 1 || len(want) != 1 || got[0] != want[0] || got[0].Op != "take" || !got[0].Reported || got[0].Err != errDown {
				t.Errorf("one check: events %+v; want TakeByPolicy's %+v (op take, the backend's error, reported)", got, want)
			}

			two := []sluice.Request{{Key: "b", Limit: l, Cost: 1}, {Key: "a", Limit: l, Cost: 2}}
			ds, err = s.TakeAllByPolicy(ctx, two, nil)
			if err != nil {
				t.Fatal(err)
			}
			ev := rec.Take()
			if len(ev) != 2 {
				t.Fatalf("two checks: events %+v; want one each", ev)
			}
			for i, e := range ev {
				if e.Op != "take" || e.Key != two[i].Key || e.Source != ds[i].Source || e.Err != nil || e.Reported {
					t.Errorf("two checks: event %d %+v; want op take of %s, source %v, no error", i, e, two[i].Key, ds[i].Source)
				}
			}
			switch p {
			case FallbackLocal:
				// a has 1 unit left: denied, b's unit stays in the fallback.
				if !ds[0].Allowed || ds[1].Allowed {
					t.Errorf("a's fallback spent: %+v; want b allowing, a denied, nothing taken", ds)
				}
				if ds[0].Remaining != 3 {
					t.Errorf("b's verdict %+v; want Remaining 3, as a Peek (nothing taken)", ds[0])
				}
				ds, err = s.TakeAllByPolicy(ctx, []sluice.Request{{Key: "b", Limit: l, Cost: 3}, {Key: "a", Limit: l, Cost: 1}}, nil)
				if err != nil || !ds[0].Allowed || !ds[1].Allowed || ds[0].Source != sluice.SourceFallback {
					t.Errorf("b's 3 units and a's last: %+v, %v; want both from the fallback", ds, err)
				}
			case FailOpen:
				if !ds[0].Allowed || !ds[1].Allowed || ds[0].Source != sluice.SourceFailOpen {
					t.Errorf("fail-open: %+v; want both admitted", ds)
				}
			case FailClosed:
				if ds[0].Allowed || ds[1].Allowed || ds[0].Source != sluice.SourceFailClosed {
					t.Errorf("fail-closed: %+v; want both denied", ds)
				}
			}
			if c := b.calls.Load(); c != 0 {
				t.Errorf("%d backend calls, want none", c)
			}
		})
	}
}

// Requests racing for a fallback's last units through TakeAllByPolicy,
// their checks in either order, never take one check's units and not the
// other's: the fallback's TakeAll takes both in one step.
func TestTakeAllByPolicyRace(t *testing.T) {
	t.Parallel()
	const capacity, goroutines, rounds = 50, 8, 20
	l := sluice.PerHour(capacity)
	_, s, _ := newGranting(t, nil)
	var admitted atomic.Int64
	var wg sync.WaitGroup
	for g := range goroutines {
		reqs := []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 1}}
		if g%2 == 1 {
			reqs[0], reqs[1] = reqs[1], reqs[0]
		}
		wg.Go(func() {
			for range rounds {
				ds, err := s.TakeAllByPolicy(ctx, reqs, nil)
				if err != nil {
					t.Error(err)
					return
				}
				if ds[0].Allowed && ds[1].Allowed {
					admitted.Add(1)
				}
			}
		})
	}
	wg.Wait()
	for _, key := range []string{"a", "b"} {
		d, err := s.fallback.Peek(ctx, key, l, 1)
		if err != nil || d.Remaining != 0 {
			t.Errorf("fallback's %s after the race: %+v, %v; want every unit spent", key, d, err)
		}
	}
	if n := admitted.Load(); n != capacity {
		t.Errorf("%d admitted, want %d", n, capacity)
	}
}

// A Store whose fallback has no TakeAll answers a TakeAllByPolicy from
// its Peeks and Takes: a check it denies takes nothing for the others.
func TestTakeAllByPolicyPlainFallback(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	fb := memory.New(&memory.Options{Clock: clk.Now})
	t.Cleanup(func() { fb.Close() })
	b := newFlaky(clk.Now)
	t.Cleanup(func() { b.Close() })
	s := newStore(t, b, &Options{Clock: clk.Now, Logger: discard, Fallback: onlyStore{fb}})
	l := sluice.PerMinute(2)
	reqs := []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 2}}
	if ds, err := s.TakeAllByPolicy(ctx, reqs, nil); err != nil || !ds[0].Allowed || !ds[1].Allowed {
		t.Fatalf("TakeAllByPolicy = %+v, %v; want both admitted", ds, err)
	}
	ds, err := s.TakeAllByPolicy(ctx, reqs, nil)
	if err != nil || ds[1].Allowed {
		t.Fatalf("TakeAllByPolicy with b spent = %+v, %v; want b denied", ds, err)
	}
	if d, _ := fb.Peek(ctx, "a", l, 1); d.Remaining != 1 {
		t.Errorf("a in the fallback: %+v; want its last unit still there", d)
	}
	if c := b.calls.Load(); c != 0 {
		t.Errorf("%d backend calls, want none", c)
	}
}
