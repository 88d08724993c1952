package server

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

func TestSlotNotes(t *testing.T) {
	slot := slotID{holder: "0123456789abcdef0123456789abcdef", policy: "jobs", key: "a b.c"}
	for _, n := range []slotNote{{slot: slot}, {slot: slot, hold: 1500 * time.Millisecond}, {slot: slot, open: true}, {slot: slot, hold: time.Second, open: true}} {
		if got, ok := parseNote(n.String()); !ok || got != n {
			t.Errorf("parseNote(%q) = %+v, %v; want %+v", n.String(), got, ok, n)
		}
	}
	const h = "0123456789abcdef0123456789abcdef.am9icw.YQ"
	for _, bad := range []string{"", "r", "x " + h, "e " + h, "e " + h + " 0", "e " + h + " -5", "e " + h + " x", "r " + h + " extra",
		"r " + h + " o o", "e " + h + " o", "x " + h + " o",
		// A holder alone (an older instance's note), a token's member or
		// open mark: not a slot.
		"r 0123456789abcdef0123456789abcdef", "r " + h + ".-", "r " + h + ".bQ"} {
		if n, ok := parseNote(bad); ok {
			t.Errorf("parseNote(%q) = %+v, want refused", bad, n)
		}
	}
}

// An instance's figures keep open grants apart from the store's slots: a
// call or a note about an open grant never moves a store slot's figures,
// and the reverse.
func TestHeldSlotsOpenApart(t *testing.T) {
	_, svc, _ := newSlotsService(t)
	h := svc.holds
	now := svc.clock()
	until := now.Add(time.Minute)
	stored, grant := slotID{holder: "real", policy: "exports", key: "k"}, slotID{holder: "open", policy: "exports", key: "k"}
	h.add(stored, heldSlot{weight: 2, until: until})
	h.add(grant, heldSlot{weight: 1, until: until, open: true, storeHolder: "s"})
	if h.extend(stored, true, now, time.Minute) || h.extend(grant, false, now, time.Minute) {
		t.Error("extend of a slot as the other kind counted it")
	}
	if got := h.release(stored, true); got.weight != 0 {
		t.Errorf("open release of a store slot released %+v", got)
	}
	if got := h.release(grant, false); got.weight != 0 {
		t.Errorf("store release of an open grant released %+v", got)
	}
	h.drop(stored, true)
	h.drop(grant, false)
	if got := h.held()["exports"]; got != 3 {
		t.Fatalf("held %d after calls of the other kind, want 3", got)
	}
	if got := h.release(grant, true); got.weight != 1 || got.storeHolder != "s" {
		t.Errorf("open release of the open grant: %+v", got)
	}
	h.drop(stored, false)
	if got := h.held()["exports"]; got != 0 {
		t.Errorf("held %d, want 0", got)
	}
}

// A slot acquired through one instance and released or extended through
// another: the instance that acquired it hears of it from the fleet, and
// its held figures follow within a few note intervals instead of waiting
// for the hold timeout.
func TestFleetSlotNotes(t *testing.T) {
	t.Run("standalone", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr})
		t.Cleanup(func() { c.Close() })
		testSlotNotes(t, c, true)
	})
	t.Run("cluster", func(t *testing.T) { testSlotNotes(t, redistest.ClusterClient(t), false) })
}

