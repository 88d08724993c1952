package enforce

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
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
