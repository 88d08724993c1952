package resilient

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// A backend whose client was closed is no outage: its error
// (sluice.ErrStoreClosed) is returned, the breaker stays closed, and no
// policy answers, so that a release sent again in the background stops
// on it rather than meeting an open breaker until its hold ends.
func TestClosedBackendIsReturned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	s := newStore(t, redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)}), &Options{Policy: FallbackLocal, Logger: discard})
	c.Close()
	l := sluice.Concurrent(2, time.Minute)
	for i := range 20 {
		if _, err := s.Release(ctx, "k", "h"); !errors.Is(err, sluice.ErrStoreClosed) {
			t.Fatalf("Release #%d on a closed backend = %v, want ErrStoreClosed", i+1, err)
		}
	}
	if d, err := s.Acquire(ctx, "k", l, 1, "h"); !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("Acquire on a closed backend = %+v, %v; want ErrStoreClosed, no policy", d, err)
	}
	if st := s.State(); st != sluice.BreakerClosed {
		t.Errorf("breaker %v after calls on a closed backend, want closed", st)
	}
}

// A probe on a backend whose client its owner closed (the breaker open on
// a dead Redis, the client then closed at shutdown) says nothing of the
// backend's health: Probe returns sluice.ErrStoreClosed and the breaker
// stays half-open with its probe given back, as after any call the
// caller's own doing. Before, it counted as a failed probe: the breaker
// reopened for another ProbeInterval, with its line and transition.
func TestProbeOnClosedBackendIsNoFailure(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	rec := &recorder{}
	c := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1})
	s := newStore(t, redisstore.New(c, nil), &Options{
		Clock: clk.Now, Observer: rec, Logger: discard, Timeout: time.Second,
		FailureThreshold: 1, DeadAfter: time.Millisecond, ProbeInterval: time.Second,
	})
	for range 2 {
		s.Take(context.Background(), "k", sluice.PerMinute(10), 1)
		clk.Advance(10 * time.Millisecond)
	}
	if st := s.State(); st != sluice.BreakerOpen {
		t.Fatalf("breaker %v after calls on a dead Redis, want open", st)
	}
	c.Close()
	clk.Advance(2 * time.Second) // the probe is due
	if sent, err := s.Probe(context.Background()); !sent || !errors.Is(err, sluice.ErrStoreClosed) {
		t.Fatalf("Probe on a closed backend = %v, %v; want sent, sluice.ErrStoreClosed", sent, err)
	}
	rec.mu.Lock()
	got := slices.Clone(rec.breakers)
	rec.mu.Unlock()
	if want := []sluice.BreakerState{sluice.BreakerOpen, sluice.BreakerHalfOpen}; !slices.Equal(got, want) {
		t.Errorf("breaker transitions %v, want %v: a probe on a closed client is no failure", got, want)
	}
	// The probe was given back: the next call may probe at once.
	if sent, err := s.Probe(context.Background()); !sent || !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("second Probe = %v, %v; want sent, sluice.ErrStoreClosed", sent, err)
	}
}

var policies = []Policy{FallbackLocal, FailOpen, FailClosed}

// canceled is a context that has already ended.
func canceled() context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	return ctx
}

// wantCanceled fails the test unless err wraps context.Canceled.
func wantCanceled(t *testing.T, what string, v any, err error) {
	t.Helper()
	if !errors.Is(err, context.Canceled) {
		t.Errorf("%s = %+v, %v; want context.Canceled", what, v, err)
	}
}

