package resilient

import (
	"context"
	"log/slog"
	"sync"
	"time"
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
// The first answer of an episode schedules a line, written gather later
// (and no sooner than quiet after the last one) with the number of answers
// since the last line and the first of their errors; the breaker writes
// any pending line before its own when it opens, and Close before the
// Store goes. Times are the real clock's: they pace lines, not limits.
type closedAnswers struct {
	log    *slog.Logger
	store  string
	policy Policy
	gather time.Duration
	quiet  time.Duration

	mu    sync.Mutex
	n     int64       // answers since the last line
	first error       // the first of their errors (nil: none had one)
	last  time.Time   // when the last line was written
	timer *time.Timer // the pending line's; nil: none pending
}

// note counts one answer, for a call that failed with err.
func (c *closedAnswers) note(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.first == nil {
		c.first = err
	}
	if c.timer != nil {
		return
	}
	wait := max(c.gather, time.Until(c.last.Add(c.quiet)))
	var t *time.Timer
	t = time.AfterFunc(wait, func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.timer == t { // not written, nor rescheduled, since
			c.writeLocked()
		}
	})
	c.timer = t
}

// flush writes the pending line now, if there is one.
func (c *closedAnswers) flush() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.writeLocked()
}

func (c *closedAnswers) writeLocked() {
	if c.timer != nil {
		c.timer.Stop()
		c.timer = nil
	}
	if c.n == 0 {
		return
	}
	attrs := []any{"store", c.store, "policy", c.policy.String(), "decisions", c.n}
	if c.first != nil {
		attrs = append(attrs, "error", c.first)
	}
	c.log.Log(context.Background(), slog.LevelWarn, closedMsg, attrs...)
	c.n, c.first, c.last = 0, nil, time.Now()
}
