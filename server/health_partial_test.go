//go:build unix

package server

import (
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
)

// aclServe runs one `sluice serve` as the Redis user user (every
// permission sluice needs, see sluiceUser) with configuration cfg, and
// returns it with an admin client of its Redis and its configuration
// file. Its decision timeout is aclDecisionTimeout.
func aclServe(t *testing.T, user, cfg string) (*proc, *redis.Client, string) {
	t.Helper()
	r := startRedis(t)
	admin := r.client()
	t.Cleanup(func() { admin.Close() })
	sluiceUser(t, admin, user)
	f := startFleet(t, "redis://"+user+":pw@"+r.Addr, 1, cfg, "--failure-policy", "local", "--decision-timeout", aclDecisionTimeout.String())
	return f.procs[0], admin, f.args[1]
}

// aclDecisionTimeout is generous: the ACL tests' failed calls are
// refusals, answered at once, and the default 50ms let a loaded machine
// time calls out too, each a failure that kept the partial failure on
// (or started it on an allowed key) where the tests want none.
const aclDecisionTimeout = 2 * time.Second

// logLine awaits a line containing msg in p's log, for at most 2 s: health
// changes its metrics just before the line that announces the change.
func logLine(p *proc, msg string) bool {
	return await(2*time.Second, func() bool { return strings.Contains(p.stderr.String(), msg) })
}

