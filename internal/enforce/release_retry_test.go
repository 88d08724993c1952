package enforce

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

// fullSlotEvents records the slot events as they came.
type fullSlotEvents struct {
	mu sync.Mutex
	ev []sluice.SlotEvent
}

func (e *fullSlotEvents) ObserveDecision(sluice.DecisionEvent) {}
func (e *fullSlotEvents) ObserveStore(sluice.StoreEvent)       {}
func (e *fullSlotEvents) ObserveBreaker(sluice.BreakerEvent)   {}
func (e *fullSlotEvents) ObserveSlot(ev sluice.SlotEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ev = append(e.ev, ev)
}

func (e *fullSlotEvents) events() []sluice.SlotEvent {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]sluice.SlotEvent(nil), e.ev...)
}

// A release whose answer was lost (Redis ran it, the reply came after the
// release's 1 s bound) is sent again in the background, and Redis then
// answers not held: the slot was released, by the first try, long before
// its hold could pass. It is reported as a release (freed before, with
// the slot's weight), not as an expiry, which it was labelled before:
// sluice_inflight_held fell by a SlotExpire, and the release counted as
// not_held.
func TestRetriedReleaseFreedByFirstTry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	proxy := redistest.StartDelayProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	store := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	obs := &fullSlotEvents{}
	rs := observedRules(t, store, obs, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(10, time.Minute), Key: ident})
	h, v, err := rs.Acquire(ctx, "k", sluice.PriorityCritical)
	if err != nil || !v.Allowed {
		t.Fatal(v, err)
	}
	proxy.SetDelay(600 * time.Millisecond) // a round trip of 1.2 s: the release runs, its answer is lost
	h.Release()

	deadline := time.Now().Add(10 * time.Second)
	var ev []sluice.SlotEvent
	for {
		ev = obs.events()
		if len(ev) >= 3 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // an expiry reported with the retry's answer
	ev = obs.events()
	if len(ev) != 3 {
		t.Fatalf("events %+v; want the acquire, the failed release and the retry's", ev)
	}
	if e := ev[1]; e.Op != sluice.SlotRelease || e.Outcome != sluice.OutcomeError {
		t.Fatalf("first release %+v, want a failed one (the delay did not cut it)", e)
	}
	if e := ev[2]; e.Op != sluice.SlotRelease || e.Outcome != sluice.OutcomeAllowed || !e.Again || e.Weight != 1 {
		t.Errorf("the retry's answer reported as %+v; want a release freed before (Again), of weight 1", e)
	}
}

// A retried release answered not held once the hold may have passed (sure,
// the hold from its acquire's sending, is past) is still an expiry: the
// store may have freed it at its hold timeout.
func TestRetriedReleaseAfterHoldIsExpiry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	obs := &fullSlotEvents{}
	rs := observedRules(t, store, obs, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(10, time.Minute), Key: ident})
	slot, d, err := sluice.AcquireSlot(ctx, store, "k", sluice.Concurrent(10, time.Minute), 1)
	if err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	if _, err := store.Release(ctx, "k", slot.Holder()); err != nil { // freed, as if at its hold timeout
		t.Fatal(err)
	}
	sh := &slotHold{name: "one", slot: slot, weight: 1, state: new(atomic.Int32)}
	sh.until.Store(rs.env.now() + int64(time.Minute))
	sh.sure.Store(rs.env.now() - int64(time.Millisecond))
	h := &Held{ctx: ctx, env: rs.env, priority: sluice.PriorityCritical}
	if !h.retryRelease(sh, errors.New("lost")) {
		t.Fatal("not sent again")
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(obs.events()) < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	ev := obs.events()
	if len(ev) != 2 || ev[0].Op != sluice.SlotRelease || ev[0].Outcome != sluice.OutcomeDenied || ev[1].Op != sluice.SlotExpire {
		t.Errorf("events %+v; want a release not held and an expiry", ev)
	}
}
