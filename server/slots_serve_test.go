package server

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/server/config"
)

// In-flight slots through the service's other doors: a Server on Redis,
// Envoy RLS, and a fleet's figures.

// TestFaultSlotsServeOnRedis: `sluice serve` on Redis keeps slots
// through its failure policy. With Redis stalled, an acquire costs the
// decision timeout and then the policy answers: under the default (local)
// this instance's share of max, under error a 503.
func TestFaultSlotsServeOnRedis(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	cfg := writeConfig(t, slotsConfig)
	local := "http://" + runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", FleetSize: 1}).HTTPAddr()
	strict := "http://" + runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", NoFailurePolicy: true}).HTTPAddr()
	code, body, _ := post(t, local, "/v1/acquire", `{"policy":"exports","key":"ann","weight":10}`)
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, body)
	}
	if code, body, _ := post(t, strict, "/v1/acquire", `{"policy":"exports","key":"ann"}`); code != 429 {
		t.Errorf("acquire over max: %d %v", code, body)
	}
	if code, _, _ := post(t, strict, "/v1/release", tokenBody(body["token"])); code != 204 {
		t.Errorf("release: %d", code)
	}
	r.Pause(t)
	defer r.Stop()
	for _, c := range []struct {
		name, base string
		want       int
	}{{"local", local, 200}, {"error", strict, 503}} {
		start := time.Now()
		code, body, _ = post(t, c.base, "/v1/acquire", `{"policy":"exports","key":"ann"}`)
		took := time.Since(start)
		t.Logf("%s: acquire with Redis stalled: %d after %v", c.name, code, took)
		if code != c.want || body["shed"] != nil || took > 800*time.Millisecond {
			t.Errorf("%s: acquire with Redis stalled: %d %v after %v, want %d well within 800ms", c.name, code, body, took, c.want)
		}
	}
}

// TestFaultSlotReleaseLostAnswer: under the error failure policy, a
// release whose Redis answer times out (Redis stalled: it runs the
// release when it resumes, after the 503) is 503, and the same release
// sent again is 204, as a repeated release is: the slot is free, and the
// store remembered its release with it. The slot's full max can be
// acquired again.
func TestFaultSlotReleaseLostAnswer(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	cfg := writeConfig(t, slotsConfig)
	base := "http://" + runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", NoFailurePolicy: true}).HTTPAddr()
	code, body, _ := post(t, base, "/v1/acquire", `{"policy":"exports","key":"ann","weight":10}`)
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, body)
	}
	tok := tokenBody(body["token"])
	if code, _, _ := post(t, base, "/v1/release", tokenBody(body["token"].(string)[:32]+".ZXhwb3J0cw.Ym9i")); code != 404 {
		t.Fatalf("release of a slot never held (loads the scripts): %d, want 404", code)
	}
	r.Pause(t)
	code, body, _ = post(t, base, "/v1/release", tok)
	r.Resume(t)
	if code != 503 {
		t.Fatalf("release with Redis stalled: %d %v, want 503", code, body)
	}
	// Redis runs the release it had received as it resumes; the answer
	// was lost.
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body, _ = post(t, base, "/v1/release", tok)
		if code != 503 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != 204 {
		t.Errorf("release sent again after the 503: %d %v, want 204 (released before)", code, body)
	}
	if code, body, _ := post(t, base, "/v1/acquire", `{"policy":"exports","key":"ann","weight":10}`); code != 200 {
		t.Errorf("acquire of the whole max after the release: %d %v", code, body)
	}
}