// await polls cond every 50ms until it holds, for at most within.
func await(within time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(within); ; time.Sleep(50 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// TestFaultPartialLeaseCallsFail: only a leased policy's lease calls fail
// (an ACL refuses its keys) while another policy passes, so the breaker
// stays closed: the failure policy answers that policy's requests, and
// the service says so, as for failed takes: sluice_degraded, /v1/status,
// one ERROR line naming the cause. Before, the failed grants reached the
// store metrics alone. Fixing the ACL ends it, once a grant passes.
func TestFaultPartialLeaseCallsFail(t *testing.T) {
	race.SkipTiming(t)
	p, admin, _ := aclServe(t, "leased", `
policies:
  - name: hot
    limit: 100000/s
    lease: 100ms
  - name: plain
    limit: fixed_window 1000000000/1h
`)
	l := (&fleet{procs: []*proc{p}}).drive(4, "k", "plain", "plain", "plain", "hot")
	defer l.finish()
	if !await(5*time.Second, func() bool { return metric(t, p, "sluice_lease_keys_leased") >= 1 }) {
		t.Fatal("no key of policy hot leased under load")
	}
	allowKeys(t, admin, "leased", "~sluice:{v*:plain@*")
	if !await(5*time.Second, func() bool { return metric(t, p, "sluice_degraded") == 1 }) {
		_, st := p.getJSON(t, "/v1/status")
		t.Fatalf("policy hot's grants refused for 5s: sluice_degraded %v, status %v, grants refused %v; want degraded\n%s",
			metric(t, p, "sluice_degraded"), st, metric(t, p, `sluice_store_errors_total{cause="permission",op="grant",store="redis"}`), p.stderr.String())
	}
	_, st := p.getJSON(t, "/v1/status")
	if st["degraded"] != true || st["fallback_active"] == true {
		t.Fatalf("status %v: want degraded, the breaker closed (policy plain passes)", st)
	}
	if reasons := reasonsOf(st); !strings.Contains(reasons, "permission: ") || !strings.Contains(reasons, "NOPERM") {
		t.Errorf("reasons %q: want the cause (permission) and Redis's error", reasons)
	}
	logLine(p, "store calls failing while the breaker is closed")
	var line string
	for l := range strings.Lines(p.stderr.String()) {
		if strings.Contains(l, "store calls failing while the breaker is closed") {
			line = l
		}
	}
	if !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "cause=permission") {
		t.Errorf("partial failure line %q: want one at ERROR with cause=permission; log:\n%s", line, p.stderr.String())
	}
	if got := metric(t, p, `sluice_partial_failure_transitions_total{cause="permission",to="on"}`); got != 1 {
		t.Errorf(`sluice_partial_failure_transitions_total{cause="permission",to="on"} %v, want 1`, got)
	}
	// The ACL fixed: the next grant passes, and Redis answers policy hot.
	allowKeys(t, admin, "leased", "~sluice:*")
	if !await(15*time.Second, func() bool { return metric(t, p, "sluice_degraded") == 0 }) {
		_, m := p.get(t, "/metrics")
		var errs []string
		for l := range strings.Lines(m) {
			if strings.HasPrefix(l, "sluice_store_errors_total") || strings.HasPrefix(l, "sluice_decisions_total") {
				errs = append(errs, l)
			}
		}
		_, st := p.getJSON(t, "/v1/status")
		t.Fatalf("ACL fixed: still degraded: %v\n%s\n%s", st, errs, p.stderr.String())
	}
	if !logLine(p, "store calls answered again") {
		t.Errorf("no end line:\n%s", p.stderr.String())
	}
}

// reasonsOf joins /v1/status's reasons.
func reasonsOf(st map[string]any) string {
	var b strings.Builder
	if vs, ok := st["reasons"].([]any); ok {
		for _, s := range vs {
			if s, ok := s.(string); ok {
				b.WriteString(s + " ")
			}
		}
	}
	return b.String()
}

// TestFaultPartialSomeKeysRefused: an ACL refuses some keys of one policy
// (bad*) and allows its others (good*); requests alternate between them.
// The cause is permanent, so it is one episode: one line, one start, no
// end while the refusals go on, sluice_degraded 1 throughout (each good
// key's answer ended it and the next refusal started another, every
// ~100 ms). Once the refusals stop, the policy's next answer after 10 s
// without a failed call ends it.
func TestFaultPartialSomeKeysRefused(t *testing.T) {
	race.SkipTiming(t)
	p, admin, _ := aclServe(t, "somekeys", `
policies:
  - name: plain
    limit: fixed_window 1000000000/1h
  - name: other
    limit: fixed_window 1000000000/1h
`)
	allowKeys(t, admin, "somekeys", "~sluice:{v*:other@*", "~sluice:{v*:plain@*:good*")
	check := func(policy, key string) string {
		_, body := p.post(t, "/v1/check", `{"policy":"`+policy+`","key":"`+key+`"}`)
		return sourceOf(body["source"])
	}
	if src := check("plain", "good1"); src != "" {
		t.Fatalf("an allowed key answered by %s, want Redis", src)
	}
	on, off := `sluice_partial_failure_transitions_total{cause="permission",to="on"}`, `sluice_partial_failure_transitions_total{cause="",to="off"}`
	check("plain", "bad1")
	if !await(2*time.Second, func() bool { return metric(t, p, "sluice_degraded") == 1 }) {
		t.Fatal("a refused key: not degraded")
	}
	var lastBad time.Time
	for end := time.Now().Add(2500 * time.Millisecond); time.Now().Before(end); {
		check("other", "k")
		check("plain", "good1")
		lastBad = time.Now()
		if src := check("plain", "bad1"); src != "fallback" {
			t.Fatalf("a refused key answered by %q, want the failure policy", src)
		}
		if got := metric(t, p, "sluice_degraded"); got != 1 {
			t.Fatalf("sluice_degraded %v between a refused key and the next, want 1", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := metric(t, p, on); got != 1 {
		t.Errorf("%s %v after 2.5 s of alternating keys, want 1", on, got)
	}
	if got := metric(t, p, off); got != 0 {
		t.Errorf("%s %v while refusals go on, want 0", off, got)
	}
	if n := strings.Count(p.stderr.String(), "store calls failing while the breaker is closed"); n != 1 {
		t.Errorf("%d partial failure lines, want 1:\n%s", n, p.stderr.String())
	}
	// No more refusals; the allowed keys go on.
	if !await(partialWindow+3*time.Second, func() bool {
		check("plain", "good1")
		return metric(t, p, "sluice_degraded") == 0
	}) {
		t.Fatalf("refusals over: still degraded after %v\n%s", time.Since(lastBad), p.stderr.String())
	}
	if took := time.Since(lastBad); took < partialWindow {
		t.Errorf("ended %v after the last refusal, want %v without one", took, partialWindow)
	}
	if !logLine(p, `msg="store calls answered again"`) {
		t.Errorf("no end line:\n%s", p.stderr.String())
	}
	if got := metric(t, p, off); got != 1 {
		t.Errorf("%s %v after the end, want 1", off, got)
	}
}

// sourceOf is a /v1/check body's source: empty when Redis answered.
func sourceOf(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	return ""
}

// TestPartialEndsWithRemovedPolicy: a partial failure (an ACL refusing
// policy other's keys) ended by a reload that removes policy other says
// so; it said "store calls answered again", though nothing was answered
// and the ACL still refuses.
func TestPartialEndsWithRemovedPolicy(t *testing.T) {
	p, admin, cfg := aclServe(t, "removed", `
policies:
  - name: api
    limit: fixed_window 1000000000/1h
  - name: other
    limit: fixed_window 1000000000/1h
`)
	allowKeys(t, admin, "removed", "~sluice:{v*:api@*")
	p.post(t, "/v1/check", `{"policy":"api","key":"k"}`)
	p.post(t, "/v1/check", `{"policy":"other","key":"k"}`)
	if r := p.expect(t, "store calls failing while the breaker is closed: the failure policy answers them (part of the store down, such as a Cluster node?)"); r["cause"] != "permission" {
		t.Fatalf("partial failure line %v: want cause permission", r)
	}
	if err := os.WriteFile(cfg, []byte("policies:\n  - name: api\n    limit: fixed_window 1000000000/1h\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	p.signal(t, syscall.SIGHUP)
	r := p.expectAny(t, "store calls answered again", "store calls failing no more: a reload removed the policies whose calls failed")
	if r["msg"] != "store calls failing no more: a reload removed the policies whose calls failed" || r["removed"] != "[other]" || r["cause"] != "permission" {
		t.Errorf("end line %v: want it to say a reload removed policy other, cause permission", r)
	}
	if got := metric(t, p, "sluice_degraded"); got != 0 {
		t.Errorf("sluice_degraded %v once the failing policy is gone, want 0", got)
	}
	if got := metric(t, p, `sluice_partial_failure_transitions_total{cause="",to="off"}`); got != 1 {
		t.Errorf("transitions to off %v, want 1", got)
	}
}

// TestFaultPartialSlotCallsEnd: an ACL refuses an in-flight policy's keys,
// so its acquires fail and the failure policy answers them while the
// breaker stays closed: a partial failure (a permanent cause), with no
// rate decision of that policy. Once the ACL is lifted, its next acquire
// and release, answered by Redis, are the evidence that ends it,
// partialWindow after the last failed call. Before, only the breaker
// opening or Redis lost ended it.
func TestFaultPartialSlotCallsEnd(t *testing.T) {
	race.SkipTiming(t)
	p, admin, _ := aclServe(t, "slots", `
policies:
  - name: plain
    limit: fixed_window 1000000000/1h
  - name: jobs
    in_flight: {max: 100, hold: 30s}
`)
	allowKeys(t, admin, "slots", "~sluice:{v*:plain@*")
	acquire := func() (int, map[string]any) {
		return p.post(t, "/v1/acquire", `{"policy":"jobs","key":"k"}`)
	}
	if code, body := acquire(); code != 200 || body["source"] != "fallback" {
		t.Fatalf("acquire of a refused key: %d %v, want the failure policy's slot", code, body)
	}
	if r := p.expect(t, "store calls failing while the breaker is closed: the failure policy answers them (part of the store down, such as a Cluster node?)"); r["cause"] != "permission" {
		t.Fatalf("partial failure line %v: want cause permission", r)
	}
	if !await(2*time.Second, func() bool { return metric(t, p, "sluice_degraded") == 1 }) {
		t.Fatal("a refused acquire: not degraded")
	}
	allowKeys(t, admin, "slots", "~sluice:*")
	code, body := acquire()
	if code != 200 || sourceOf(body["source"]) != "" {
		t.Fatalf("acquire once the ACL allows it: %d %v, want Redis's slot", code, body)
	}
	if code, _ := p.post(t, "/v1/release", tokenBody(body["token"])); code != 204 {
		t.Fatalf("release: %d, want 204", code)
	}
	if !await(partialWindow+5*time.Second, func() bool { return metric(t, p, "sluice_degraded") == 0 }) {
		_, st := p.getJSON(t, "/v1/status")
		t.Fatalf("Redis answers policy jobs again: still degraded after %v: %v\n%s", partialWindow+5*time.Second, st, p.stderr.String())
	}
	if r := p.expect(t, "store calls answered again"); r["cause"] != "permission" {
		t.Errorf("end line %v: want cause permission", r)
	}
	if got := metric(t, p, `sluice_partial_failure_transitions_total{cause="",to="off"}`); got != 1 {
		t.Errorf("transitions to off %v, want 1", got)
	}
}
