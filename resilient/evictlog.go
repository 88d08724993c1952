package resilient

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/evictions"
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
	ep       evictions.Watch         // Quiet: evictQuiet
}

const (
	evictCheckEvery = time.Second
	evictQuiet      = time.Minute
)

func newEvictWatch(store *memory.Store, log *slog.Logger, name string, o sluice.Observer) *evictWatch {
	w := &evictWatch{store: store, log: log, name: name, ep: evictions.Watch{Store: store, Quiet: evictQuiet}}
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
	c := w.ep.Read(now)
	if c.Grown.Keys > 0 && w.observer != nil {
		w.observer.ObserveEvictions(sluice.EvictionEvent{Store: w.name, Keys: c.Grown.Keys, Exhausted: c.Grown.Exhausted})
	}
	switch {
	case c.Started:
		w.log.Log(context.Background(), slog.LevelWarn,
			"resilient: fallback store evicting keys: it is full, and an evicted key starts its limit afresh, beyond this process's share; raise Options.FallbackMaxKeys",
			"store", w.name, "evicted", c.Grown.Keys, "exhausted", c.Grown.Exhausted,
			"keys", w.store.Len(), "max_keys", w.store.MaxKeys())
	case c.Ended:
		w.log.Log(context.Background(), slog.LevelInfo, "resilient: fallback store no longer evicting keys",
			"store", w.name, "evicted", c.Total.Keys, "exhausted", c.Total.Exhausted,
			"lasted", c.Lasted.Round(time.Millisecond))
	}
}

// status reads the evictions now.
func (w *evictWatch) status(now time.Time) (memory.Evictions, bool) {
	w.read(now)
	last, since := w.ep.State()
	return last, !since.IsZero()
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
