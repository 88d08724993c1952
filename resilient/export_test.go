package resilient

import (
	"sync"
	"time"

	"github.com/sluicehq/sluice"
)

// ClosedMsg is the line closedAnswers writes, for external tests.
const ClosedMsg = closedMsg

// PaceClosedLines sets how long s gathers the failure policy's answers
// while the breaker is closed before its line, and the least time between
// two such lines, for tests that cannot wait a minute.
func PaceClosedLines(s *Store, gather, quiet time.Duration) {
	s.br.closed.pace.Gather, s.br.closed.pace.Every = gather, quiet
}

// StoreEvents records the store events it observes, for the tests in and
// outside the package.
type StoreEvents struct {
	mu sync.Mutex
	ev []sluice.StoreEvent
}

func (r *StoreEvents) ObserveDecision(sluice.DecisionEvent) {}
func (r *StoreEvents) ObserveBreaker(sluice.BreakerEvent)   {}
func (r *StoreEvents) ObserveStore(e sluice.StoreEvent) {
	r.mu.Lock()
	r.ev = append(r.ev, e)
	r.mu.Unlock()
}

// Take returns and forgets the events recorded so far.
func (r *StoreEvents) Take() []sluice.StoreEvent {
	r.mu.Lock()
	defer r.mu.Unlock()
	ev := r.ev
	r.ev = nil
	return ev
}
