// Package logpace paces log lines for repeated failures: per kind of
// failure, the first line at once, later ones at most once per period,
// and a line for those held back once the period ends, so that no
// failure goes uncounted when they stop within it.
package logpace

import (
	"sync"
	"time"
)

// DefaultEvery is a Pacer's period when Every is zero.
const DefaultEvery = time.Minute

// maxIdle is how many idle kinds a Pacer keeps before it sweeps them.
const maxIdle = 256

// Pacer paces lines by kind. The zero value is ready, with DefaultEvery.
// It is safe for concurrent use. Lines are written on the caller's
// goroutine, or on a timer's.
type Pacer struct {
	// Every is the least time between two lines of one kind.
	Every time.Duration
	// Gather, when positive, holds back a period's first event too, for
	// Gather, so that a burst is one line that counts all of it.
	Gather time.Duration

	mu    sync.Mutex
	kinds map[string]*kind
}

type kind struct {
	last  time.Time   // when its last line was written
	n     int64       // events since then, not written
	write func(int64) // the latest of them's line
	timer *time.Timer // writes it when the period ends; nil: none pending
}

// Log writes the line of an event of kind k: write(notLogged) writes it,
// with the number of earlier events of k that had no line. With no line
// of k in the last period it is written now, with 0 (or, with Gather,
// when Gather ends); else the event is held back, and when the period
// ends the latest held-back event's line is written with the number of
// the others.
func (p *Pacer) Log(k string, write func(notLogged int64)) {
	every := p.Every
	if every <= 0 {
		every = DefaultEvery
	}
	now := time.Now()
	p.mu.Lock()
	if p.kinds == nil {
		p.kinds = make(map[string]*kind)
	}
	c, ok := p.kinds[k]
	if !ok {
		if len(p.kinds) >= maxIdle {
			p.sweepLocked(now, every)
		}
		c = &kind{}
		p.kinds[k] = c
	}
	due := c.last.IsZero() || now.Sub(c.last) >= every
	if c.timer == nil && due && p.Gather <= 0 {
		c.last = now
		p.mu.Unlock()
		write(0)
		return
	}
	c.n++
	c.write = write
	if c.timer == nil {
		wait := p.Gather
		if !due {
			wait = max(wait, c.last.Add(every).Sub(now))
		}
		c.timer = time.AfterFunc(wait, func() { p.flush(c) })
	}
	p.mu.Unlock()
}

// Flush writes every held-back line now.
func (p *Pacer) Flush() {
	p.mu.Lock()
	var pending []*kind
	for _, c := range p.kinds {
		if c.timer != nil {
			c.timer.Stop()
			pending = append(pending, c)
		}
	}
	p.mu.Unlock()
	for _, c := range pending {
		p.flush(c)
	}
}

// flush writes c's held-back line.
func (p *Pacer) flush(c *kind) {
	p.mu.Lock()
	n, write := c.n, c.write
	c.n, c.write, c.timer, c.last = 0, nil, nil, time.Now()
	p.mu.Unlock()
	if n > 0 {
		write(n - 1)
	}
}

// sweepLocked forgets the kinds with nothing pending whose period is
// over: they would write at once anyway.
func (p *Pacer) sweepLocked(now time.Time, every time.Duration) {
	for k, c := range p.kinds {
		if c.timer == nil && now.Sub(c.last) >= every {
			delete(p.kinds, k)
		}
	}
}
