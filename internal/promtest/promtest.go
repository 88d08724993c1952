// Package promtest reads values out of a Prometheus gatherer, for the
// tests of every package that exports metrics.
package promtest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// Value returns the value of the first series of name whose labels
// include labels (a counter's or a gauge's value, a histogram's sample
// count); ok is false when there is none. A failing Gather fails t.
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
			have := make(map[string]string, len(s.GetLabel()))
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

// Expect reports, as an error of t, a value of the series of name whose
// labels include labels other than want (a series that does not exist
// has the value -1).
func Expect(t testing.TB, g prometheus.Gatherer, name string, labels map[string]string, want float64) {
	t.Helper()
	got, ok := Value(t, g, name, labels)
	if !ok {
		got = -1
	}
	if got != want {
		t.Errorf("%s%v = %v, want %v", name, labels, got, want)
	}
}
