//go:build unix

package server

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
)

// TestFleetFallbackSlotElsewhere: two `sluice serve` processes on one
// Redis under the local failure policy. A slot one of them granted from
// its fallback while Redis was stalled is held in its memory only: while
// Redis stays away the other answers a release or extend of it with a 503
// naming the granting instance; once Redis is back the other passes the
// call on and answers as the granting instance does, never 404 for a
// live slot.
func TestFleetFallbackSlotElsewhere(t *testing.T) {
	race.SkipTiming(t)
	r, f := jobsFleet(t)
	a, b := f.procs[0], f.procs[1]
	listening(t, r, 2)
	call := func(p *proc, path, token string) (int, map[string]any, http.Header) {
		t.Helper()
		return post(t, "http://"+p.http, path, tokenBody(token))
	}
	held := func(p *proc) float64 { return metric(t, p, `sluice_inflight_held{policy="jobs"}`) }

	r.pause(t)
	code, body := a.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
	if code != 200 || body["source"] != "fallback" {
		r.resume(t)
		t.Fatalf("acquire with Redis stalled: %d %v, want a fallback grant", code, body)
	}
	token := body["token"].(string)
	parts := strings.Split(token, ".")
	member, err := base64.RawURLEncoding.DecodeString(parts[len(parts)-1])
	if len(parts) != 4 || err != nil {
		r.resume(t)
		t.Fatalf("fallback token %q: want a fourth part naming the granting instance", token)
	}
	for _, path := range []string{"/v1/extend", "/v1/release"} {
		code, body, h := call(b, path, token)
		if detail, _ := body["detail"].(string); code != 503 || h.Get("Retry-After") == "" || !strings.Contains(detail, string(member)) {
			t.Errorf("%s at the other instance, Redis stalled: %d %v (Retry-After %q); want 503 naming instance %s, with Retry-After", path, code, body, h.Get("Retry-After"), member)
		}
	}
	r.resume(t)

	// Redis back: b passes the calls on to a, which holds the slot.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body, _ := call(b, "/v1/extend", token)
		if code == 200 && body["hold_ms"] == 30000.0 {
			break
		}
		if code != 503 || time.Now().After(deadline) {
			t.Fatalf("extend at the other instance, Redis back: %d %v; want 200 with hold_ms 30000", code, body)
		}
	}
	if got := held(a); got != 1 {
		t.Errorf("the granting instance holds %v after the extend, want 1", got)
	}
	if code, body, _ := call(b, "/v1/release", token); code != 204 {
		t.Fatalf("release at the other instance, Redis back: %d %v; want 204", code, body)
	}
	if got := held(a); got != 0 {
		t.Errorf("the granting instance holds %v after the release, want 0", got)
	}
	code, body, _ = call(b, "/v1/extend", token)
	if code != 404 {
		t.Errorf("extend of the released slot at the other instance: %d %v; want 404", code, body)
	}
	// The whole max is free again: the fallback share no longer holds it.
	for i := range 4 {
		if code, body := b.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`); code != 200 {
			js, _ := json.Marshal(body)
			t.Fatalf("acquire %d after the release: %d %s", i, code, js)
		}
	}
}

// TestFleetFailOpenSlotAnyInstance: two `sluice serve` processes on one
// Redis under the open failure policy. A slot it granted while Redis was
// stalled holds nothing, anywhere: either instance answers its extend
// (200, the policy's hold) and release (204, again and again) at once,
// while Redis is away and once it is back, without asking Redis (the
// other instance makes no store call for them; before, it asked Redis and
// answered 503, then 404 "not held").
func TestFleetFailOpenSlotAnyInstance(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	f := startFleet(t, r.url(), 2, `
policies:
  - name: jobs
    in_flight: {max: 4, hold: 30s}
`, "--failure-policy", "open")
	a, b := f.procs[0], f.procs[1]
	call := func(p *proc, path, token string) (int, map[string]any) { return slotCall(t, p, path, token) }
	r.pause(t)
	code, body := a.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
	if code != 200 || body["source"] != "fail_open" {
		r.resume(t)
		t.Fatalf("acquire with Redis stalled: %d %v, want a fail_open grant", code, body)
	}
	token := body["token"].(string)
	if !strings.HasSuffix(token, ".-") || strings.Count(token, ".") != 3 {
		t.Errorf("fail_open token %q: want a fourth part -", token)
	}
	check := func(when string) {
		t.Helper()
		for _, p := range []*proc{b, a} {
			if code, body := call(p, "/v1/extend", token); code != 200 || body["hold_ms"] != 30000.0 {
				t.Errorf("%s: extend: %d %v, want 200 with hold_ms 30000", when, code, body)
			}
			for range 2 {
				if code, body := call(p, "/v1/release", token); code != 204 {
					t.Errorf("%s: release: %d %v, want 204", when, code, body)
				}
			}
		}
	}
	check("Redis stalled")
	r.resume(t)
	check("Redis back")
	_, metrics := b.get(t, "/metrics")
	for line := range strings.Lines(metrics) {
		if strings.HasPrefix(line, "sluice_store_calls_total{") && (strings.Contains(line, `op="extend"`) || strings.Contains(line, `op="release"`)) {
			t.Errorf("the other instance called the store for a fail_open slot: %s", strings.TrimSpace(line))
		}
	}
}

// TestFleetFailOpenMarkedStoreToken: under the open failure policy, the
// holder of a slot Redis granted appends the open mark ".-" to its token.
// Every instance answers 404 (not held), the one that acquired it and the
// other, and nothing moves: Redis keeps the slot, and the acquiring
// instance's sluice_inflight_held keeps counting it (before, each answered
// 204 or 200, and the acquiring instance dropped the slot from its figures,
// told by the other through a fleet note).
func TestFleetFailOpenMarkedStoreToken(t *testing.T) {
	race.SkipTiming(t)
	r, f := jobsFleet(t, "--failure-policy", "open")
	a, b := f.procs[0], f.procs[1]
	listening(t, r, 2) // so that a note a sent would reach b
	held := func(p *proc) float64 { return metric(t, p, `sluice_inflight_held{policy="jobs"}`) }
	var tokens []string
	for i := range 2 {
		code, body := b.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
		if code != 200 || body["source"] != nil {
			t.Fatalf("acquire %d: %d %v, want a grant by Redis", i, code, body)
		}
		tokens = append(tokens, body["token"].(string))
	}
	for _, p := range []*proc{a, b} {
		for _, path := range []string{"/v1/release", "/v1/extend"} {
			for _, tok := range tokens {
				if code, body := slotCall(t, p, path, tok+".-"); code != 404 {
					t.Errorf("%s of a Redis grant's token marked open at %s: %d %v, want 404", path, p.http, code, body)
				}
			}
		}
	}
	time.Sleep(5 * noteEvery) // any note sent has reached b
	if got := held(b); got != 2 {
		t.Errorf("the acquiring instance holds %v after the marked calls, want 2", got)
	}
	// Redis still holds both: two more fill max (4), the next is denied.
	for i := range 2 {
		if code, body := a.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`); code != 200 {
			t.Fatalf("acquire %d of the 2 left: %d %v", i, code, body)
		}
	}
	if code, body := a.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`); code != 429 {
		t.Errorf("acquire past max: %d %v, want 429", code, body)
	}
	for _, tok := range tokens {
		if code, body := slotCall(t, a, "/v1/release", tok); code != 204 {
			t.Errorf("release of the real token: %d %v, want 204", code, body)
		}
	}
	for deadline := time.Now().Add(2 * time.Second); held(b) != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the acquiring instance holds %v after the real releases elsewhere, want 0", held(b))
		}
	}
}

// TestFleetFallbackForwardLateIgnored: a release passed on to the granting
// instance while Redis is stalled is answered 503 when the wait ends;
// Redis delivers the queued message once it resumes, and the granting
// instance must not carry it out then (it released the slot, so that its
// extend answered 404). Same for an extend.
func TestFleetFallbackForwardLateIgnored(t *testing.T) {
	race.SkipTiming(t)
	r, f := jobsFleet(t)
	a, b := f.procs[0], f.procs[1]
	listening(t, r, 2)
	call := func(p *proc, path, token string) (int, map[string]any) { return slotCall(t, p, path, token) }
	token := stalledGrant(t, r, a)
	// Forwarding works once Redis is back.
	extendedElsewhere(t, b, token, "Redis back")
	late := metric(t, a, "sluice_fleet_slot_calls_late_total")
	// Stalled again: b's release and extend are passed on, and wait in
	// Redis's queue past b's wait.
	r.pause(t)
	for _, path := range []string{"/v1/release", "/v1/extend"} {
		if code, body := call(b, path, token); code != 503 {
			r.resume(t)
			t.Fatalf("%s at the other instance, Redis just stalled: %d %v; want 503", path, code, body)
		}
	}
	r.resume(t)
	time.Sleep(time.Second) // for the queued messages to reach a
	if code, body := call(a, "/v1/extend", token); code != 200 || body["hold_ms"] != 30000.0 {
		t.Errorf("extend at the granting instance after the 503s: %d %v; want 200 (a call delivered after its 503 is not carried out)", code, body)
	}
	if got := metric(t, a, `sluice_inflight_held{policy="jobs"}`); got != 1 {
		t.Errorf("the granting instance holds %v, want 1", got)
	}
	if got := metric(t, a, "sluice_fleet_slot_calls_late_total"); got < late+1 {
		t.Errorf("sluice_fleet_slot_calls_late_total %v, want more than %v", got, late)
	}
	if !strings.Contains(a.stderr.String(), "after its forwarder stopped waiting") {
		t.Errorf("no line for the late calls; log:\n%s", a.stderr.String())
	}
	if code, body := call(b, "/v1/release", token); code != 204 {
		t.Errorf("release at the other instance, Redis back: %d %v; want 204", code, body)
	}
}

// TestFleetFallbackForward503MayHaveReleased: a release passed on to the
// granting instance is answered 503 when the answer does not come back in
// time, here because the forwarding instance's own Redis holds its replies
// (its commands still reach Redis). The granting instance carried the
// release out all the same: a 503 leaves the outcome unknown, and retrying
// the release is safe (204, the slot released once); an extend is 404.
func TestFleetFallbackForward503MayHaveReleased(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	cut := newStallProxy(t, r.Addr)
	f := startFleet(t, r.url(), 1, `
