package promsluice_test

import (
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/promsluice"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// sluice_breaker_state has its three series as soon as a resilient store
// is built over Redis, before any call or transition: an alert on
// state="open" has one to read while the breaker is closed. A NewMulti that
// fails builds no store and announces none.
func TestBreakerSeriesFromStart(t *testing.T) {
	rs := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	c := promsluice.New(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
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
