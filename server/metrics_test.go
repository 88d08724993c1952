package server

import (
	"context"
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// brokenStore fails every call, as a Redis that is down without a failure
// policy does.
type brokenStore struct{ sluice.Store }

func (brokenStore) Take(context.Context, string, sluice.Limit, int64) (sluice.Decision, error) {
	return sluice.Decision{}, errors.New("connection refused")
}

// decisionCount is sluice_decisions_total for policy and outcome, or -1
// when there is no such series.
func decisionCount(t *testing.T, m *Metrics, policy, outcome string) float64 {
	t.Helper()
	mfs, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "sluice_decisions_total" {
			continue
		}
		for _, s := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range s.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["policy"] == policy && labels["outcome"] == outcome {
				return s.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// Failed decisions count as outcome="error", and a reload that drops a
// policy drops its series.
func TestMetricsErrorsAndForget(t *testing.T) {
	m := NewMetrics()
	mem := memory.New(nil)
	t.Cleanup(func() { mem.Close() })
	svc := NewService(brokenStore{mem}, mustConfig(t, "policies:\n  - name: a\n    limit: 1/s\n  - name: b\n    limit: 1/s\n"), &ServiceOptions{Metrics: m})
	if _, err := svc.Check(context.Background(), "a", "k", 0); err == nil {
		t.Fatal("Check on a broken store succeeded")
	}
	if got := decisionCount(t, m, "a", "error"); got != 1 {
		t.Errorf(`decisions{policy="a",outcome="error"} = %v, want 1`, got)
	}
	svc.SetConfig(mustConfig(t, "policies:\n  - name: b\n    limit: 1/s\n"))
	if got := decisionCount(t, m, "a", "error"); got != -1 {
		t.Errorf("policy a's series survive its removal: %v", got)
	}
}
