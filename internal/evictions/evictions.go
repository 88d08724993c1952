// Package evictions tells episodes of a memory store's evictions, for the
// stores that say when they evict (sluice serve's own, resilient's default
// fallback): a count grown since the last read starts an episode, and a
// quiet period without growth ends it, so that a flood of keys is one
// line at its start and one at its end however long it goes on.
package evictions

import (
	"sync"
	"time"

	"github.com/sluicehq/sluice/memory"
)

// Watch reads a store's evictions. Its zero value needs Store and Quiet.
type Watch struct {
	Store *memory.Store
	Quiet time.Duration // without growth this long, an episode ends

	mu    sync.Mutex
	last  memory.Evictions // at the last read
	start memory.Evictions // before the episode
	since time.Time        // the episode's start; zero between episodes
	grew  time.Time        // the episode's last growth seen
}

// Change is what a Read found.
type Change struct {
	Grown   memory.Evictions // since the last read; zero: none
	Started bool             // an episode started with this growth
	Ended   bool             // an episode ended: Total evicted in it over Lasted
	Total   memory.Evictions
	Lasted  time.Duration
}

// Read takes the store's counts at now.
func (w *Watch) Read(now time.Time) Change {
	e := w.Store.Evictions()
	w.mu.Lock()
	defer w.mu.Unlock()
	var c Change
	switch {
	case e.Keys > w.last.Keys:
		c.Grown = memory.Evictions{Keys: e.Keys - w.last.Keys, Exhausted: e.Exhausted - w.last.Exhausted}
		if w.since.IsZero() {
			w.since, w.start, c.Started = now, w.last, true
		}
		w.last, w.grew = e, now
	case !w.since.IsZero() && now.Sub(w.grew) >= w.Quiet:
		c.Ended, c.Lasted = true, w.grew.Sub(w.since)
		c.Total = memory.Evictions{Keys: w.last.Keys - w.start.Keys, Exhausted: w.last.Exhausted - w.start.Exhausted}
		w.since, w.start = time.Time{}, memory.Evictions{}
	}
	return c
}

// State returns the counts at the last read and when the episode on
// started (zero: none is).
func (w *Watch) State() (memory.Evictions, time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last, w.since
}
