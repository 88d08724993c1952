package server

import (
	"log/slog"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/internal/evictions"
	"github.com/sluicehq/sluice/internal/tick"
	"github.com/sluicehq/sluice/memory"
)

// MemoryStatus is the in-process memory store in /v1/status: the store
// itself without Redis, the local failure policy's with it.
type MemoryStatus struct {
	// Keys is how many keys it holds, MaxKeys how many it may (--max-keys).
	Keys    int `json:"keys"`
	MaxKeys int `json:"max_keys"`
	// EvictedKeys counts the keys evicted, since the start, to stay within
	// MaxKeys: each started its limit afresh. EvictedExhaustedKeys counts
	// those of them that had taken their whole limit (denying, or a
	// Penalty block).
	EvictedKeys          uint64 `json:"evicted_keys"`
	EvictedExhaustedKeys uint64 `json:"evicted_exhausted_keys"`
	// Evicting: an episode of evictions is on (see memoryWatch), since
	// EvictingSince.
	Evicting      bool       `json:"evicting"`
	EvictingSince *time.Time `json:"evicting_since,omitempty"`
}

// memoryWatch tells the memory store evicting keys, as evictionWatch
// tells Redis doing it: it reads the store's evictions on every poll (each
// store check interval) and each /metrics scrape. A count grown since the
// last read starts an episode: one WARN line, with the count, and the
// service degraded, with a reason, while it lasts; none for
// evictionQuietPolls polls ends it, with one INFO line and the episode's
// total. A flood of keys is thus two lines however long it goes on, and a
// new episode starts no sooner than a quiet period after the last.
type memoryWatch struct {
	store  *memory.Store
	log    *slog.Logger
	health *Health
	ep     evictions.Watch // Quiet: evictionQuietPolls polls
}

var (
	memoryEvictedDesc = prometheus.NewDesc("sluice_store_evicted_keys_total",
		"Keys the memory store evicted to stay within --max-keys; each starts its limit afresh.", []string{"store"}, nil)
	memoryExhaustedDesc = prometheus.NewDesc("sluice_store_evicted_exhausted_keys_total",
		"Of sluice_store_evicted_keys_total, keys that had taken their whole limit (denying, or a Penalty block): each may admit its whole limit again.", []string{"store"}, nil)
	memoryKeysDesc = prometheus.NewDesc("sluice_store_keys",
		"Keys the memory store holds.", []string{"store"}, nil)
	memoryMaxKeysDesc = prometheus.NewDesc("sluice_store_max_keys",
		"Keys the memory store may hold (--max-keys); past it, a new key evicts one.", []string{"store"}, nil)
)

// memoryEvictingMsg starts an episode.
const memoryEvictingMsg = "memory store evicting keys: it is full, and an evicted key starts its limit afresh; raise --max-keys, or use Redis"

func newMemoryWatch(store *memory.Store, log *slog.Logger, health *Health, every time.Duration) *memoryWatch {
	return &memoryWatch{store: store, log: log, health: health, ep: evictions.Watch{Store: store, Quiet: evictionQuietPolls * every}}
}

// poll reads the store's evictions at now.
func (w *memoryWatch) poll(now time.Time) {
	switch c := w.ep.Read(now); {
	case c.Started:
		w.log.Warn(memoryEvictingMsg, "evicted", c.Grown.Keys, "exhausted", c.Grown.Exhausted,
			"keys", w.store.Len(), "max_keys", w.store.MaxKeys())
		w.health.setEvicting("the memory store is full (--max-keys " + strconv.Itoa(w.store.MaxKeys()) +
			"): it evicts keys, each starting its limit afresh (store.memory counts them); raise --max-keys, or use Redis")
	case c.Ended:
		w.log.Info("memory store no longer evicting keys", "evicted", c.Total.Keys,
			"exhausted", c.Total.Exhausted, "lasted", c.Lasted.Round(time.Millisecond))
		w.health.setEvicting("")
	}
}

// watch polls every interval until stop is closed.
func (w *memoryWatch) watch(stop <-chan struct{}, every time.Duration) {
	tick.Every(stop, every, func() { w.poll(time.Now()) })
}

// status is the store in /v1/status, read now.
func (w *memoryWatch) status() *MemoryStatus {
	w.poll(time.Now())
	e := w.store.Evictions()
	st := &MemoryStatus{Keys: w.store.Len(), MaxKeys: w.store.MaxKeys(), EvictedKeys: e.Keys, EvictedExhaustedKeys: e.Exhausted}
	if _, since := w.ep.State(); !since.IsZero() {
		st.Evicting, st.EvictingSince = true, &since
	}
	return st
}

// Describe and Collect make the watch a collector of the store's figures,
// each labelled store="memory".
func (w *memoryWatch) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{memoryEvictedDesc, memoryExhaustedDesc, memoryKeysDesc, memoryMaxKeysDesc} {
		ch <- d
	}
}

func (w *memoryWatch) Collect(ch chan<- prometheus.Metric) {
	w.poll(time.Now())
	e := w.store.Evictions()
	ch <- prometheus.MustNewConstMetric(memoryEvictedDesc, prometheus.CounterValue, float64(e.Keys), "memory")
	ch <- prometheus.MustNewConstMetric(memoryExhaustedDesc, prometheus.CounterValue, float64(e.Exhausted), "memory")
	ch <- prometheus.MustNewConstMetric(memoryKeysDesc, prometheus.GaugeValue, float64(w.store.Len()), "memory")
	ch <- prometheus.MustNewConstMetric(memoryMaxKeysDesc, prometheus.GaugeValue, float64(w.store.MaxKeys()), "memory")
}
