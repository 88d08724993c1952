package resilient

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// A fallback that was never built (a zero memory.Store, a redisstore
// without a client, a zero resilient store) is refused by New and NewMulti:
// it used to be accepted, work while Redis was up, and then fail every
// decision of an outage (and every Reset at once). Over real Redis.
func TestNewRefusesUnbuiltFallback(t *testing.T) {
	t.Parallel()
	backend := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	for name, fb := range map[string]sluice.MultiStore{
		"zero memory.Store":      &memory.Store{},
		"redisstore.New(nil)":    redisstore.New(nil, nil),
		"zero resilient.Multi":   &MultiStore{},
		"resilient of zero mem":  func() sluice.MultiStore { m, _ := NewMulti(&memory.Store{}, nil); return m }(),
		"zero redisstore.Store":  &redisstore.Store{},
		"typed nil memory.Store": (*memory.Store)(nil),
	} {
		for _, p := range []Policy{FallbackLocal, FailOpen} {
			if s, err := New(backend, &Options{Policy: p, Fallback: fb}); !errors.Is(err, ErrInvalidOptions) || !errors.Is(err, sluice.ErrStoreNotBuilt) && name != "typed nil memory.Store" {
				t.Errorf("New, fallback %s, %v: %v, %v; want ErrInvalidOptions (store not built)", name, p, s, err)
			}
			if s, err := NewMulti(backend, &Options{Policy: p, Fallback: fb}); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("NewMulti, fallback %s, %v: %v, %v; want ErrInvalidOptions", name, p, s, err)
			}
		}
	}
	fb := memory.New(nil)
	t.Cleanup(func() { fb.Close() })
	s, err := NewMulti(backend, &Options{Fallback: fb})
	if err != nil {
		t.Fatalf("NewMulti with a built fallback: %v", err)
	}
	defer s.Close()
	if err := s.CheckBuilt(); err != nil {
		t.Errorf("CheckBuilt of a built store: %v", err)
	}
	if err := s.Reset(context.Background(), "k", sluice.PerSecond(5)); err != nil {
		t.Errorf("Reset with Redis up: %v", err)
	}
}

// checkCounted is a fallback that counts its CheckBuilt calls: a zero
// memory.Store, which refuses, or a built one.
type checkCounted struct {
	*memory.Store
	calls atomic.Int32
}

func (c *checkCounted) CheckBuilt() error {
	c.calls.Add(1)
	return c.Store.CheckBuilt()
}

// New and NewMulti ask the fallback whether it was built once, whether it
// was or not.
func TestNewChecksFallbackOnce(t *testing.T) {
	t.Parallel()
	backend := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	built := memory.New(nil)
	t.Cleanup(func() { built.Close() })
	for name, mem := range map[string]*memory.Store{"unbuilt": {}, "built": built} {
		fb := &checkCounted{Store: mem}
		s, err := New(backend, &Options{Fallback: fb})
		if (err != nil) != (name == "unbuilt") {
			t.Errorf("New, %s fallback: %v", name, err)
		}
		if s != nil {
			s.Close()
		}
		if got := fb.calls.Load(); got != 1 {
			t.Errorf("New, %s fallback: CheckBuilt called %d times, want 1", name, got)
		}
		fb.calls.Store(0)
		m, err := NewMulti(backend, &Options{Fallback: fb})
		if (err != nil) != (name == "unbuilt") {
			t.Errorf("NewMulti, %s fallback: %v", name, err)
		}
		if m != nil {
			m.Close()
		}
		if got := fb.calls.Load(); got != 1 {
			t.Errorf("NewMulti, %s fallback: CheckBuilt called %d times, want 1", name, got)
		}
	}
}

// zeroStore is what a zero Store and MultiStore answer for.
type zeroStore interface {
	sluice.Store
	sluice.Slots
	sluice.Regranter
	CheckLimit(sluice.Limit) error
	TakeByPolicy(ctx context.Context, key string, limit sluice.Limit, cost int64, cause error) (sluice.Decision, error)
	PeekByPolicy(ctx context.Context, key string, limit sluice.Limit, cost int64, cause error) (sluice.Decision, error)
	TakeAllByPolicy(ctx context.Context, reqs []sluice.Request, cause error) ([]sluice.Decision, error)
	AbandonSlot(key, holder string)
	State() sluice.BreakerState
	Probe(context.Context) (bool, error)
	ProbeNow(context.Context) error
	Close() error
}