policies:
  - name: jobs
    in_flight: {max: 4, hold: 30s}
`, "--fleet-size", "2")
	a := f.procs[0]
	b := f.add(t, "--redis", "redis://"+cut.addr())
	listening(t, r, 2)
	token := stalledGrant(t, r, a)
	extendedElsewhere(t, b, token, "Redis back")
	held := func() float64 { return metric(t, a, `sluice_inflight_held{policy="jobs"}`) }
	if got := held(); got != 1 {
		t.Fatalf("the granting instance holds %v, want 1", got)
	}

	cut.holdReplies()
	code, body := slotCall(t, b, "/v1/release", token)
	cut.passReplies()
	if code != 503 {
		t.Fatalf("release passed on with the forwarder's replies held: %d %v, want 503", code, body)
	}
	if detail, _ := body["detail"].(string); strings.Contains(detail, "could not be reached") || !strings.Contains(detail, "may or may not have been carried out") {
		t.Errorf("503 detail %q: want it to say the call may have been carried out", detail)
	}
	for deadline := time.Now().Add(5 * time.Second); held() != 0; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the granting instance still holds the slot: the 503'd release was not carried out, which this test expects it was")
		}
	}
	for _, p := range []*proc{b, a} {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			code, body := slotCall(t, p, "/v1/release", token)
			if code == 204 {
				break
			}
			if code != 503 || time.Now().After(deadline) {
				t.Fatalf("release retried at %s after the 503: %d %v, want 204", p.http, code, body)
			}
		}
	}
	if code, body := slotCall(t, b, "/v1/extend", token); code != 404 {
		t.Errorf("extend of the released slot: %d %v, want 404", code, body)
	}
}

// TestFleetFallbackGrantorStopped: the instance whose fallback granted a
// slot stops (the slot goes with it) and starts again under a new id. A
// release or extend of the slot through the other instance, or through the
// new one, is 404 once the granting instance has not answered: its fleet
// report is gone, so it is not running, and Redis does not hold its holder.
// Before, it was a 503 "retry" forever, though no instance could hold the
// slot.
func TestFleetFallbackGrantorStopped(t *testing.T) {
	race.SkipTiming(t)
	r, f := jobsFleet(t)
	a, b := f.procs[0], f.procs[1]
	call := func(p *proc, path, token string) (int, map[string]any) { return slotCall(t, p, path, token) }
	token := stalledGrant(t, r, a)
	// a answers through b while it runs.
	extendedElsewhere(t, b, token, "a running")
	// Its acquire ran on Redis when Redis resumed; taken away here, as if
	// it had not (TestFleetFallbackGrantorStoppedStoreHeld keeps it).
	ranLate(t, r, token)
	heldOnRedis(t, r, token, true)
	a.signal(t, syscall.SIGTERM)
	a.cmd.Wait()
	a2 := f.add(t)
	for _, p := range []*proc{b, a2} {
		for _, path := range []string{"/v1/release", "/v1/extend"} {
			start := time.Now()
			code, body := call(p, path, token)
			if detail, _ := body["detail"].(string); code != 404 || !strings.Contains(detail, "stopped") {
				t.Errorf("%s after the granting instance stopped: %d %v; want 404 saying it stopped", path, code, body)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("%s took %v", path, took)
			}
		}
	}
}

// TestFleetFallbackGrantorStoppedStoreHeld: an acquire that timed out on
// a stalled Redis, granted by the instance's fallback, runs on Redis once
// it resumes, under the same holder, and only the granting instance would
// free it there. Once that instance has stopped, a release of the slot
// through another instance frees the holder on Redis (204, and 204 when
// sent again), an extend extends it there (200), and a call about a holder
// Redis does not hold is 404. Before, both calls were 404 "nothing was
// freed" while Redis kept the holders until their hold timeout.
func TestFleetFallbackGrantorStoppedStoreHeld(t *testing.T) {
	race.SkipTiming(t)
	r, f := jobsFleet(t)
	a, b := f.procs[0], f.procs[1]
	tokens := []string{stalledGrant(t, r, a), stalledGrant(t, r, a)}
	onRedis := func(tok string) bool { return heldOnRedis(t, r, tok, false) }
	for _, tok := range tokens {
		ranLate(t, r, tok)
	}
	a.signal(t, syscall.SIGTERM)
	a.cmd.Wait()

	if code, body := slotCall(t, b, "/v1/extend", tokens[0]); code != 200 || body["hold_ms"] != 30000.0 {
		t.Errorf("extend after the granting instance stopped, Redis holding the holder: %d %v; want 200 with hold_ms 30000", code, body)
	}
	for i, tok := range tokens {
		for range 2 {
			if code, body := slotCall(t, b, "/v1/release", tok); code != 204 {
				t.Errorf("release %d after the granting instance stopped, Redis holding the holder: %d %v; want 204", i, code, body)
			}
		}
		if onRedis(tok) {
			t.Errorf("Redis still holds holder %d after its release", i)
		}
	}
	code, body := slotCall(t, b, "/v1/extend", tokens[1])
	if detail, _ := body["detail"].(string); code != 404 || !strings.Contains(detail, "stopped") {
		t.Errorf("extend of the released holder: %d %v; want 404 saying the granting instance stopped", code, body)
	}
	// The whole max is free again.
	for i := range 4 {
		if code, body := b.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`); code != 200 || body["source"] != nil {
			t.Fatalf("acquire %d after the releases: %d %v", i, code, body)
		}
	}
}