func testSlotNotes(t *testing.T, client redis.UniversalClient, extend bool) {
	prefix := redistest.Prefix(t)
	cfg := `
policies:
  - name: jobs
    in_flight: {max: 10, hold: 3s}
`
	svcs := make([]*Service, 2)
	for i := range svcs {
		svcs[i] = NewService(redisstore.New(client, &redisstore.Options{Prefix: prefix}), mustConfig(t, cfg), nil)
		f := NewFleet(client, svcs[i], &FleetOptions{Prefix: prefix + "fleet"})
		f.Start()
		t.Cleanup(f.Stop)
	}
	a, b := svcs[0], svcs[1]
	ctx := context.Background()
	channel := "{" + prefix + "fleet}:slots"
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err := client.PubSubNumSub(ctx, channel).Result()
		if err == nil && n[channel] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("listeners on %s: %v, %v; want 2", channel, n, err)
		}
	}
	held := func(svc *Service) int64 { return svc.holds.held()["jobs"] }
	acquire := func() string {
		t.Helper()
		res, err := a.Acquire(ctx, "jobs", "k", 3, sluice.PriorityCritical)
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("acquire: %+v, %v", res.Decision, err)
		}
		return res.Token
	}

	// Released through b: a stops counting it long before its 3 s hold.
	tok := acquire()
	if got := held(a); got != 3 {
		t.Fatalf("a holds %d, want 3", got)
	}
	start := time.Now()
	if err := b.Release(ctx, tok); err != nil {
		t.Fatal(err)
	}
	for held(a) != 0 {
		if time.Since(start) > 2*time.Second {
			t.Fatalf("a still counts the slot b released %v ago", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("a dropped the slot %v after b released it", time.Since(start))
	if held(b) != 0 {
		t.Errorf("b holds %d, want 0", held(b))
	}

	// Extended through b: a keeps counting it past its first timeout.
	if !extend || race.Enabled {
		return // the rest times a hold
	}
	tok = acquire()
	time.Sleep(2 * time.Second)
	if _, err := b.Extend(ctx, tok); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond) // past the acquire's 3 s, within the extend's
	if got := held(a); got != 3 {
		t.Errorf("3.5 s after the acquire, 1.5 s after b extended it: a holds %d, want 3", got)
	}
	if err := b.Release(ctx, tok); err != nil {
		t.Fatal(err)
	}
}

// Two `sluice serve` processes on one Redis behind a load balancer: a
// slot acquired through one and released through the other leaves the
// fleet's held figure within a few publishing rounds, not after its hold.
func TestFleetSlotsReleasedElsewhere(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	cfg := writeConfig(t, "policies:\n  - name: jobs\n    in_flight: {max: 10, hold: 60s}\n")
	env := []string{"SLUICE_HTTP_ADDR=127.0.0.1:0", "SLUICE_GRPC_ADDR=127.0.0.1:0", "SLUICE_REDIS_URL=redis://" + r.Addr + "/0"}
	a, b := startSluice(t, env, "--config", cfg), startSluice(t, env, "--config", cfg)
	held := func(p *proc) (int64, int) {
		t.Helper()
		_, body := p.get(t, "/v1/stats")
		var st struct{ Overview Overview }
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("stats %q: %v", body, err)
		}
		for _, pol := range st.Overview.Policies {
			if pol.Policy == "jobs" {
				return pol.Held, st.Overview.Instances
			}
		}
		return 0, st.Overview.Instances
	}
	await := func(what string, want int64) time.Duration {
		t.Helper()
		start := time.Now()
		for deadline := start.Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			ha, na := held(a)
			hb, nb := held(b)
			if ha == want && hb == want && na == 2 && nb == 2 {
				return time.Since(start)
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: held %d and %d over %d and %d instances, want %d over 2", what, ha, hb, na, nb, want)
			}
		}
	}
	await("before", 0)
	// Listening starts with serving; a note sent before b listens would be
	// lost, so wait for both listeners.
	awaitSlotListeners(t, r.Client(t), 2)
	code, body := a.post(t, "/v1/acquire", `{"policy":"jobs","key":"k","weight":4}`)
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, body)
	}
	t.Logf("acquired: the fleet shows it after %v", await("acquired through a", 4))
	if code, _ := b.post(t, "/v1/release", tokenBody(body["token"])); code != 204 {
		t.Fatalf("release through b: %d", code)
	}
	t.Logf("released through b: the fleet drops it after %v (the hold is 60 s)", await("released through b", 0))
}

// TestSlotsNotHeldDropped: slots the store lost (a Redis restart without
// persistence; here their key deleted) are counted no more once a release
// or an extend of them answers not held: at once through the instance that
// acquired them, within a few note intervals through another one. Before,
// the acquiring instance counted them, sluice_inflight_held included, until
// their hold passed (up to 24 h).
func TestSlotsNotHeldDropped(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr})
	t.Cleanup(func() { c.Close() })
	prefix := redistest.Prefix(t)
	ctx := context.Background()
	cfg := "policies:\n  - name: jobs\n    in_flight: {max: 10, hold: 1h}\n"
	svcs, ms := make([]*Service, 2), make([]*Metrics, 2)
	for i := range svcs {
		ms[i] = NewMetrics()
		svcs[i] = NewService(redisstore.New(c, &redisstore.Options{Prefix: prefix}), mustConfig(t, cfg), &ServiceOptions{Metrics: ms[i]})
		f := NewFleet(c, svcs[i], &FleetOptions{Prefix: prefix + "fleet"})
		f.Start()
		t.Cleanup(f.Stop)
	}
	a, b := svcs[0], svcs[1]
	channel := "{" + prefix + "fleet}:slots"
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if n, err := c.PubSubNumSub(ctx, channel).Result(); err == nil && n[channel] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("listeners on %s: want 2", channel)
		}
	}
	gauge := func() float64 {
		return metricValue(t, ms[0].Registry(), "sluice_inflight_held", map[string]string{"policy": "jobs"})
	}
	var tokens []string
	for range 3 {
		res, err := a.Acquire(ctx, "jobs", "k", 2, sluice.PriorityCritical)
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("acquire: %+v, %v", res.Decision, err)
		}
		tokens = append(tokens, res.Token)
	}
	keys, err := c.Keys(ctx, prefix+"*:if2").Result()
	if err != nil || len(keys) != 1 {
		t.Fatalf("in-flight keys: %v, %v", keys, err)
	}
	c.Del(ctx, keys...)
	if err := a.Release(ctx, tokens[0]); !errors.Is(err, ErrSlotNotHeld) {
		t.Fatalf("release of a lost slot: %v, want ErrSlotNotHeld", err)
	}
	if got := gauge(); got != 4 {
		t.Errorf("held after the release of a lost slot through a: %v, want 4", got)
	}
	if _, err := a.Extend(ctx, tokens[1]); !errors.Is(err, ErrSlotNotHeld) {
		t.Fatalf("extend of a lost slot: %v, want ErrSlotNotHeld", err)
	}
	if got := gauge(); got != 2 {
		t.Errorf("held after the extend of a lost slot through a: %v, want 2", got)
	}
	if err := b.Release(ctx, tokens[2]); !errors.Is(err, ErrSlotNotHeld) {
		t.Fatalf("release of a lost slot through b: %v, want ErrSlotNotHeld", err)
	}
	for deadline := time.Now().Add(2 * time.Second); gauge() != 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("held 2 s after the release of a lost slot through b: %v, want 0", gauge())
		}
	}
}