// A nil *Store behaves as a zero Store: every call is refused with
// ErrZeroStore (or does nothing), and none panics; so do a zero
// MultiStore and a nil *MultiStore (which panicked).
func TestNilStore(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limit := sluice.PerSecond(10)
	slot := sluice.InFlightLimit{Max: 1, Hold: time.Second}
	for _, tc := range []struct {
		name string
		s    zeroStore
	}{{"nil", (*Store)(nil)}, {"zero", &Store{}}, {"zero MultiStore's Store", (&MultiStore{}).Store},
		{"zero MultiStore", &MultiStore{}}, {"nil MultiStore", (*MultiStore)(nil)}} {
		s := tc.s
		if _, err := s.Take(ctx, "k", limit, 1); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Take err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.TakeByPolicy(ctx, "k", limit, 1, nil); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: TakeByPolicy err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.PeekByPolicy(ctx, "k", limit, 1, nil); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: PeekByPolicy err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.TakeAllByPolicy(ctx, []sluice.Request{{Key: "k", Limit: limit, Cost: 1}}, nil); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: TakeAllByPolicy err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Peek(ctx, "k", limit, 1); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Peek err = %v, want ErrZeroStore", tc.name, err)
		}
		if err := s.Reset(ctx, "k", limit); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Reset err = %v, want ErrZeroStore", tc.name, err)
		}
		if err := s.CheckLimit(limit); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: CheckLimit err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Grant(ctx, "k", limit, 1); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Grant err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Return(ctx, "k", limit, sluice.Grant{Granted: 1}, 1); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Return err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, _, err := s.Regrant(ctx, "k", limit, sluice.Grant{Granted: 1}, 1, 1); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Regrant err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Acquire(ctx, "k", slot, 1, "h"); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Acquire err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Extend(ctx, "k", slot, "h"); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Extend err = %v, want ErrZeroStore", tc.name, err)
		}
		if _, err := s.Release(ctx, "k", "h"); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: Release err = %v, want ErrZeroStore", tc.name, err)
		}
		s.AbandonSlot("k", "h")
		sluice.ReleaseAbandoned(s, "k", "h")
		if st := s.State(); st != sluice.BreakerClosed {
			t.Errorf("%s: State = %v, want closed", tc.name, st)
		}
		if sent, err := s.Probe(ctx); sent || err != nil {
			t.Errorf("%s: Probe = %v, %v; want nothing sent", tc.name, sent, err)
		}
		if err := s.ProbeNow(ctx); err != nil {
			t.Errorf("%s: ProbeNow err = %v", tc.name, err)
		}
		if err := s.Close(); err != nil {
			t.Errorf("%s: Close err = %v", tc.name, err)
		}
		if _, err := sluice.NewLimiter(s, limit, nil); !errors.Is(err, ErrZeroStore) {
			t.Errorf("%s: NewLimiter err = %v, want ErrZeroStore", tc.name, err)
		}
	}
	for _, m := range []*MultiStore{{}, nil} {
		if _, err := m.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: limit, Cost: 1}}); !errors.Is(err, ErrZeroStore) {
			t.Errorf("MultiStore %v: TakeAll err = %v, want ErrZeroStore", m, err)
		}
		if _, err := m.TakeAll(ctx, []sluice.Request{{Key: "", Limit: limit, Cost: 1}}); !errors.Is(err, sluice.ErrInvalidKey) {
			t.Errorf("MultiStore %v: TakeAll of an empty key: err = %v, want ErrInvalidKey", m, err)
		}
	}
}

