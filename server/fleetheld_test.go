package server

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// An instance that crashed leaves its last report in Redis until the
// report expires (10 s): the others count its slots no longer than their
// holds, when the store frees them, rather than until then.
func TestHeldFiguresEndAtHold(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr})
	t.Cleanup(func() { client.Close() })
	clock := newFakeClock()
	prefix := redistest.Prefix(t) + "fleet"
	const cfg = `
policies:
  - name: jobs
    in_flight: {max: 10, hold: 4s}
`
	a, b := newMemService(t, cfg, clock), newMemService(t, cfg, clock)
	fa, fb := NewFleet(client, a, &FleetOptions{Prefix: prefix}), NewFleet(client, b, &FleetOptions{Prefix: prefix})
	held := func() int64 {
		t.Helper()
		publish(t, fa)
		for _, p := range a.mon.overview(a.Stats().Snapshot()).Policies {
			if p.Policy == "jobs" {
				return p.Held
			}
		}
		t.Fatal("no jobs policy in the overview")
		return 0
	}
	acquire := func(svc *Service, w int64) {
		t.Helper()
		if res, err := svc.Acquire(context.Background(), "jobs", "ann", w, sluice.PriorityCritical); err != nil || !res.Decision.Allowed {
			t.Fatalf("acquire %d: %+v, %v", w, res.Decision, err)
		}
	}
	acquire(b, 5) // held until t0+4s
	clock.Advance(3 * time.Second)
	acquire(b, 1)  // until t0+7s
	acquire(a, 2)  // until t0+7s
	publish(t, fb) // b's last report: b crashes
	if n := held(); n != 8 {
		t.Fatalf("held %d at t0+3s, want 8", n)
	}
	clock.Advance(2 * time.Second) // t0+5s: b's report is fresh, its weight 5 freed
	if n := held(); n != 3 {
		t.Errorf("held %d at t0+5s, after the hold of b's weight 5, want 3", n)
	}
	clock.Advance(3 * time.Second) // t0+8s: every hold has passed
	if n := held(); n != 0 {
		t.Errorf("held %d at t0+8s, after every hold, want 0", n)
	}
}

// heldOn returns the weight instance p counts held under policy
// (/v1/stats), 0 when it lists none.
func heldOn(t *testing.T, p *proc, policy string) int64 {
	t.Helper()
	_, body := p.get(t, "/v1/stats")
	var st struct{ Overview Overview }
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		t.Fatalf("stats %q: %v", body, err)
	}
	for _, pol := range st.Overview.Policies {
		if pol.Policy == policy {
			return pol.Held
		}
	}
	return 0
}

// TestFleetHeldOtherKey: two `sluice serve` processes on one Redis. A
// release or extend whose token names a held slot's holder beside another
// key frees and extends nothing (404), through the instance that acquired
// the slot or through the other, and moves nothing in the held figures.
// Before, the figures were keyed by the holder alone: the 404 dropped the
// real slot from them (at once, or through the other instance's note)
// while Redis still held it.
func TestFleetHeldOtherKey(t *testing.T) {
	r := redistest.StartServer(t)
	cfg := writeConfig(t, "policies:\n  - name: jobs\n    in_flight: {max: 10, hold: 60s}\n  - name: jobs2\n    in_flight: {max: 10, hold: 60s}\n")
	env := []string{"SLUICE_HTTP_ADDR=127.0.0.1:0", "SLUICE_GRPC_ADDR=127.0.0.1:0", "SLUICE_REDIS_URL=redis://" + r.Addr + "/0"}
	a, b := startSluice(t, env, "--config", cfg, "--failure-policy", "error"), startSluice(t, env, "--config", cfg, "--failure-policy", "error")
	awaitSlotListeners(t, r.Client(t), 2)
	code, body := a.post(t, "/v1/acquire", `{"policy":"jobs","key":"ann","weight":4}`)
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, body)
	}
	tok := body["token"].(string)
	holder := strings.Split(tok, ".")[0]
	for _, via := range []struct {
		name string
		p    *proc
	}{{"b", b}, {"a", a}} {
		for _, other := range []slotToken{{holder: holder, policy: "jobs", key: "bob"}, {holder: holder, policy: "jobs2", key: "ann"}} {
			for _, path := range []string{"/v1/release", "/v1/extend"} {
				if code, body := via.p.post(t, path, tokenBody(other.String())); code != 404 {
					t.Fatalf("%s of %s through %s: %d %v, want 404", path, other, via.name, code, body)
				}
			}
		}
		time.Sleep(5 * noteEvery) // b's notes, had it sent any
		if n := heldOn(t, a, "jobs"); n != 4 {
			t.Errorf("a counts %d held after calls through %s naming its slot's holder beside other keys, want 4 (the slot is held)", n, via.name)
		}
	}
	// The real token through b: its note reaches a.
	if code, body := b.post(t, "/v1/release", tokenBody(tok)); code != 204 {
		t.Fatalf("release through b: %d %v", code, body)
	}
	for deadline := time.Now().Add(5 * time.Second); heldOn(t, a, "jobs") != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a counts %d held 5 s after the release through b, want 0", heldOn(t, a, "jobs"))
		}
	}
}
