package enforce

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/timercount"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// slotEvents records slot events as "op/outcome".
type slotEvents struct {
	mu sync.Mutex
	ev []string
}

func (e *slotEvents) ObserveDecision(sluice.DecisionEvent) {}
func (e *slotEvents) ObserveStore(sluice.StoreEvent)       {}
func (e *slotEvents) ObserveBreaker(sluice.BreakerEvent)   {}
func (e *slotEvents) ObserveSlot(ev sluice.SlotEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ev = append(e.ev, ev.Op.String()+"/"+ev.Outcome.String())
}

func (e *slotEvents) String() string {
	e.mu.Lock()
	defer e.mu.Unlock()
	return strings.Join(e.ev, " ")
}

func (e *slotEvents) count(what string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.ev {
		if ev == what {
			n++
		}
	}
	return n
}

func observedRules(t *testing.T, store sluice.Store, obs sluice.Observer, spec SlotSpec[string]) *SlotRules[string] {
	t.Helper()
	rs, err := NewSlotRules(store, []SlotSpec[string]{spec}, "p:", nil, obs, errNoKey, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// A request that ends within a third of its hold costs no extend; one
// that runs longer is extended about every third of it, and keeps its
// slot past the hold.
func TestKeepExtendsLongRequestsOnly(t *testing.T) {
	t.Parallel()
	const hold = 300 * time.Millisecond
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	obs := &slotEvents{}
	rs := observedRules(t, store, obs, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(1, hold), Key: ident})
	for range 20 {
		h, v, err := rs.Acquire(context.Background(), "k", sluice.PriorityCritical)
		if err != nil || !v.Allowed {
			t.Fatal(v, err)
		}
		time.Sleep(hold / 20)
		h.Release()
	}
	time.Sleep(hold / 2)
	if n := obs.count("extend/allowed"); n != 0 {
		t.Errorf("%d extends for requests shorter than a third of the hold, want none", n)
	}
	h, v, err := rs.Acquire(context.Background(), "k", sluice.PriorityCritical)
	if err != nil || !v.Allowed {
		t.Fatal(v, err)
	}
	time.Sleep(hold * 5 / 2)
	if _, v, err := rs.Acquire(context.Background(), "k", sluice.PriorityCritical); err != nil || v.Allowed {
		t.Errorf("another request 2.5 holds in: %+v %v, want refused", v, err)
	}
	h.Release()
	if n := obs.count("extend/allowed"); n < 2 || n > 11 {
		t.Errorf("%d extends over 2.5 holds, want about 7 to 10 (one every 1/4 to 1/3 hold)", n)
	}
	if n := obs.count("expire/allowed"); n != 0 {
		t.Errorf("%d expiries reported for a slot extended all along", n)
	}
	time.Sleep(hold / 2)
	if n := obs.count("extend/allowed") + obs.count("extend/denied"); n > 11 {
		t.Errorf("extends went on after the release: %d", n)
	}
}

// An extend that fails (Redis down) is reported and tried again at the
// next round: with Redis back before the slot's hold passed, the slot is
// still held.
func TestKeepRetriesFailedExtend(t *testing.T) {
	t.Parallel()
	const hold = 2 * time.Second
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always") // the slot survives a restart
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})         // an extend fails as Redis is down
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	obs := &slotEvents{}
	rs := observedRules(t, store, obs, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(1, hold), Key: ident})
	start := time.Now()
	h, v, err := rs.Acquire(context.Background(), "k", sluice.PriorityCritical)
	if err != nil || !v.Allowed {
		t.Fatal(v, err)
	}
	defer h.Release()
	await := func(what string) {
		t.Helper()
		for end := time.Now().Add(hold); obs.count(what) == 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("no %s within a hold: %s", what, obs)
			}
		}
	}
	await("extend/allowed")
	srv.Stop() // within a third of a hold of the extend: the next round fails
	await("extend/error")
	srv.Start(t)
	time.Sleep(time.Until(start.Add(hold * 5 / 2)))
	if n := obs.count("extend/allowed"); n < 2 {
		t.Errorf("events %s: want extends after the failed one", obs)
	}
	if _, v, err := rs.Acquire(context.Background(), "k", sluice.PriorityCritical); err != nil || v.Allowed {
		t.Errorf("another request 2.5 holds in, after an extend failed: %+v %v, want refused", v, err)
	}
}

