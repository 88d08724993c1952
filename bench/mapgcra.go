package bench

import (
	"sync"
	"time"
)

// MapGCRA is the baseline the memory store is held to: the simplest honest
// in-process GCRA, one map from key to theoretical arrival time under one
// mutex, with a decision as complete as sluice's (allowed, remaining,
// retry and reset). It never forgets a key.
type MapGCRA struct {
	interval int64 // ns per unit
	span     int64 // ns: burst × interval, how far TAT may run ahead of now

	mu  sync.Mutex
	tat map[string]int64 // ns since the Unix epoch
}

// MapDecision is MapGCRA's verdict.
type MapDecision struct {
	Allowed    bool
	Remaining  int64
	RetryAfter time.Duration
	ResetAfter time.Duration
}

// NewMapGCRA returns a MapGCRA of rate units per period, burst rate.
func NewMapGCRA(rate int64, period time.Duration) *MapGCRA {
	interval := (int64(period) + rate - 1) / rate
	return &MapGCRA{interval: interval, span: rate * interval, tat: make(map[string]int64)}
}

// Take takes one unit of key.
func (g *MapGCRA) Take(key string) MapDecision {
	now := time.Now().UnixNano()
	g.mu.Lock()
	tat := max(g.tat[key], now)
	next := tat + g.interval
	var d MapDecision
	if next-now <= g.span {
		d.Allowed = true
		tat = next
		g.tat[key] = tat
	} else {
		d.RetryAfter = time.Duration(next - now - g.span)
	}
	g.mu.Unlock()
	d.Remaining = (now + g.span - tat) / g.interval
	d.ResetAfter = time.Duration(tat - now)
	return d
}

// Len returns the number of keys held.
func (g *MapGCRA) Len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.tat)
}