// TestFleetFallbackForwardCounted: a release or extend passed on to the
// granting instance is counted once in sluice_inflight_calls_total: by the
// instance that carried it out, or, when none answered (the client's 503),
// by the instance that passed it on. Before, those 503s were counted
// nowhere (a client saw 19 release 503s, the instances counted 13 errors).
func TestFleetFallbackForwardCounted(t *testing.T) {
	race.SkipTiming(t)
	r, f := jobsFleet(t)
	a, b := f.procs[0], f.procs[1]
	listening(t, r, 2)
	calls := func(p *proc, call, outcome string) float64 {
		return max(metric(t, p, `sluice_inflight_calls_total{call="`+call+`",outcome="`+outcome+`",policy="jobs"}`), 0)
	}
	token := stalledGrant(t, r, a)
	r.pause(t)
	for _, path := range []string{"/v1/release", "/v1/extend"} {
		if code, body := slotCall(t, b, path, token); code != 503 {
			r.resume(t)
			t.Fatalf("%s at the other instance, Redis stalled: %d %v; want 503", path, code, body)
		}
	}
	r.resume(t)
	for _, call := range []string{"release", "extend"} {
		if got := calls(b, call, "error"); got != 1 {
			t.Errorf("%s errors counted by the instance that passed the calls on: %v, want 1", call, got)
		}
		if got := calls(a, call, "error"); got != 0 {
			t.Errorf("%s errors counted by the granting instance, which never ran them: %v, want 0", call, got)
		}
	}
	extendedElsewhere(t, b, token, "Redis back")
	if code, body := slotCall(t, b, "/v1/release", token); code != 204 {
		t.Fatalf("release at the other instance, Redis back: %d %v; want 204", code, body)
	}
	if got, other := calls(a, "release", "released"), calls(b, "release", "released"); got != 1 || other != 0 {
		t.Errorf("releases counted: %v by the granting instance, %v by the other; want 1 and 0", got, other)
	}
}

