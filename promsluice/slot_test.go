package promsluice_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/promsluice"
)

// Every event maps to its series: the outcomes of extends and releases,
// expired weight from acquires' decisions, and the weight held, which
// releases of slots acquired elsewhere (weight 0) leave alone and
// expiries reported at collection time (Refresh) take away.
func TestCollectorSlotEvents(t *testing.T) {
	t.Parallel()
	var c *promsluice.Collector
	var expire []sluice.SlotEvent
	c = promsluice.New(&promsluice.Options{Refresh: func() {
		for _, e := range expire {
			c.ObserveSlot(e)
		}
		expire = nil
	}})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	for _, e := range []sluice.SlotEvent{
		{Policy: "p", Op: sluice.SlotAcquire, Outcome: sluice.OutcomeAllowed, Priority: sluice.PriorityNormal, Weight: 3, Decision: sluice.SlotDecision{Allowed: true, Expired: 2}},
		{Policy: "p", Op: sluice.SlotAcquire, Outcome: sluice.OutcomeAllowed, Priority: sluice.PriorityNormal, Weight: 4},
		{Policy: "p", Op: sluice.SlotAcquire, Outcome: sluice.OutcomeDenied, Priority: sluice.PriorityCritical, Weight: 9, Decision: sluice.SlotDecision{Expired: 1}},
		{Policy: "p", Op: sluice.SlotAcquire, Outcome: sluice.OutcomeError, Priority: sluice.PrioritySheddable, Weight: 1},
		{Policy: "p", Op: sluice.SlotExtend, Outcome: sluice.OutcomeAllowed},
		{Policy: "p", Op: sluice.SlotExtend, Outcome: sluice.OutcomeDenied},
		{Policy: "p", Op: sluice.SlotRelease, Outcome: sluice.OutcomeAllowed, Weight: 3},
		{Policy: "p", Op: sluice.SlotRelease, Outcome: sluice.OutcomeAllowed, Again: true},
		{Policy: "p", Op: sluice.SlotRelease, Outcome: sluice.OutcomeAllowed}, // acquired elsewhere
		{Policy: "p", Op: sluice.SlotRelease, Outcome: sluice.OutcomeDenied},
		{Policy: "p", Op: sluice.SlotRelease, Outcome: sluice.OutcomeError},
		{Policy: "p", Op: sluice.SlotRelease, Outcome: sluice.OutcomeError, NotRetried: true},
	} {
		c.ObserveSlot(e)
	}
	held := map[string]string{"policy": "p"}
	if got := gather(t, reg, "sluice_inflight_held", held); got != 4 {
		t.Errorf("held = %v, want 3 + 4 − 3 = 4", got)
	}
	expire = []sluice.SlotEvent{{Policy: "p", Op: sluice.SlotExpire, Outcome: sluice.OutcomeAllowed, Weight: 4}}
	calls := func(call, outcome string) map[string]string {
		return map[string]string{"policy": "p", "call": call, "outcome": outcome}
	}
	promtest.Expect(t, reg, "sluice_inflight_acquires_total", map[string]string{"policy": "p", "priority": "normal", "outcome": "allowed"}, 2)
	promtest.Expect(t, reg, "sluice_inflight_acquires_total", map[string]string{"policy": "p", "priority": "critical", "outcome": "denied"}, 1)
	promtest.Expect(t, reg, "sluice_inflight_acquires_total", map[string]string{"policy": "p", "priority": "sheddable", "outcome": "error"}, 1)
	promtest.Expect(t, reg, "sluice_inflight_expired_total", held, 3)
	promtest.Expect(t, reg, "sluice_inflight_calls_total", calls("extend", "extended"), 1)
	promtest.Expect(t, reg, "sluice_inflight_calls_total", calls("extend", "not_held"), 1)
	promtest.Expect(t, reg, "sluice_inflight_calls_total", calls("release", "released"), 2)
	promtest.Expect(t, reg, "sluice_inflight_calls_total", calls("release", "released_before"), 1)
	promtest.Expect(t, reg, "sluice_inflight_calls_total", calls("release", "not_held"), 1)
	promtest.Expect(t, reg, "sluice_inflight_calls_total", calls("release", "error"), 1)
	promtest.Expect(t, reg, "sluice_inflight_calls_total", calls("release", "not_retried"), 1)
	promtest.Expect(t, reg, "sluice_inflight_held", held, 0) // the 4 expired
}

