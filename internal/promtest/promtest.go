// Package promtest reads metric values back from a Prometheus gatherer, for
// the tests of the packages that export metrics.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Value returns the value of the first series of the metric named name
// whose labels include labels: a counter's or a gauge's value, or a
// histogram's sample count. ok is false when there is no such series.
func Value(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string) (v float64, ok bool) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	series:
		for _, s := range mf.GetMetric() {
			have := map[string]string{}
			for _, l := range s.GetLabel() {
				have[l.GetName()] = l.GetValue()
			}
			for k, v := range labels {
				if have[k] != v {
					continue series
				}
			}
			switch {
			case s.Counter != nil:
				return s.GetCounter().GetValue(), true
			case s.Gauge != nil:
				return s.GetGauge().GetValue(), true
			case s.Histogram != nil:
				return float64(s.GetHistogram().GetSampleCount()), true
			}
		}
	}
	return 0, false
}