// With the breaker open on a dead Redis, a call whose context has ended
// gets the context's error under every policy, from every method, as it
// does with the breaker closed; calls with a live context still get the
// policy's answer.
func TestContextEndedBreakerOpen(t *testing.T) {
	t.Parallel()
	for _, p := range policies {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1})
			t.Cleanup(func() { client.Close() })
			s := newMultiStore(t, redisstore.New(client, nil), &Options{Policy: p, Nodes: 1, Timeout: time.Second, DeadAfter: time.Millisecond, FailureThreshold: 1, ProbeInterval: time.Hour})
			l := sluice.PerMinute(10)
			waitFor(t, "the breaker to open", func() bool {
				s.Take(context.Background(), "k", l, 1)
				return s.State() == sluice.BreakerOpen
			})
			il := sluice.Concurrent(4, time.Minute)
			held := sluice.NewHolderID()
			if _, err := s.Acquire(context.Background(), "slots", il, 1, held); err != nil {
				t.Fatal(err)
			}

			ctx := canceled()
			d, err := s.Take(ctx, "k", l, 1)
			wantCanceled(t, "Take", d, err)
			d, err = s.Peek(ctx, "k", l, 1)
			wantCanceled(t, "Peek", d, err)
			ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 1}})
			wantCanceled(t, "TakeAll", ds, err)
			sd, err := s.Acquire(ctx, "slots", il, 1, sluice.NewHolderID())
			wantCanceled(t, "Acquire", sd, err)
			ok, err := s.Extend(ctx, "slots", il, held)
			wantCanceled(t, "Extend of a held slot", ok, err)
			ok, err = s.Extend(ctx, "slots", il, sluice.NewHolderID())
			wantCanceled(t, "Extend of an unknown holder", ok, err)
			ok, err = s.Release(ctx, "slots", held)
			wantCanceled(t, "Release of a held slot", ok, err)
			g, err := s.Grant(ctx, "k", l, 2)
			wantCanceled(t, "Grant", g, err)
			n, err := s.Return(ctx, "k", l, sluice.Grant{Granted: 2}, 1)
			wantCanceled(t, "Return", n, err)
			n, g, err = s.Regrant(ctx, "k", l, sluice.Grant{Granted: 2}, 1, 2)
			wantCanceled(t, "Regrant", []any{n, g}, err)
			wantCanceled(t, "Reset", nil, s.Reset(ctx, "k", l))

			dl, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
			defer cancel()
			if _, err := s.Take(dl, "k", l, 1); !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Take past its deadline: %v, want context.DeadlineExceeded", err)
			}

			// The policy still answers a live caller.
			d, err = s.Take(context.Background(), "k", l, 1)
			if err != nil || d.Source != map[Policy]sluice.Source{FallbackLocal: sluice.SourceFallback, FailOpen: sluice.SourceFailOpen, FailClosed: sluice.SourceFailClosed}[p] {
				t.Errorf("live Take = %+v, %v; want the policy's answer", d, err)
			}
			if p != FailClosed { // the slot is still held where it was granted
				if ok, err := s.Release(context.Background(), "slots", held); err != nil || !ok {
					t.Errorf("live Release = %v, %v; want the held slot released", ok, err)
				}
			}
		})
	}
}

// On a real Redis, with the breaker closed, a call whose context has
// ended gets the context's error and takes nothing; a denial the deny
// cache holds is no exception.
func TestContextEndedRedis(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	for _, p := range policies {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			s := newMultiStore(t, redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}), &Options{Policy: p, Nodes: 1, Timeout: time.Second})
			l := sluice.PerMinute(3)
			ctx := canceled()
			d, err := s.Take(ctx, "k", l, 1)
			wantCanceled(t, "Take", d, err)
			if d, err := s.Peek(context.Background(), "k", l, 1); err != nil || d.Remaining != 3 {
				t.Fatalf("after a canceled Take: Peek = %+v, %v; want 3 left", d, err)
			}
			for range 4 {
				if _, err := s.Take(context.Background(), "k", l, 1); err != nil {
					t.Fatal(err)
				}
			}
			if d, err := s.Take(context.Background(), "k", l, 1); err != nil || d.Allowed || d.Source != sluice.SourceDenyCache {
				t.Fatalf("denied key: Take = %+v, %v; want the deny cache's denial", d, err)
			}
			d, err = s.Take(ctx, "k", l, 1)
			wantCanceled(t, "Take on a cached denial", d, err)
			d, err = s.Peek(ctx, "k", l, 1)
			wantCanceled(t, "Peek on a cached denial", d, err)
			ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: l, Cost: 1}, {Key: "other", Limit: l, Cost: 1}})
			wantCanceled(t, "TakeAll on a cached denial", ds, err)
			if got := s.State(); got != sluice.BreakerClosed {
				t.Errorf("breaker %v, want closed", got)
			}
		})
	}
}
