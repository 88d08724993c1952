package promsluice_test

import (
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/promsluice"
)

// The middleware's in-flight events become acquires, denials by priority
// and the weight held, which returns to zero once the requests end.
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
	held := func() float64 { return gather(t, reg, "sluice_slots_held", map[string]string{"policy": "fleet"}) }
	if got := held(); got != 1 {
		t.Errorf("slots held = %v, want 1", got)
	}
	if code := serve("normal"); code != http.StatusServiceUnavailable {
		t.Errorf("normal over its threshold: %d, want 503", code)
	}
	close(leave)
	<-done
	for _, tt := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"sluice_slot_acquires_total", map[string]string{"policy": "fleet", "outcome": "allowed"}, 1},
		{"sluice_slot_acquires_total", map[string]string{"policy": "fleet", "outcome": "denied"}, 1},
		{"sluice_slot_denials_total", map[string]string{"policy": "fleet", "priority": "normal"}, 1},
		{"sluice_slots_held", map[string]string{"policy": "fleet"}, 0},
	} {
		if got := gather(t, reg, tt.name, tt.labels); got != tt.want {
			t.Errorf("%s%v = %v, want %v", tt.name, tt.labels, got, tt.want)
		}
	}
	c.ForgetPolicy("fleet")
	if got := gather(t, reg, "sluice_slot_acquires_total", map[string]string{"policy": "fleet", "outcome": "allowed"}); got != 0 {
		t.Errorf("after ForgetPolicy: %v", got)
	}
	var zero promsluice.Collector
	zero.ObserveSlot(sluice.SlotEvent{Policy: "p"})
}