// heldOnRedis reports whether Redis holds token's holder, removing it
// when remove.
func heldOnRedis(t *testing.T, r *redisProc, token string, remove bool) bool {
	t.Helper()
	c := r.client()
	defer c.Close()
	ctx := context.Background()
	keys, err := c.Keys(ctx, "*:if2").Result()
	if err != nil || len(keys) > 1 {
		t.Fatalf("in-flight keys on Redis: %v, %v; want one at most", keys, err)
	}
	if len(keys) == 0 {
		return false
	}
	member := "h" + strings.Split(token, ".")[0]
	if remove {
		n, err := c.ZRem(ctx, keys[0], member).Result()
		return err == nil && n == 1
	}
	_, err = c.ZScore(ctx, keys[0], member).Result()
	return err == nil
}

// ranLate waits until the acquire of token, granted by a fallback when it
// timed out on a stalled Redis, has run on Redis.
func ranLate(t *testing.T, r *redisProc, token string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !heldOnRedis(t, r, token, false); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the acquire that timed out did not run on Redis when it resumed; this test needs it to")
		}
	}
}

// slotCall posts token to one of p's slot endpoints.
func slotCall(t *testing.T, p *proc, path, token string) (int, map[string]any) {
	t.Helper()
	code, body, _ := post(t, "http://"+p.http, path, tokenBody(token))
	return code, body
}