// A backend built without what it needs (a redisstore with no client, a
// zero memory store) fails every call with its sentinel, and that reaches
// the caller under every policy: the breaker does not count it and no
// policy answers for it, for a backend that can never work would otherwise
// be answered by FailOpen forever. Nil pointers are refused at New.
func TestMisbuiltBackend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	limit := sluice.PerSecond(2)
	for _, tc := range []struct {
		name    string
		backend sluice.MultiStore
		want    error
	}{
		{"redisstore.New(nil, nil)", redisstore.New(nil, nil), redisstore.ErrNoClient},
		{"zero redisstore.Store", &redisstore.Store{}, redisstore.ErrNoClient},
		{"zero memory.Store", &memory.Store{}, memory.ErrZeroStore},
		{"zero resilient.MultiStore", &MultiStore{}, ErrZeroStore},
	} {
		for _, p := range []Policy{FailOpen, FailClosed, FallbackLocal} {
			rec := &recorder{}
			s, err := NewMulti(tc.backend, &Options{Policy: p, FailureThreshold: 1, DeadAfter: time.Millisecond,
				MinCalls: 1, Observer: rec, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatalf("%s, %v: NewMulti: %v", tc.name, p, err)
			}
			for range 20 {
				d, err := s.Take(ctx, "k", limit, 1)
				if !errors.Is(err, tc.want) || !errors.Is(err, sluice.ErrStoreNotBuilt) && tc.want != memory.ErrZeroStore {
					t.Fatalf("%s, %v: Take = %+v, %v; want %v", tc.name, p, d, err, tc.want)
				}
				time.Sleep(time.Millisecond)
			}
			storetest.Refuses(t, s, tc.want)
			if _, err := s.Grant(ctx, "k", limit, 1); !errors.Is(err, tc.want) || errors.Is(err, ErrNoGrant) {
				t.Errorf("%s, %v: Grant err = %v, want %v alone", tc.name, p, err, tc.want)
			}
			slot := sluice.InFlightLimit{Max: 1, Hold: time.Second}
			if _, err := s.Acquire(ctx, "k", slot, 1, "h"); !errors.Is(err, tc.want) {
				t.Errorf("%s, %v: Acquire err = %v, want %v", tc.name, p, err, tc.want)
			}
			if st := s.State(); st != sluice.BreakerClosed || len(rec.breakers) != 0 || rec.initial != 1 {
				t.Errorf("%s, %v: breaker %v after %v (%d initial), want closed throughout, announced once", tc.name, p, st, rec.breakers, rec.initial)
			}
			for _, src := range []sluice.Source{sluice.SourceFailOpen, sluice.SourceFailClosed, sluice.SourceFallback} {
				if n := rec.count(src); n != 0 {
					t.Errorf("%s, %v: the policy answered %d calls (%v)", tc.name, p, n, src)
				}
			}
			// Refused up front (a backend that checks limits) or at each call.
			if l, err := sluice.NewLimiter(s, limit, nil); err != nil {
				if !errors.Is(err, tc.want) {
					t.Errorf("%s, %v: NewLimiter: %v, want %v", tc.name, p, err, tc.want)
				}
			} else if d, err := l.Allow(ctx, "k"); !errors.Is(err, tc.want) || d.Allowed {
				t.Errorf("%s, %v: Allow = %+v, %v; want %v", tc.name, p, d, err, tc.want)
			}
			s.Close()
		}
	}
	for _, tc := range []struct {
		name string
		b    sluice.MultiStore
		opts *Options
	}{
		{"nil *redisstore.Store", (*redisstore.Store)(nil), nil},
		{"nil *memory.Store", (*memory.Store)(nil), nil},
		{"nil *MultiStore", (*MultiStore)(nil), nil},
		{"nil *memory.Store fallback", memory.New(nil), &Options{Fallback: (*memory.Store)(nil)}},
	} {
		if s, err := New(tc.b, tc.opts); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("New(%s) = %v, %v; want ErrInvalidOptions", tc.name, s, err)
		}
		if s, err := NewMulti(tc.b, tc.opts); !errors.Is(err, ErrInvalidOptions) {
			t.Errorf("NewMulti(%s) = %v, %v; want ErrInvalidOptions", tc.name, s, err)
		}
	}
}
