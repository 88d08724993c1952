package promsluice_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/promsluice"
)

// A partition's breaker has series of its own in sluice_breaker_state,
// apart from the store's.
func TestBreakerStateByPartition(t *testing.T) {
	c := promsluice.New(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	c.ObserveBreaker(sluice.BreakerEvent{Store: "redis"})
	c.ObserveBreaker(sluice.BreakerEvent{Store: "redis", Partition: "10.0.0.2:6379", From: sluice.BreakerClosed, To: sluice.BreakerOpen})
	for _, tc := range []struct {
		partition, state string
		want             float64
	}{{"", "closed", 1}, {"", "open", 0}, {"10.0.0.2:6379", "open", 1}, {"10.0.0.2:6379", "closed", 0}} {
		got, ok := promtest.Value(t, reg, "sluice_breaker_state", map[string]string{"store": "redis", "partition": tc.partition, "state": tc.state})
		if !ok || got != tc.want {
			t.Errorf("sluice_breaker_state{partition=%q,state=%q} = %v (%v), want %v", tc.partition, tc.state, got, ok, tc.want)
		}
	}
}

// A forgotten partition's breaker takes its series with it: a failed-over
// master's address would otherwise report closed for good.
func TestBreakerStateForgotten(t *testing.T) {
	c := promsluice.New(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	c.ObserveBreaker(sluice.BreakerEvent{Store: "redis"})
	c.ObserveBreaker(sluice.BreakerEvent{Store: "redis", Partition: "10.0.0.2:6379"})
	c.ObserveBreaker(sluice.BreakerEvent{Store: "redis", Partition: "10.0.0.2:6379", Forgotten: true})
	for _, state := range []string{"closed", "half_open", "open"} {
		if got, ok := promtest.Value(t, reg, "sluice_breaker_state", map[string]string{"store": "redis", "partition": "10.0.0.2:6379", "state": state}); ok {
			t.Errorf("sluice_breaker_state{partition=10.0.0.2:6379,state=%q} = %v after its breaker was forgotten, want no series", state, got)
		}
	}
	if got, ok := promtest.Value(t, reg, "sluice_breaker_state", map[string]string{"store": "redis", "partition": "", "state": "closed"}); !ok || got != 1 {
		t.Errorf("the store's own breaker: closed = %v (%v), want 1", got, ok)
	}
}

// Each transition of a breaker, a partition's too, is counted: an episode
// that opens and closes between two scrapes still shows, and a forgotten
// master's counts stay.
func TestBreakerTransitionsCounted(t *testing.T) {
	c := promsluice.New(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	const m = "10.0.0.2:6379"
	c.ObserveBreaker(sluice.BreakerEvent{Store: "redis", Partition: m})
	from := sluice.BreakerClosed
	for _, to := range []sluice.BreakerState{sluice.BreakerOpen, sluice.BreakerHalfOpen, sluice.BreakerOpen, sluice.BreakerHalfOpen, sluice.BreakerClosed} {
		c.ObserveBreaker(sluice.BreakerEvent{Store: "redis", Partition: m, From: from, To: to})
		from = to
	}
	c.ObserveBreaker(sluice.BreakerEvent{Store: "redis", Partition: m, Forgotten: true})
	for to, want := range map[string]float64{"open": 2, "half_open": 2, "closed": 1} {
		if got, ok := promtest.Value(t, reg, "sluice_breaker_transitions_total", map[string]string{"store": "redis", "partition": m, "to": to}); !ok || got != want {
			t.Errorf("sluice_breaker_transitions_total{to=%q} = %v (%v), want %v", to, got, ok, want)
		}
	}
}