// The middleware's in-flight events become acquires by priority and
// outcome, releases, and the weight held, which returns to zero once the
// requests end.
func TestCollectorSlots(t *testing.T) {
	t.Parallel()
	c, reg, store := newCollector(t)
	prio, err := httplimit.PriorityFrom(httplimit.Header("X-Tier"), "")
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.New(store, nil, &httplimit.Options{
		Observer: c,
		Priority: prio,
		Shed:     []httplimit.ShedRule{{Name: "fleet", Capacity: sluice.Concurrent(2, time.Minute), Reserve: sluice.Reserve{Critical: 0.5}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	entered, leave := make(chan struct{}), make(chan struct{})
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		entered <- struct{}{}
		<-leave
	}))
	serve := func(tier string) int {
		w := httptest.NewRecorder()
		r := httptest.NewRequest("GET", "/", nil)
		r.Header.Set("X-Tier", tier)
		h.ServeHTTP(w, r)
		return w.Code
	}
	done := make(chan int)
	go func() { done <- serve("critical") }()
	<-entered
	held := map[string]string{"policy": "fleet"}
	if got := gather(t, reg, "sluice_inflight_held", held); got != 1 {
		t.Errorf("weight held = %v, want 1", got)
	}
	if code := serve("normal"); code != http.StatusServiceUnavailable {
		t.Errorf("normal over its threshold: %d, want 503", code)
	}
	close(leave)
	<-done
	allowed := map[string]string{"policy": "fleet", "priority": "critical", "outcome": "allowed"}
	promtest.Expect(t, reg, "sluice_inflight_acquires_total", allowed, 1)
	promtest.Expect(t, reg, "sluice_inflight_acquires_total", map[string]string{"policy": "fleet", "priority": "normal", "outcome": "shed"}, 1)
	promtest.Expect(t, reg, "sluice_inflight_calls_total", map[string]string{"policy": "fleet", "call": "release", "outcome": "released"}, 1)
	promtest.Expect(t, reg, "sluice_inflight_held", held, 0)
	c.ForgetPolicy("fleet")
	if got := gather(t, reg, "sluice_inflight_acquires_total", allowed); got != 0 {
		t.Errorf("after ForgetPolicy: %v", got)
	}
	var zero promsluice.Collector
	zero.ObserveSlot(sluice.SlotEvent{Policy: "p"})
}

// A policy's series exist at 0 before their first event: from AddPolicy,
// or from the policy's first event of any kind. A series born at 1 shows
// Prometheus no increase: increase(...{outcome="error"}[10m]) > 0 missed
// the first failed release, and a denial ratio compared with an hour
// before had nothing to compare with while a policy had never denied.
func TestPolicySeriesFromZero(t *testing.T) {
	t.Parallel()
	c, reg := registered(t, nil)
	c.AddPolicy("exports", true)
	c.AddPolicy("api", false)
	zero := func(policy string) {
		t.Helper()
		for _, o := range []string{"allowed", "denied", "shed", "error"} {
			for _, p := range []string{"critical", "normal", "sheddable"} {
				promtest.Expect(t, reg, "sluice_inflight_acquires_total", map[string]string{"policy": policy, "priority": p, "outcome": o}, 0)
			}
		}
		for call, outcomes := range map[string][]string{"extend": {"extended", "not_held", "error"}, "release": {"released", "released_before", "not_held", "error", "not_retried"}} {
			for _, o := range outcomes {
				promtest.Expect(t, reg, "sluice_inflight_calls_total", map[string]string{"policy": policy, "call": call, "outcome": o}, 0)
			}
		}
		promtest.Expect(t, reg, "sluice_inflight_expired_total", map[string]string{"policy": policy}, 0)
		promtest.Expect(t, reg, "sluice_inflight_held", map[string]string{"policy": policy}, 0)
	}
	zero("exports")
	for _, o := range []string{"allowed", "denied", "shadow_denied", "error"} {
		promtest.Expect(t, reg, "sluice_decisions_total", map[string]string{"policy": "api", "outcome": o}, 0)
	}
	promtest.Expect(t, reg, "sluice_near_limit_total", map[string]string{"policy": "api"}, 0)
	if _, ok := promtest.Value(t, reg, "sluice_decisions_total", map[string]string{"policy": "exports"}); ok {
		t.Error("an in-flight policy has decision series")
	}

	// Without AddPolicy: from the first event, and again after a
	// ForgetPolicy.
	for range 2 {
		c.ObserveSlot(sluice.SlotEvent{Policy: "uploads", Op: sluice.SlotAcquire, Outcome: sluice.OutcomeAllowed, Weight: 1})
		promtest.Expect(t, reg, "sluice_inflight_calls_total", map[string]string{"policy": "uploads", "call": "release", "outcome": "error"}, 0)
		promtest.Expect(t, reg, "sluice_inflight_acquires_total", map[string]string{"policy": "uploads", "priority": "critical", "outcome": "allowed"}, 1)
		c.ForgetPolicy("uploads")
		if _, ok := promtest.Value(t, reg, "sluice_inflight_calls_total", map[string]string{"policy": "uploads"}); ok {
			t.Fatal("a forgotten policy's series stay")
		}
	}
	c.ObserveDecision(sluice.DecisionEvent{Policy: "search", Outcome: sluice.OutcomeAllowed})
	promtest.Expect(t, reg, "sluice_decisions_total", map[string]string{"policy": "search", "outcome": "denied"}, 0)

	var zc promsluice.Collector
	zc.AddPolicy("api", false) // a zero Collector observes nothing
	var nc *promsluice.Collector
	nc.AddPolicy("api", true)
}