// stalledGrant acquires a slot of policy jobs at p while r is stalled, so
// that p's local fallback grants it, and resumes r.
func stalledGrant(t *testing.T, r *redisProc, p *proc) string {
	t.Helper()
	r.pause(t)
	code, body := p.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
	r.resume(t)
	if code != 200 || body["source"] != "fallback" {
		t.Fatalf("acquire with Redis stalled: %d %v, want a fallback grant", code, body)
	}
	return body["token"].(string)
}

// extendedElsewhere extends token through p, another instance than the
// one that granted it, until the granting one answers through p (200).
func extendedElsewhere(t *testing.T, p *proc, token, when string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		code, body := slotCall(t, p, "/v1/extend", token)
		if code == 200 {
			return
		}
		if code != 503 || time.Now().After(deadline) {
			t.Fatalf("extend at the other instance, %s: %d %v; want 200", when, code, body)
		}
	}
}

// jobsFleet starts a Redis and two instances on it, with one in-flight
// policy, jobs (max 4, hold 30s), and any more flags.
func jobsFleet(t *testing.T, args ...string) (*redisProc, *fleet) {
	t.Helper()
	r := startRedis(t)
	return r, startFleet(t, r.url(), 2, `
policies:
  - name: jobs
    in_flight: {max: 4, hold: 30s}
`, append([]string{"--fleet-size", "2"}, args...)...)
}

// listening waits until n instances listen on the fleet's slot channel.
func listening(t *testing.T, r *redisProc, n int64) {
	t.Helper()
	c := r.client()
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		got, err := c.PubSubNumSub(context.Background(), "{sluice:fleet}:slots").Result()
		if err == nil && got["{sluice:fleet}:slots"] == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("listeners on the fleet's channel: %v, %v; want %d", got, err, n)
		}
	}
}
