package resilient

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// policyAnswers keeps the first store event the policy answered.
type policyAnswers struct{ first atomic.Value }

func (o *policyAnswers) ObserveDecision(sluice.DecisionEvent) {}
func (o *policyAnswers) ObserveBreaker(sluice.BreakerEvent)   {}

func (o *policyAnswers) ObserveStore(e sluice.StoreEvent) {
	if e.Source != sluice.SourceBackend {
		o.first.CompareAndSwap(nil, e)
	}
}

// closedCalls are one of each call a resilient store takes, on key.
func closedCalls(m *MultiStore, key string) []func(context.Context) error {
	l := sluice.PerSecond(1_000_000)
	in := sluice.Concurrent(100, time.Minute)
	return []func(context.Context) error{
		func(ctx context.Context) error { _, err := m.Take(ctx, key, l, 1); return err },
		func(ctx context.Context) error { _, err := m.Peek(ctx, key, l, 1); return err },
		func(ctx context.Context) error {
			_, err := m.TakeAll(ctx, []sluice.Request{{Key: key, Limit: l, Cost: 1}})
			return err
		},
		func(ctx context.Context) error { _, err := m.Acquire(ctx, key, in, 1, "h9"); return err },
		func(ctx context.Context) error { _, err := m.Extend(ctx, key, in, "h0"); return err },
		func(ctx context.Context) error { _, err := m.Release(ctx, key, "h1"); return err },
		func(ctx context.Context) error { _, _, err := m.ReleaseOnce(ctx, key, "h2", time.Minute); return err },
		func(ctx context.Context) error { _, err := m.Grant(ctx, key, l, 5); return err },
		func(ctx context.Context) error { return m.Reset(ctx, key, l) },
	}
}

// After its Redis Cluster client is closed, every call through a resilient
// store with its default 50 ms timeout fails with sluice.ErrStoreClosed,
// the first too, and no policy answers nor does the breaker move: a call on
// a closed Cluster client takes go-redis 100–145 ms to fail, so the timeout
// cut the first calls, which were counted as an outage. The first fails at
// once too: it waited out the whole timeout.
func TestClosedClusterClientNoPolicy(t *testing.T) {
	cl := redistest.StartCluster(t, nil)
	for _, p := range policies {
		t.Run(p.String(), func(t *testing.T) {
			own := cl.Client(t)
			obs := &policyAnswers{}
			backend := redisstore.New(own, &redisstore.Options{Prefix: redistest.Prefix(t)})
			m := newMultiStore(t, backend, &Options{Policy: p, Nodes: 1, FailureThreshold: 1, Observer: obs, Logger: discard})
			ctx := context.Background()
			in := sluice.Concurrent(100, time.Minute)
			// The holders, on the backend itself: through m, a slow
			// first call under load (-race) would be cut at 50 ms and
			// answered by the policy before the client is closed.
			for _, h := range []string{"h0", "h1", "h2"} {
				if d, err := backend.Acquire(ctx, "k", in, 1, h); err != nil || !d.Allowed {
					t.Fatal(d, err)
				}
			}
			own.Close()
			for i, call := range closedCalls(m, "k") {
				start := time.Now()
				if err := call(ctx); !errors.Is(err, sluice.ErrStoreClosed) {
					t.Errorf("call %d after the client's Close: %v after %v, want sluice.ErrStoreClosed", i, err, time.Since(start))
				}
			}
			if e, ok := obs.first.Load().(sluice.StoreEvent); ok {
				t.Errorf("the policy answered a call on a closed client: %+v", e)
			}
			if st := m.State(); st != sluice.BreakerClosed {
				t.Errorf("breaker %v after calls on a closed client, want closed", st)
			}
		})
	}
	// Each call, as the first after the close, cut by the timeout before
	// the backend has recorded it: Reset's returned the timeout alone.
	t.Run("each first", func(t *testing.T) {
		for i := range closedCalls(nil, "k") {
			own := cl.Client(t)
			obs := &policyAnswers{}
			backend := redisstore.New(own, &redisstore.Options{Prefix: redistest.Prefix(t)})
			m := newMultiStore(t, backend, &Options{Nodes: 1, Observer: obs, Logger: discard})
			// A client in use: one with no slot map yet fails at once.
			if _, err := backend.Take(context.Background(), "k", sluice.PerSecond(1_000_000), 1); err != nil {
				t.Fatal(err)
			}
			own.Close()
			start := time.Now()
			err := closedCalls(m, "k")[i](context.Background())
			took := time.Since(start)
			if !errors.Is(err, sluice.ErrStoreClosed) {
				t.Errorf("call %d, the first after the client's Close: %v after %v, want sluice.ErrStoreClosed", i, err, took)
			}
			if took > DefaultTimeout/2 {
				t.Errorf("call %d, the first after the client's Close, took %v, want it to fail at once, not near the %v timeout", i, took, DefaultTimeout)
			}
			if e, ok := obs.first.Load().(sluice.StoreEvent); ok {
				t.Errorf("call %d: the policy answered it: %+v", i, e)
			}
		}
	})
}

