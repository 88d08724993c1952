package promsluice_test

import (
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/promsluice"
)

// BenchmarkObserveDecision: what the Collector adds to a decision, the
// check that the policy's series exist included.
func BenchmarkObserveDecision(b *testing.B) {
	c := promsluice.New(nil)
	e := sluice.DecisionEvent{Policy: "api", Outcome: sluice.OutcomeAllowed}
	b.ReportAllocs()
	for b.Loop() {
		c.ObserveDecision(e)
	}
}
