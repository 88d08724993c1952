package resilient

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
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
