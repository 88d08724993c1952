// Package middlewaretest holds what the tests of the HTTP middleware and
// the gRPC interceptors both set up: stores on the test's own Redis and
// memory, and recorders of the observations they report. The library's
// own tests take their stores from here too.
package middlewaretest

import (
	"sync"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// Memory is a memory store on the real clock, closed at cleanup.
func Memory(t testing.TB) *memory.Store {
	t.Helper()
	s := memory.New(nil)
	t.Cleanup(func() { s.Close() })
	return s
}

// Redis is a store on the test server, under a prefix of the test's own,
// on clk's time when clk is not nil.
func Redis(t testing.TB, clk *storetest.Clock) *redisstore.Store {
	t.Helper()
	opts := &redisstore.Options{Prefix: redistest.Prefix(t)}
	if clk != nil {
		opts.Clock = clk.Now
	}
	return redisstore.New(redistest.Client(t), opts)
}

// Decisions is an Observer counting decisions by "policy/outcome".
type Decisions struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *Decisions) add(k string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[k]++
}

func (d *Decisions) ObserveDecision(e sluice.DecisionEvent) {
	d.add(e.Policy + "/" + e.Outcome.String())
}
func (d *Decisions) ObserveStore(sluice.StoreEvent)     {}
func (d *Decisions) ObserveBreaker(sluice.BreakerEvent) {}

// Get is the count of k: "policy/outcome", or for Slots
// "policy/op/outcome" too.
func (d *Decisions) Get(k string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[k]
}

// Slots is Decisions counting in-flight slot events as well, by
// "policy/op/outcome".
type Slots struct{ Decisions }

func (s *Slots) ObserveSlot(e sluice.SlotEvent) {
	s.add(e.Policy + "/" + e.Op.String() + "/" + e.Outcome.String())
}
