package promsluice_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/promsluice"
)

// gather returns the value of the metric whose labels include labels, or
// 0 when there is none.
func gather(t *testing.T, g prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	v, _ := promtest.Value(t, g, name, labels)
	return v
}

// registered is a collector made with opts and a registry holding it.
func registered(t *testing.T, opts *promsluice.Options) (*promsluice.Collector, *prometheus.Registry) {
	t.Helper()
	c := promsluice.New(opts)
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	return c, reg
}