// A Sentinel-routed client closed by its owner is refused as a Cluster
// client is: every call fails at once with sluice.ErrStoreClosed, the
// first too, and neither the policy nor the breaker hears of it. A
// failover client is one server's and failed at once already; a
// failover Cluster client (routing reads by Sentinel) is a Cluster
// client, whose first call waited out the 50 ms timeout.
func TestClosedSentinelClientNoPolicy(t *testing.T) {
	set := redistest.StartSentinel(t, &redistest.SentinelOptions{Sentinels: 1, Quorum: 1})
	opts := func(random bool) *redis.FailoverOptions {
		return &redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: set.SentinelAddrs(), RouteRandomly: random}
	}
	for name, client := range map[string]func() redis.UniversalClient{
		"failover":         func() redis.UniversalClient { return redis.NewFailoverClient(opts(false)) },
		"failover cluster": func() redis.UniversalClient { return redis.NewFailoverClusterClient(opts(true)) },
	} {
		t.Run(name, func(t *testing.T) {
			for i := range closedCalls(nil, "k") {
				own := client()
				t.Cleanup(func() { own.Close() })
				obs := &policyAnswers{}
				backend := redisstore.New(own, &redisstore.Options{Prefix: redistest.Prefix(t)})
				m := newMultiStore(t, backend, &Options{Nodes: 1, FailureThreshold: 1, Observer: obs, Logger: discard})
				if _, err := backend.Take(context.Background(), "k", sluice.PerSecond(1_000_000), 1); err != nil {
					t.Fatal(err)
				}
				own.Close()
				for n := range 3 {
					start := time.Now()
					err := closedCalls(m, "k")[i](context.Background())
					took := time.Since(start)
					if !errors.Is(err, sluice.ErrStoreClosed) {
						t.Errorf("call %d, #%d after the client's Close: %v after %v, want sluice.ErrStoreClosed", i, n, err, took)
					}
					if took > DefaultTimeout/2 {
						t.Errorf("call %d, #%d after the client's Close, took %v, want it to fail at once", i, n, took)
					}
				}
				if e, ok := obs.first.Load().(sluice.StoreEvent); ok {
					t.Errorf("call %d: the policy answered it: %+v", i, e)
				}
				if st := m.State(); st != sluice.BreakerClosed {
					t.Errorf("call %d: breaker %v after calls on a closed client, want closed", i, st)
				}
			}
		})
	}
}

// After the resilient store's own Close every call fails with
// sluice.ErrStoreClosed, though its backend would still answer.
func TestClosedStoreRefuses(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	t.Cleanup(func() { c.Close() })
	m := newMultiStore(t, redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)}), &Options{Logger: discard})
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	for i, call := range closedCalls(m, "k") {
		if err := call(context.Background()); !errors.Is(err, sluice.ErrStoreClosed) {
			t.Errorf("call %d after Close = %v, want sluice.ErrStoreClosed", i, err)
		}
	}
	if _, err := m.TakeByPolicy(context.Background(), "k", sluice.PerMinute(1), 1, nil); !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("TakeByPolicy after Close = %v, want sluice.ErrStoreClosed", err)
	}
	if _, err := m.TakeAllByPolicy(context.Background(), []sluice.Request{{Key: "k", Limit: sluice.PerMinute(1), Cost: 1}}, nil); !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("TakeAllByPolicy after Close = %v, want sluice.ErrStoreClosed", err)
	}
}

// After Close, Probe and ProbeNow send no probe, though one is due, and
// TryAbandonSlot starts no release of a holder whose backend Acquire
// failed: each returns sluice.ErrStoreClosed, as every decision does, and
// the backend hears nothing. Before, all three went on calling it.
func TestClosedStoreSendsNothing(t *testing.T) {
	t.Parallel()
	f := newSlotFixture(t, Options{Policy: FailClosed, Logger: discard})
	s, b, ctx := f.s, f.b, context.Background()
	l := sluice.Concurrent(2, 10*time.Minute)
	b.mode.Store(1)
	for _, h := range []string{"h1", "h2", "h3", "h4"} { // sent, failed: each may hold a backend slot
		if _, err := s.Acquire(ctx, "k", l, 1, h); err != nil {
			t.Fatal(err)
		}
		f.clk.Advance(200 * time.Millisecond)
	}
	if st := s.State(); st != sluice.BreakerOpen {
		t.Fatalf("breaker %v after failed acquires, want open", st)
	}
	b.mode.Store(0)
	f.clk.Advance(2 * time.Second) // a probe is due
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	calls := b.calls.Load()
	if sent, err := s.Probe(ctx); sent || !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("Probe after Close = %v, %v; want nothing sent, sluice.ErrStoreClosed", sent, err)
	}
	if err := s.ProbeNow(ctx); !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("ProbeNow after Close = %v, want sluice.ErrStoreClosed", err)
	}
	if err := s.TryAbandonSlot("k", "h1"); !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("TryAbandonSlot of a sent holder after Close = %v, want sluice.ErrStoreClosed", err)
	}
	if err := s.TryAbandonSlot("k", "never"); err != nil {
		t.Errorf("TryAbandonSlot of a holder never sent after Close = %v, want nil (nothing to send)", err)
	}
	s.AbandonSlot("k", "h2")
	m := &MultiStore{Store: s}
	m.AbandonSlot("k", "h3")
	if sent, err := m.Probe(ctx); sent || !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("MultiStore.Probe after Close = %v, %v; want nothing sent, sluice.ErrStoreClosed", sent, err)
	}
	if err := m.ProbeNow(ctx); !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("MultiStore.ProbeNow after Close = %v, want sluice.ErrStoreClosed", err)
	}
	if err := sluice.TryReleaseAbandoned(s, "k", "h4"); !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("sluice.TryReleaseAbandoned after Close = %v, want sluice.ErrStoreClosed", err)
	}
	time.Sleep(100 * time.Millisecond) // for a background release to show
	if got := b.calls.Load() - calls; got != 0 {
		t.Errorf("%d backend calls after Close, want none", got)
	}
	if st := s.State(); st != sluice.BreakerOpen {
		t.Errorf("breaker %v after Close, want open still (no probe)", st)
	}
}
