package resilient

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// evictWatch tells the default fallback store evicting keys, as sluice
// serve tells its own memory store doing it: an evicted key starts its
// limit afresh, so the fallback then admits more than its share, and the
// fleet bound stated in the package doc no longer holds. The evictions
// are read at most once every evictCheckEvery, on the calls of the Store
// (a Store nobody calls evicts nothing). A count grown since the last
// read starts an episode: one WARN line; evictQuiet without growth ends
// it, with one INFO line. Each growth is also an EvictionEvent for an
// Observer that is a sluice.EvictionObserver.
type evictWatch struct {
	store    *memory.Store
	log      *slog.Logger
	name     string
	observer sluice.EvictionObserver // nil: none
	next     atomic.Int64            // UnixNano of the next read

	mu    sync.Mutex
	last  memory.Evictions // at the last read
	start memory.Evictions // before the episode
	since time.Time        // the episode's start; zero between episodes
	grew  time.Time        // the episode's last growth seen
}

const (
	evictCheckEvery = time.Second
	evictQuiet      = time.Minute
)

func newEvictWatch(store *memory.Store, log *slog.Logger, name string, o sluice.Observer) *evictWatch {
	w := &evictWatch{store: store, log: log, name: name}
	w.observer, _ = o.(sluice.EvictionObserver)
	return w
}

// check reads the evictions at now, unless it did less than
// evictCheckEvery ago: one atomic load on every call.
func (w *evictWatch) check(now time.Time) {
	if w == nil {
		return
	}
	n := w.next.Load()
	if now.UnixNano() < n || !w.next.CompareAndSwap(n, now.Add(evictCheckEvery).UnixNano()) {
		return
	}
	w.read(now)
}

func (w *evictWatch) read(now time.Time) {
	e := w.store.Evictions()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case e.Keys > w.last.Keys:
		if w.observer != nil {
			w.observer.ObserveEvictions(sluice.EvictionEvent{Store: w.name, Keys: e.Keys - w.last.Keys, Exhausted: e.Exhausted - w.last.Exhausted})
		}
		if w.since.IsZero() {
			w.since, w.start = now, w.last
			w.log.Log(context.Background(), slog.LevelWarn,
				"resilient: fallback store evicting keys: it is full, and an evicted key starts its limit afresh, beyond this process's share; raise Options.FallbackMaxKeys",
				"store", w.name, "evicted", e.Keys-w.last.Keys, "exhausted", e.Exhausted-w.last.Exhausted,
				"keys", w.store.Len(), "max_keys", w.store.MaxKeys())
		}
		w.last, w.grew = e, now
	case !w.since.IsZero() && now.Sub(w.grew) >= evictQuiet:
		w.log.Log(context.Background(), slog.LevelInfo, "resilient: fallback store no longer evicting keys",
			"store", w.name, "evicted", w.last.Keys-w.start.Keys, "exhausted", w.last.Exhausted-w.start.Exhausted,
			"lasted", w.grew.Sub(w.since).Round(time.Millisecond))
		w.since, w.start = time.Time{}, memory.Evictions{}
	}
}

// status reads the evictions now.
func (w *evictWatch) status(now time.Time) (memory.Evictions, bool) {
	w.read(now)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.last, !w.since.IsZero()
}

// FallbackEvictions reports the keys the default fallback store (the
// memory store New makes under FallbackLocal when Options.Fallback is not
// set) has evicted since New, and whether it is evicting now: its
// evictions grew within the last minute. While it is, the fallback admits
// more than its share of the fleet bound, and a health check should say
// the Store is degraded. A Store with a fallback of its caller's (which
// the caller watches), or none, reports nothing.
func (s *Store) FallbackEvictions() (evicted memory.Evictions, evicting bool) {
	if s == nil || s.evict == nil {
		return memory.Evictions{}, false
	}
	return s.evict.status(s.clock())
}
