package resilient

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/logpace"
)

// Pacing of the line for decisions the failure policy answers while the
// breaker stays closed (closedAnswers).
const (
	// closedGather is how long after an episode's first such answer its
	// line waits, counting the answers that follow: a burst is one line.
	closedGather = time.Second
	// closedQuiet is the least time between two such lines, so that a
	// backend failing a few calls all the time logs once a minute.
	closedQuiet = time.Minute
)

// closedMsg is the line's message. It must not read as a breaker
// transition ("breaker closed") or as the policy switching on.
const closedMsg = "resilient: failure policy answered failed calls (breaker still closed)"

// closedAnswers logs the decisions the failure policy answers while the
// breaker is closed: calls that failed alone (one timeout on a starved
// host, a key a Cluster node refuses), which no breaker transition tells.
// The first answer of an episode starts a line, written gather later (and
// no sooner than quiet after the last one) with the number of answers
// since the last line and the first of their errors; the breaker takes
// any pending line's count into its own when it opens (the same news: the
// policy answering), and Close writes it before the Store goes. Times are
// the real clock's: they pace lines, not limits.
type closedAnswers struct {
	log       *slog.Logger
	store     string
	partition string // "": the whole store
	policy    Policy
	pace      logpace.Pacer // Gather: closedGather; Every: closedQuiet

	mu    sync.Mutex
	first error         // the first error since the last line (nil: none had one)
	into  *takenAnswers // non-nil: take is collecting the pending line
}

// takenAnswers is a pending line that take collected instead of writing.
type takenAnswers struct {
	n     int64
	first error
}

// note counts one answer, for a call that failed with err.
func (c *closedAnswers) note(err error) {
	c.mu.Lock()
	if c.first == nil {
		c.first = err
	}
	c.mu.Unlock()
	c.pace.Log("", func(notLogged int64) { c.write(notLogged + 1) })
}

// flush writes the pending line now, if there is one.
func (c *closedAnswers) flush() { c.pace.Flush() }

// take returns the pending line's count of answers and first error, and
// drops the line (0, nil: none pending). The pacing goes on as if it had
// been written.
func (c *closedAnswers) take() (n int64, first error) {
	var got takenAnswers
	c.mu.Lock()
	c.into = &got
	c.mu.Unlock()
	c.pace.Flush()
	c.mu.Lock()
	c.into = nil
	c.mu.Unlock()
	return got.n, got.first
}

// write writes the line for n answers.
func (c *closedAnswers) write(n int64) {
	c.mu.Lock()
	first := c.first
	c.first = nil
	if c.into != nil {
		// A line its timer writes while take runs is taken too: the
		// breaker's line, about to be written, tells it.
		c.into.n += n
		if c.into.first == nil {
			c.into.first = first
		}
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	attrs := []any{"store", c.store}
	if c.partition != "" {
		attrs = append(attrs, "partition", c.partition)
	}
	attrs = append(attrs, "policy", c.policy.String(), "decisions", n)
	if first != nil {
		attrs = append(attrs, "error", first)
	}
	c.log.Log(context.Background(), slog.LevelWarn, closedMsg, attrs...)
}