// A 404 for a token nobody here acquired (a forged one, as likely as a
// slot the store lost) is told to the fleet only while the note queue is
// at most half full, so that such tokens never push out the notes of real
// releases and extends.
func TestSlotsNotHeldNotesBounded(t *testing.T) {
	_, svc, _ := newSlotsService(t)
	svc.notes = make(chan slotNote, noteQueue) // no relay drains it
	ctx := context.Background()
	for range noteQueue {
		tok := slotToken{holder: sluice.NewHolderID(), policy: "exports", key: "ann"}
		if err := svc.Release(ctx, tok.String()); !errors.Is(err, ErrSlotNotHeld) {
			t.Fatalf("release of a forged token: %v, want ErrSlotNotHeld", err)
		}
	}
	if got := len(svc.notes); got != noteQueue/2+1 {
		t.Fatalf("notes queued for %d forged tokens: %d, want %d", noteQueue, got, noteQueue/2+1)
	}
}

// TestReleasesRememberedBounded: a release is remembered for the policy's
// hold, at most rememberRelease, on Redis as in memory. With hold 24h,
// 100 releases a second kept 8.6 million records (about 1.1 GB) in one key;
// now 30,000 at most. A release sent again within the bound is 204
// (released before); after it, 404, as after the hold of a shorter one.
func TestReleasesRememberedBounded(t *testing.T) {
	cfg := "policies:\n  - name: jobs\n    in_flight: {max: 10, hold: 24h}\n"
	t.Run("redis", func(t *testing.T) {
		c := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr})
		t.Cleanup(func() { c.Close() })
		prefix := redistest.Prefix(t)
		ctx := context.Background()
		svc := NewService(redisstore.New(c, &redisstore.Options{Prefix: prefix}), mustConfig(t, cfg), nil)
		for range 3 {
			res, err := svc.Acquire(ctx, "jobs", "k", 1, sluice.PriorityCritical)
			if err != nil || !res.Decision.Allowed {
				t.Fatalf("acquire: %+v, %v", res.Decision, err)
			}
			if err := svc.Release(ctx, res.Token); err != nil {
				t.Fatal(err)
			}
		}
		keys, err := c.Keys(ctx, prefix+"*:if2r").Result()
		if err != nil || len(keys) != 1 {
			t.Fatalf("release records: %v, %v; want one key", keys, err)
		}
		now, err := c.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		until := now.Add(rememberRelease).UnixMicro()
		recs, err := c.ZRangeWithScores(ctx, keys[0], 0, -1).Result()
		if err != nil || len(recs) != 3 {
			t.Fatalf("release records: %v, %v; want 3", recs, err)
		}
		for _, r := range recs {
			if int64(r.Score) > until {
				t.Errorf("a release is remembered until %v, more than %v from now", time.UnixMicro(int64(r.Score)), rememberRelease)
			}
		}
		if ttl := c.PTTL(ctx, keys[0]).Val(); ttl > rememberRelease+time.Second {
			t.Errorf("the records' key expires in %v, want at most %v", ttl, rememberRelease)
		}
	})
	t.Run("memory", func(t *testing.T) {
		clock := newFakeClock()
		store := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
		t.Cleanup(func() { store.Close() })
		svc := NewService(store, mustConfig(t, cfg), &ServiceOptions{Clock: clock.Now})
		ctx := context.Background()
		res, err := svc.Acquire(ctx, "jobs", "k", 1, sluice.PriorityCritical)
		if err != nil || !res.Decision.Allowed {
			t.Fatalf("acquire: %+v, %v", res.Decision, err)
		}
		if err := svc.Release(ctx, res.Token); err != nil {
			t.Fatal(err)
		}
		clock.Set(t0.Add(rememberRelease - time.Second))
		if err := svc.Release(ctx, res.Token); err != nil {
			t.Errorf("released again within the bound: %v, want released before", err)
		}
		clock.Set(t0.Add(2*rememberRelease + time.Second)) // the second release renewed the record
		if err := svc.Release(ctx, res.Token); !errors.Is(err, ErrSlotNotHeld) {
			t.Errorf("released again past the bound: %v, want ErrSlotNotHeld", err)
		}
	})
}

// awaitSlotListeners waits until want instances listen for the fleet's
// slot notes: a note sent before one listens is lost to it.
func awaitSlotListeners(t *testing.T, c *redis.Client, want int64) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, _ := c.PubSubNumSub(context.Background(), "{sluice:fleet}:slots").Result()
		if n["{sluice:fleet}:slots"] == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("listeners: %v, want %d", n, want)
		}
	}
}