// A slot an extend finds lost is reported (an extend not held, an expiry)
// and logged once, and not extended again; the request goes on.
func TestKeepLostSlot(t *testing.T) {
	t.Parallel()
	const hold = 150 * time.Millisecond
	clk := storetest.NewClock(time.Now())
	store := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	obs := &slotEvents{}
	rs := observedRules(t, store, obs, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(1, hold), Key: ident})
	var logs logtest.Log
	rs.SetLogger(logs.TextLogger())
	h, v, err := rs.Acquire(context.Background(), "k", sluice.PriorityCritical)
	if err != nil || !v.Allowed {
		t.Fatal(v, err)
	}
	clk.Advance(hold * 2) // on the store's clock the hold has passed
	time.Sleep(hold * 2)
	h.Release()
	if got := obs.String(); got != "acquire/allowed extend/denied expire/allowed release/allowed" {
		t.Errorf("events %q", got)
	}
	if out := logs.String(); strings.Count(out, "slot lost") != 1 || !strings.Contains(out, "rule=one") {
		t.Errorf("log %q: want one line naming the rule", out)
	}
}

// A held request arms no timer of its own: one timer per SlotRules starts
// every request's extends and reports every slot's expiry. (Before, each
// arms one for its extends and, observed, one per slot for its expiry.)
func TestKeepArmsNoTimerPerRequest(t *testing.T) {
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	rs := observedRules(t, store, &slotEvents{}, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(1, time.Minute), Key: ident})
	warm, _, err := rs.Acquire(context.Background(), "warm", sluice.PriorityCritical) // once-only timers: the rules', crypto/rand's
	if err != nil {
		t.Fatal(err)
	}
	warm.Release()
	const n = 100
	held := make([]*Held, 0, n)
	defer func() {
		for _, h := range held {
			h.Release()
		}
	}()
	timers := timercount.Of(func() {
		for i := range n {
			h, v, err := rs.Acquire(context.Background(), fmt.Sprint(i), sluice.PriorityCritical)
			if err != nil || !v.Allowed {
				t.Fatal(v, err)
			}
			held = append(held, h)
		}
	})
	if timers != 0 {
		t.Errorf("%d timers armed for %d held requests, want none", timers, n)
	}
}

// Many requests held at once are each extended while they run (past their
// hold), their slots reported expired never, and none is extended after
// its release.
func TestKeepManyHeld(t *testing.T) {
	t.Parallel()
	const hold, n = 300 * time.Millisecond, 50
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	obs := &slotEvents{}
	rs := observedRules(t, store, obs, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(1, hold), Key: ident})
	held := make([]*Held, n)
	for i := range held {
		h, v, err := rs.Acquire(context.Background(), fmt.Sprint(i), sluice.PriorityCritical)
		if err != nil || !v.Allowed {
			t.Fatal(v, err)
		}
		held[i] = h
	}
	time.Sleep(hold * 5 / 2)
	for i := range held {
		if _, v, err := rs.Acquire(context.Background(), fmt.Sprint(i), sluice.PriorityCritical); err != nil || v.Allowed {
			t.Fatalf("another request for key %d 2.5 holds in: %+v %v, want refused", i, v, err)
		}
	}
	for _, h := range held {
		h.Release()
	}
	extends := obs.count("extend/allowed")
	if extends < 5*n {
		t.Errorf("%d extends of %d requests over 2.5 holds, want at least %d", extends, n, 5*n)
	}
	if e := obs.count("expire/allowed"); e != 0 {
		t.Errorf("%d expiries reported of slots extended all along", e)
	}
	time.Sleep(hold)
	if got := obs.count("extend/allowed") + obs.count("extend/denied") + obs.count("extend/error"); got != extends {
		t.Errorf("%d extends after the releases", got-extends)
	}
}

// A slot whose extends fail (Redis down) is reported expired once its
// hold passes, not before (even while a round of extends waits on the
// store), and once only.
func TestKeepReportsExpiry(t *testing.T) {
	t.Parallel()
	const hold = 400 * time.Millisecond
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	obs := &slotEvents{}
	rs := observedRules(t, store, obs, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(1, hold), Key: ident})
	h, v, err := rs.Acquire(context.Background(), "k", sluice.PriorityCritical)
	if err != nil || !v.Allowed {
		t.Fatal(v, err)
	}
	start := time.Now()
	srv.Stop()
	for obs.count("expire/allowed") == 0 {
		if time.Since(start) > 3*hold {
			t.Fatalf("no expiry 3 holds in: %s", obs)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d := time.Since(start); d < hold*3/4 {
		t.Errorf("expiry reported %v in, before the %v hold passed", d, hold)
	}
	h.Release()
	time.Sleep(hold)
	if n := obs.count("expire/allowed"); n != 1 {
		t.Errorf("%d expiries reported, want 1: %s", n, obs)
	}
}
