package httplimit

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/promsluice"
)

// Given a promsluice.Collector as its Observer, the middleware makes its
// rules' series at 0 when it is built, as the service does when it loads
// its configuration: a series born at its first event at 1 shows no
// increase, so an alert on increase() missed a rule's first denial.
func TestRulesSeriesAtZero(t *testing.T) {
	col := promsluice.New(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(col)
	_, err := New(memory.New(nil), []Rule{{Name: "per-ip", Limit: sluice.PerSecond(10), Key: PeerIP()}}, &Options{Observer: col,
		InFlight: []InFlightRule{{Name: "slow", Limit: sluice.Concurrent(4, time.Minute), Key: Header("X-Key")}}})
	if err != nil {
		t.Fatal(err)
	}
	promtest.Expect(t, reg, "sluice_decisions_total", map[string]string{"policy": "per-ip", "outcome": "denied"}, 0)
	promtest.Expect(t, reg, "sluice_inflight_acquires_total", map[string]string{"policy": "slow", "priority": "normal", "outcome": "denied"}, 0)
}
