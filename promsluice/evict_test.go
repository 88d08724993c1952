package promsluice_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/promsluice"
)

// A fallback's evictions add up in sluice_fallback_evicted_keys_total and
// its exhausted share, by store.
func TestFallbackEvictionsCounted(t *testing.T) {
	c := promsluice.New(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	c.ObserveEvictions(sluice.EvictionEvent{Store: "redis", Keys: 5, Exhausted: 1})
	c.ObserveEvictions(sluice.EvictionEvent{Store: "redis", Keys: 2})
	for name, want := range map[string]float64{"sluice_fallback_evicted_keys_total": 7, "sluice_fallback_evicted_exhausted_keys_total": 1} {
		if got, ok := promtest.Value(t, reg, name, map[string]string{"store": "redis"}); !ok || got != want {
			t.Errorf("%s = %v (%v), want %v", name, got, ok, want)
		}
	}
}
