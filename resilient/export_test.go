package resilient

import "time"

// ClosedMsg is the line closedAnswers writes, for external tests.
const ClosedMsg = closedMsg

// PaceClosedLines sets how long s gathers the failure policy's answers
// while the breaker is closed before its line, and the least time between
// two such lines, for tests that cannot wait a minute.
func PaceClosedLines(s *Store, gather, quiet time.Duration) {
	s.br.closed.pace.Gather, s.br.closed.pace.Every = gather, quiet
}