// TestFaultSlotReleaseOnceServeLocal: `sluice serve` under the local
// failure policy remembers a release with it, wherever the slot is held.
// A Redis slot's release whose answer times out (Redis stopped: it runs
// the release when it resumes) is 503, and the same release sent again
// is 204, as a repeated release is; the slot's full max can be acquired
// again. Releases of one token racing each other are all 204, for a Redis
// slot and for one the fallback granted while Redis was stopped, and the
// latter's release sent again once Redis is back is 204 too.
func TestFaultSlotReleaseOnceServeLocal(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	p := startFleet(t, r.url(), 1, slotsConfig, "--failure-policy", "local", "--fleet-size", "1").procs[0]
	acquire := func(weight int, source string) string {
		t.Helper()
		code, body := p.post(t, "/v1/acquire", fmt.Sprintf(`{"policy":"exports","key":"ann","weight":%d,"priority":"critical"}`, weight))
		if got, _ := body["source"].(string); code != 200 || got != source {
			t.Fatalf("acquire of %d: %d %v; want 200 from %q", weight, code, body, source)
		}
		return tokenBody(body["token"])
	}
	racing := func(tok string) {
		t.Helper()
		codes := make([]int, 4)
		var wg sync.WaitGroup
		for i := range codes {
			wg.Go(func() {
				resp, err := http.Post("http://"+p.http+"/v1/release", "application/json", strings.NewReader(tok))
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				codes[i] = resp.StatusCode
			})
		}
		wg.Wait()
		for _, c := range codes {
			if c != 204 {
				t.Errorf("releases of one token racing: %v, want all 204", codes)
				break
			}
		}
	}
	tok := acquire(10, "")
	if code, _ := p.post(t, "/v1/release", `{"token":"0123456789abcdef0123456789abcdef.ZXhwb3J0cw.YW5u"}`); code != 404 {
		t.Fatalf("release of a slot never held (loads the script): %d, want 404", code)
	}
	r.Pause(t)
	code, body := p.post(t, "/v1/release", tok)
	if code != 503 {
		r.Resume(t)
		t.Fatalf("release with Redis stopped: %d %v, want 503", code, body)
	}
	fb := acquire(1, "fallback") // granted by this instance's share while Redis is away
	racing(fb)
	r.Resume(t)
	// Redis runs the release it had received as it resumes; its answer
	// was lost. The breaker may hold calls back until its next probe.
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, body = p.post(t, "/v1/release", tok)
		if code != 503 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code != 204 {
		t.Errorf("release sent again after the 503: %d %v, want 204 (released before)", code, body)
	}
	if code, body := p.post(t, "/v1/release", fb); code != 204 {
		t.Errorf("the fallback's slot released again with Redis back: %d %v, want 204", code, body)
	}
	// The acquire of fb reached Redis while it was stopped and ran as it
	// resumed, after its caller had been answered by the fallback: it
	// holds a unit until its abandoned release lands, which, when its
	// first try ran before the acquire, tries again a second later
	// (sluice.ReleaseAbandoned).
	var all string
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, body := p.post(t, "/v1/acquire", `{"policy":"exports","key":"ann","weight":10,"priority":"critical"}`)
		if got, _ := body["source"].(string); code == 200 && got == "" {
			all = tokenBody(body["token"])
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("acquire of the whole limit 3 s after Redis resumed: %d %v; want 200 from Redis", code, body)
		}
	}
	racing(all)
	if code, body := p.post(t, "/v1/release", all); code != 204 {
		t.Errorf("a released token released again: %d %v, want 204", code, body)
	}
}

// TestRLSInFlightPolicy: Envoy's API has no release, so a descriptor
// naming an in-flight policy matches nothing: OK, counted as unmatched,
// and no slot is taken.
func TestRLSInFlightPolicy(t *testing.T) {
	_, svc, m := newSlotsService(t)
	c := serveRLS(t, svc)
	for range 12 { // more than the policy's max
		for _, d := range []*rlcommon.RateLimitDescriptor{desc("user=ann"), desc("policy=exports", "user=ann")} {
			resp := call(t, c, rlsRequest(config.DefaultDomain, d))
			if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
				t.Fatalf("descriptor %v: %v, want OK with no limit", d, resp)
			}
		}
	}
	if got := metricValue(t, m.Registry(), "sluice_rls_unmatched_descriptors_total", map[string]string{"domain": config.DefaultDomain}); got != 24 {
		t.Errorf("unmatched descriptors = %v, want 24", got)
	}
	res, err := svc.Acquire(context.Background(), "exports", "ann", 10, sluice.PriorityCritical)
	if err != nil || !res.Decision.Allowed {
		t.Errorf("the whole max after the RLS calls: %+v, %v", res.Decision, err)
	}
}

// TestSlotsHeldAcrossFleet: the overview's held figure sums the slots held
// through each instance publishing to one Redis.
func TestSlotsHeldAcrossFleet(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr})
	t.Cleanup(func() { client.Close() })
	clock := newFakeClock()
	prefix := redistest.Prefix(t) + "fleet"
	a, b := newMemService(t, slotsConfig, clock), newMemService(t, slotsConfig, clock)
	fa, fb := NewFleet(client, a, &FleetOptions{Prefix: prefix}), NewFleet(client, b, &FleetOptions{Prefix: prefix})
	for svc, w := range map[*Service]int64{a: 2, b: 5} {
		if res, err := svc.Acquire(context.Background(), "exports", "ann", w, sluice.PriorityCritical); err != nil || !res.Decision.Allowed {
			t.Fatalf("acquire %d: %+v, %v", w, res.Decision, err)
		}
	}
	publish(t, fb)
	publish(t, fa)
	o := a.mon.overview(a.Stats().Snapshot())
	for _, p := range o.Policies {
		if p.Policy == "exports" && (!p.InFlight || p.Held != 7 || p.Allowed != 2) {
			t.Errorf("exports across the fleet: %+v, want in flight, 7 held, 2 acquires", p)
		}
		if p.Policy == "api" && (p.InFlight || p.Held != 0) {
			t.Errorf("the rate policy: %+v, want no held figure", p)
		}
	}
}

