package server

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFaultSlotReleaseRetriedHeld: a release whose answer was lost
// (Redis stalled: it runs the release as it resumes, after the 503),
// never resent by the client, is sent again by the service, and Redis
// answers that it was released before. The slot then leaves this
// instance's held figures (the dashboard, /v1/stats,
// sluice_inflight_held) at once, not at its hold timeout, 30 s later.
func TestFaultSlotReleaseRetriedHeld(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	cfg := writeConfig(t, slotsConfig)
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", NoFailurePolicy: true})
	base := "http://" + srv.HTTPAddr()
	code, body, _ := post(t, base, "/v1/acquire", `{"policy":"exports","key":"ann","weight":10}`)
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, body)
	}
	tok := tokenBody(body["token"])
	if code, _, _ := post(t, base, "/v1/release", tokenBody("0123456789abcdef0123456789abcdef.ZXhwb3J0cw.Ym9i")); code != 404 {
		t.Fatalf("release of a slot never held (loads the scripts): %d, want 404", code)
	}
	held := func() int64 { return srv.svc.holds.held()["exports"] }
	if n := held(); n != 10 {
		t.Fatalf("held %d after the acquire, want 10", n)
	}
	r.Pause(t)
	code, body, _ = post(t, base, "/v1/release", tok)
	r.Resume(t)
	if code != 503 {
		t.Fatalf("release with Redis stalled: %d %v, want 503", code, body)
	}
	deadline := time.Now().Add(5 * time.Second)
	for held() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("5 s after a release Redis ran (its answer lost), sent again by the service: held %d, want 0", held())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n, _ := srv.svc.pendingReleases(); n != 0 {
		t.Errorf("%d releases still sent again once Redis answered", n)
	}
}

// TestFleetSlotReleasedBeforeElsewhere: two `sluice serve` processes on
// one Redis. A slot acquired through a is released through b while Redis
// is stalled: Redis runs the release as it resumes, after b's 503, and b's
// own retry is told it was released before. b tells the fleet, as for a
// release now, so a stops counting the slot within a few rounds, not at
// its hold timeout (60 s).
func TestFleetSlotReleasedBeforeElsewhere(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	cfg := writeConfig(t, "policies:\n  - name: jobs\n    in_flight: {max: 10, hold: 60s}\n")
	env := []string{"SLUICE_HTTP_ADDR=127.0.0.1:0", "SLUICE_GRPC_ADDR=127.0.0.1:0", "SLUICE_REDIS_URL=redis://" + r.Addr + "/0"}
	a, b := startSluice(t, env, "--config", cfg, "--failure-policy", "error"), startSluice(t, env, "--config", cfg, "--failure-policy", "error")
	held := func(p *proc) int64 { return heldOn(t, p, "jobs") }
	awaitSlotListeners(t, r.Client(t), 2)
	code, body := a.post(t, "/v1/acquire", `{"policy":"jobs","key":"k","weight":4}`)
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, body)
	}
	if code, _ := b.post(t, "/v1/release", tokenBody("0123456789abcdef0123456789abcdef.am9icw.aw")); code != 404 {
		t.Fatalf("release of a slot never held through b (loads the scripts): %d, want 404", code)
	}
	r.Pause(t)
	code, _ = b.post(t, "/v1/release", tokenBody(body["token"]))
	r.Resume(t)
	if code != 503 {
		t.Fatalf("release through b with Redis stalled: %d, want 503", code)
	}
	start := time.Now()
	for held(a) != 0 {
		if time.Since(start) > 10*time.Second {
			t.Fatalf("10 s after a release through b that Redis ran (its answer lost): a counts %d held, want 0", held(a))
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("a stopped counting the slot %v after Redis resumed (its hold is 60 s)", time.Since(start))
}
