package server

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/server/config"
)

// Statistics for the dashboard's chart: allowed and denied decisions per
// policy, those of them a lease answered, and the checks the store failed
// (outcome="error" in the metrics), in 5-second buckets over the last 5
// minutes.
const (
	StatsBucket  = 5 * time.Second
	StatsBuckets = 60
)

// Stats counts decisions made by the JSON API's check and by Envoy RLS in
// a ring of time buckets per policy. Safe for concurrent use; counting
// takes no lock.
type Stats struct {
	clock  func() time.Time
	mu     sync.Mutex // guards order and series (not the counts)
	order  []string
	series map[string]*ring
}

// ring is one policy's buckets, reused as time moves on.
type ring [StatsBuckets]bucket

type bucket struct{ allowed, denied, local, errors counter }

// counter packs the number of its bucket (the low 32 bits of unix time /
// StatsBucket: 680 years before they repeat) in its high half and its count
// in the low half, so that starting a new bucket and counting in it are one
// atomic step: no count is lost at a rollover, and counting takes no lock.
type counter struct{ v atomic.Uint64 }

func (c *counter) add(n int64) {
	epoch := uint64(uint32(n)) << 32
	for {
		old := c.v.Load()
		next := epoch | 1
		if old&^0xffffffff == epoch {
			next = old + 1
		}
		if c.v.CompareAndSwap(old, next) {
			return
		}
	}
}

// get is the count of bucket n, or 0 if the counter holds another bucket.
func (c *counter) get(n int64) int64 {
	if v := c.v.Load(); v>>32 == uint64(uint32(n)) {
		return int64(uint32(v))
	}
	return 0
}

func newStats(clock func() time.Time) *Stats {
	return &Stats{clock: clock, series: map[string]*ring{}}
}

// setPolicies keeps the counts of policies that survive a reload, in the
// new configuration's order, and returns each policy's ring.
func (s *Stats) setPolicies(ps []*config.Policy) map[string]*ring {
	s.mu.Lock()
	defer s.mu.Unlock()
	series := make(map[string]*ring, len(ps))
	order := make([]string, 0, len(ps))
	for _, p := range ps {
		r := s.series[p.Name]
		if r == nil {
			r = new(ring)
		}
		series[p.Name] = r
		order = append(order, p.Name)
	}
	s.series, s.order = series, order
	return series
}

func (s *Stats) now() int64 { return s.clock().UnixNano() / int64(StatsBucket) }

// add counts one decision in r; shadow denials count as denied.
func (s *Stats) add(r *ring, denied bool) {
	n := s.now()
	b := &r[slot(n)]
	if denied {
		b.denied.add(n)
	} else {
		b.allowed.add(n)
	}
}

// addError counts one check in r that the store failed: no decision, as
// the metrics' outcome="error".
func (s *Stats) addError(r *ring) {
	n := s.now()
	r[slot(n)].errors.add(n)
}

// addLocal counts one decision in r as answered from a lease, beside add.
func (s *Stats) addLocal(r *ring) {
	n := s.now()
	r[slot(n)].local.add(n)
}

// Series is one policy's counts, oldest bucket first; the last is the
// current one. Local counts the allowed and denied decisions that a lease
// answered in memory. Errors counts the checks the store failed, apart
// from Allowed and Denied: a shadow policy's among them, though its
// requests were let through.
type Series struct {
	Policy  string  `json:"policy"`
	Allowed []int64 `json:"allowed"`
	Denied  []int64 `json:"denied"`
	Local   []int64 `json:"local"`
	Errors  []int64 `json:"errors"`
}

// Snapshot returns every policy's series, in configuration order.
func (s *Stats) Snapshot() []Series {
	n := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Series, 0, len(s.order))
	for _, name := range s.order {
		r := s.series[name]
		ser := Series{Policy: name, Allowed: make([]int64, StatsBuckets), Denied: make([]int64, StatsBuckets), Local: make([]int64, StatsBuckets), Errors: make([]int64, StatsBuckets)}
		for i := range StatsBuckets {
			want := n - StatsBuckets + 1 + int64(i)
			b := &r[slot(want)]
			ser.Allowed[i], ser.Denied[i], ser.Local[i], ser.Errors[i] = b.allowed.get(want), b.denied.get(want), b.local.get(want), b.errors.get(want)
		}
		out = append(out, ser)
	}
	return out
}

func slot(n int64) int64 { return (n%StatsBuckets + StatsBuckets) % StatsBuckets }