// TestSlotsRedisAcrossInstances: two Service instances share one real
// Redis, as a fleet behind a load balancer. A release at the instance that
// did not acquire frees the slot; a forged token frees nothing; extend
// works on either; a slot past its hold is 404.
func TestSlotsRedisAcrossInstances(t *testing.T) {
	client := redistest.Client(t)
	prefix := redistest.Prefix(t)
	cfg := `
policies:
  - name: jobs
    in_flight: {max: 2, hold: 400ms}
`
	var bases [2]string
	for i := range bases {
		store := redisstore.New(client, &redisstore.Options{Prefix: prefix})
		bases[i] = serveHTTP(t, NewService(store, mustConfig(t, cfg), nil))
	}
	acquire := func(base string) (int, map[string]any) {
		code, body, _ := post(t, base, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
		return code, body
	}
	_, a := acquire(bases[0])
	_, b := acquire(bases[1])
	if code, body := acquire(bases[0]); code != 429 {
		t.Fatalf("third acquire over max 2: %d %v", code, body)
	}
	forged := sluice.NewHolderID() + a["token"].(string)[32:]
	if code, _, _ := post(t, bases[1], "/v1/release", tokenBody(forged)); code != 404 {
		t.Errorf("forged release: %d, want 404", code)
	}
	if code, body := acquire(bases[1]); code != 429 {
		t.Errorf("after the forged release: %d %v, want still full (429)", code, body)
	}
	if code, body, _ := post(t, bases[0], "/v1/extend", tokenBody(b["token"])); code != 200 {
		t.Errorf("extend at the other instance: %d %v", code, body)
	}
	if code, _, _ := post(t, bases[1], "/v1/release", tokenBody(a["token"])); code != 204 {
		t.Errorf("release at the other instance: %d, want 204", code)
	}
	if code, _, _ := post(t, bases[0], "/v1/release", tokenBody(a["token"])); code != 204 {
		t.Errorf("repeated release at the first instance: %d, want 204", code)
	}
	code, c := acquire(bases[0])
	if code != 200 || c["in_use"] != 2.0 {
		t.Errorf("acquire after the release: %d %v, want the freed slot", code, c)
	}
	time.Sleep(600 * time.Millisecond) // past every hold
	for _, path := range []string{"/v1/extend", "/v1/release"} {
		if code, body, _ := post(t, bases[1], path, tokenBody(c["token"])); code != 404 {
			t.Errorf("%s after the hold: %d %v, want 404", path, code, body)
		}
	}
}

// TestSlotsAcquireFailurePolicyFigures: an acquire the failure policy
// answers (Redis refusing connections) reports the policy's max in limit
// and says who answered in source, so that a made-up answer can be told
// from the store's.
func TestSlotsAcquireFailurePolicyFigures(t *testing.T) {
	cfg := writeConfig(t, "policies:\n  - name: jobs\n    in_flight: {max: 4, hold: 30s}\n")
	r := redistest.StartServer(t)
	url := "redis://" + r.Addr + "/0"
	local := "http://" + runServer(t, Options{ConfigFile: cfg, RedisURL: url, FleetSize: 2}).HTTPAddr()
	closed := "http://" + runServer(t, Options{ConfigFile: cfg, RedisURL: url, FailurePolicy: resilient.FailClosed}).HTTPAddr()
	code, body, _ := post(t, local, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
	if _, ok := body["source"]; code != 200 || ok || body["limit"] != 4.0 {
		t.Errorf("Redis answering: %d %v, want 200 with limit 4 and no source", code, body)
	}
	r.Stop() // refusing connections: the failure policies answer at once
	code, body, _ = post(t, local, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
	if code != 200 || body["limit"] != 4.0 || body["in_use"] != 1.0 || body["remaining"] != 1.0 || body["source"] != "fallback" {
		t.Errorf("local fallback grant: %d %v, want 200 with limit 4, in_use 1 and remaining 1 (of the share of 2), source fallback", code, body)
	}
	code, body, _ = post(t, closed, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
	if code != 429 || body["limit"] != 4.0 || body["source"] != "fail_closed" {
		t.Errorf("closed: %d %v, want 429 with limit 4, source fail_closed", code, body)
	}
}

// TestFaultSlotReleaseRetried: a release that fails without reaching
// Redis (the breaker open after a stall, Redis back but not yet probed) is
// 503, and the service sends it again by itself once Redis answers: the
// slot's full max can be acquired again within seconds, not at its 30s
// hold timeout, though the client never resent it.
func TestFaultSlotReleaseRetried(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	cfg := writeConfig(t, slotsConfig)
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", FleetSize: 1})
	base := "http://" + srv.HTTPAddr()
	code, body, _ := post(t, base, "/v1/acquire", `{"policy":"exports","key":"ann","weight":10}`)
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, body)
	}
	tok := tokenBody(body["token"])
	r.Pause(t)
	for i := 0; !srv.health.Status().FallbackActive; i++ {
		if i > 100 {
			t.Fatal("the breaker never opened with Redis stalled")
		}
		post(t, base, "/v1/acquire", `{"policy":"exports","key":"bob"}`)
	}
	r.Resume(t)
	code, body, _ = post(t, base, "/v1/release", tok)
	if code != 503 {
		t.Fatalf("release with the breaker open: %d %v, want 503", code, body)
	}
	deadline := time.Now().Add(8 * time.Second)
	for {
		code, body, _ = post(t, base, "/v1/acquire", `{"policy":"exports","key":"ann","weight":10}`)
		if code == 200 && body["source"] != "fallback" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("8s after a release that failed (never resent by the client): acquire of the whole max %d %v, want 200 from Redis", code, body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
