package server

import (
	"sync"
	"time"
)

// Statistics for the dashboard's chart: allowed and denied decisions per
// policy in 5-second buckets over the last 5 minutes.
const (
	StatsBucket  = 5 * time.Second
	StatsBuckets = 60
)

// Stats counts decisions made by the JSON API's check and by Envoy RLS in
// a ring of time buckets per policy. Safe for concurrent use.
type Stats struct {
	clock  func() time.Time
	mu     sync.Mutex
	order  []string
	series map[string]*ring
}

type bucket struct {
	n               int64 // bucket number: unix time / StatsBucket
	allowed, denied int64
}

type ring [StatsBuckets]bucket

func newStats(clock func() time.Time) *Stats {
	return &Stats{clock: clock, series: map[string]*ring{}}
}

// setPolicies keeps the counts of policies that survive a reload, in the
// new configuration's order.
func (s *Stats) setPolicies(ps []*Policy) {
	s.mu.Lock()
	defer s.mu.Unlock()
	series := make(map[string]*ring, len(ps))
	s.order = s.order[:0]
	for _, p := range ps {
		r := s.series[p.Name]
		if r == nil {
			r = new(ring)
		}
		series[p.Name] = r
		s.order = append(s.order, p.Name)
	}
	s.series = series
}

func (s *Stats) now() int64 { return s.clock().UnixNano() / int64(StatsBucket) }

// add counts one decision; shadow denials count as denied.
func (s *Stats) add(policy string, denied bool) {
	n := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.series[policy]
	if r == nil {
		return
	}
	b := &r[slot(n)]
	if b.n != n {
		*b = bucket{n: n}
	}
	if denied {
		b.denied++
	} else {
		b.allowed++
	}
}

// Series is one policy's counts, oldest bucket first; the last is the
// current one.
type Series struct {
	Policy  string  `json:"policy"`
	Allowed []int64 `json:"allowed"`
	Denied  []int64 `json:"denied"`
}

// Snapshot returns every policy's series, in configuration order.
func (s *Stats) Snapshot() []Series {
	n := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Series, 0, len(s.order))
	for _, name := range s.order {
		r := s.series[name]
		ser := Series{Policy: name, Allowed: make([]int64, StatsBuckets), Denied: make([]int64, StatsBuckets)}
		for i := range StatsBuckets {
			want := n - StatsBuckets + 1 + int64(i)
			if b := r[slot(want)]; b.n == want {
				ser.Allowed[i], ser.Denied[i] = b.allowed, b.denied
			}
		}
		out = append(out, ser)
	}
	return out
}

func slot(n int64) int64 { return (n%StatsBuckets + StatsBuckets) % StatsBuckets }
