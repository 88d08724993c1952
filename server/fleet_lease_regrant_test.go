//go:build unix

package server

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFleetLeaseRefillOneCall: a `sluice serve` on a real Redis, one
// leased policy. A request on a key whose lease ended holding units refills
// the lease with one call to Redis, a regrant that gives the leftover back
// and grants the next lease (the store's calls by op, from /metrics), never
// a return and then a grant (a live lease's leftover too small for a cost
// is spent with the store's Take of the rest: one call too). The metrics say so under every failure
// policy: under error they counted every grant and regrant as a take.
func TestFleetLeaseRefillOneCall(t *testing.T) {
	for _, policy := range []string{"local", "error"} {
		t.Run(policy, func(t *testing.T) {
			f := startFleet(t, "redis://"+redistest.Addr(t), 1, `
policies:
  - name: hot
    limit: fixed_window 100000/hour
    lease: 250ms
`, "--failure-policy", policy)
			p := f.procs[0]
			key := fmt.Sprintf("refill-%s-%d", policy, time.Now().UnixNano())
			for i := range 60 {
				// Costs of 1 to 7: a lease sized by the demand seldom splits into
				// whole requests.
				code, js := p.post(t, "/v1/check", fmt.Sprintf(`{"policy":"hot","key":%q,"cost":%d}`, key, 1+i*5%7))
				if code != 200 || js["allowed"] != true {
					t.Fatalf("check %d: %d %v", i, code, js)
				}
				if i%10 == 9 {
					// The lease ends holding units. D is long enough that a
					// slow machine's requests still read as demand for a lease
					// (a key without it is not leased, and its units go back
					// with a return of their own).
					time.Sleep(300 * time.Millisecond)
				}
			}
			calls := storeCalls(t, p)
			returned := metric(t, p, "sluice_lease_units_returned_total")
			t.Logf("store calls by op: %v; lease units returned %v", calls, returned)
			if calls["regrant"] == 0 || returned <= 0 {
				t.Errorf("no regrant gave units back: calls %v, %v units returned", calls, returned)
			}
			if calls["grant"] == 0 {
				t.Errorf("calls %v: no grant counted", calls)
			}
			if calls["return"] != 0 {
				t.Errorf("%v returns sent on their own; want every refill's in its regrant", calls["return"])
			}
		})
	}
}

// storeCalls sums sluice_store_calls_total on p by op.
func storeCalls(t *testing.T, p *proc) map[string]float64 {
	t.Helper()
	_, body := p.get(t, "/metrics")
	calls := map[string]float64{}
	for line := range strings.Lines(body) {
		series, value, ok := strings.Cut(strings.TrimSpace(line), " ")
		if !ok || !strings.HasPrefix(series, "sluice_store_calls_total{") {
			continue
		}
		_, op, _ := strings.Cut(series, `op="`)
		op, _, _ = strings.Cut(op, `"`)
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		calls[op] += v
	}
	return calls
}
