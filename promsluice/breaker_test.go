package promsluice_test

import (
	"log/slog"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// sluice_breaker_state has its three series as soon as a resilient store
// is built over Redis, before any call or transition: an alert on
// state="open" has one to read while the breaker is closed. A NewMulti that
// fails builds no store and announces none.
func TestBreakerSeriesFromStart(t *testing.T) {
	rs := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	c, reg := registered(t, nil)
	opts := func(name string) *resilient.Options {
		return &resilient.Options{Name: name, Observer: c, Logger: slog.New(slog.DiscardHandler)}
	}
	s, err := resilient.New(rs, opts("single"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, err := resilient.NewMulti(rs, opts("multi"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	for _, store := range []string{"single", "multi"} {
		for state, want := range map[string]float64{"closed": 1, "half_open": 0, "open": 0} {
			v, ok := promtest.Value(t, reg, "sluice_breaker_state", map[string]string{"store": store, "state": state})
			if !ok || v != want {
				t.Errorf("store %s, state %s: %v (series: %v), want %v", store, state, v, ok, want)
			}
		}
	}
	fb := memory.New(nil)
	defer fb.Close()
	if _, err := resilient.NewMulti(rs, &resilient.Options{Name: "refused", Observer: c, Fallback: onlyTake{fb}}); err == nil {
		t.Fatal("NewMulti with a fallback that is no MultiStore: no error")
	}
	if _, ok := promtest.Value(t, reg, "sluice_breaker_state", map[string]string{"store": "refused"}); ok {
		t.Error("a store NewMulti refused has a breaker series")
	}
}

// onlyTake hides a store's TakeAll.
type onlyTake struct{ sluice.Store }

// A partition's breaker has series of its own in sluice_breaker_state,
// apart from the store's.
func TestBreakerStateByPartition(t *testing.T) {
	c, reg := registered(t, nil)
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
	c, reg := registered(t, nil)
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
	c, reg := registered(t, nil)
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

// A breaker's transition series exist at 0 from its build on, before any
// transition: a series born at 1 at the first opening shows Prometheus no
// increase, and increase(...{to="open"}[10m]) > 0 missed that opening.
// A partition's breaker has them from its announcement too.
func TestBreakerTransitionsFromZero(t *testing.T) {
	rs := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	c, reg := registered(t, nil)
	s, err := resilient.New(rs, &resilient.Options{Name: "redis", Observer: c, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const m = "10.0.0.2:6379"
	c.ObserveBreaker(sluice.BreakerEvent{Store: "redis", Partition: m})
	for _, partition := range []string{"", m} {
		for _, to := range []string{"closed", "half_open", "open"} {
			promtest.Expect(t, reg, "sluice_breaker_transitions_total", map[string]string{"store": "redis", "partition": partition, "to": to}, 0)
		}
	}
}
