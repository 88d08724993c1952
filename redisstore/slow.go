package redisstore

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// slowLog's line is written once hurried calls have gone on for
// slowGather (a new connection's first call, its handshake included, is
// one sample of several round trips), at most once every slowEvery.
const (
	slowGather = time.Second
	slowEvery  = time.Minute
)

// slowLog writes the Store's line for a Redis whose round trip is a
// quarter or more of its callers' deadlines (hurried calls): still in
// use, but near the point where the failure policy answers for it.
type slowLog struct {
	log  *slog.Logger
	rtt  func() time.Duration // the Store's RoundTrip
	next atomic.Int64         // Unix ns before which no line is started; 0: any time
	n    atomic.Int64         // hurried calls since the last line
	last atomic.Int64         // the latest hurried call's budget, ns
}

// hurried counts a hurried call whose caller had budget left.
func (w *slowLog) hurried(budget time.Duration) {
	w.n.Add(1)
	w.last.Store(int64(budget))
	now := time.Now().UnixNano()
	next := w.next.Load()
	if now < next || !w.next.CompareAndSwap(next, now+int64(slowEvery)) {
		return
	}
	time.AfterFunc(slowGather, w.write)
}

// write writes the line, unless Redis is no longer that slow.
func (w *slowLog) write() {
	rtt, budget := w.rtt(), time.Duration(w.last.Load())
	n := w.n.Swap(0)
	if 4*rtt <= budget {
		w.next.Store(0) // a passing slowness: the next one may be told
		return
	}
	w.log.Warn("redisstore: Redis round trip over a quarter of the calls' deadline: they no longer wait to be batched, and fail once it nears the deadline",
		"round_trip", rtt.Round(100*time.Microsecond), "deadline", budget.Round(time.Millisecond), "calls", n)
}

// RoundTrip returns the Store's smoothed measure of Redis's round trip
// (the slowest master's, on a Cluster): the time its answered script calls
// took, an eighth of each new one mixed in. A send cut off unanswered, or
// answered only once a stall ended, measures the stall, not the round
// trip (Stalls counts those). 0 before the
// first call. A call queues for a batch only while this is under a
// quarter of what the call has left of its deadline (see the package doc).
// On a Cluster only the nodes that are masters now count: a master lost
// to a failover is asked nothing more, so its last, slow figure would
// stay for good.
func (s *Store) RoundTrip() time.Duration {
	if s == nil {
		return 0
	}
	rtt := s.solo.rtt.Load()
	if b := s.batch; b != nil {
		masters := b.masters()
		lanes := false
		b.lanes.Range(func(node, v any) bool {
			lanes = true
			if masters == nil || masters[node] {
				rtt = max(rtt, v.(*lane).rtt.Load())
			}
			return true
		})
		if !lanes { // a cluster's first calls' lane is left once lanes exist
			rtt = max(rtt, b.lane.rtt.Load())
		}
	}
	return time.Duration(rtt)
}

// masters returns the Cluster's masters now, as the lanes are keyed, or
// nil when that is not known (not a Cluster, or no slot map in time). From
// the slot map in memory (Masters): go-redis's ForEachMaster reloads it
// first, asking nodes one at a time, so a stopped node held RoundTrip (and
// a scrape of its metric) for the bound below, or returned nil.
func (b *batcher) masters() map[any]bool {
	if b.cluster == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), mastersTimeout)
	defer cancel()
	nodes, err := Masters(ctx, b.cluster)
	if err != nil {
		return nil
	}
	m := make(map[any]bool, len(nodes))
	for _, node := range nodes {
		m[node] = true
	}
	return m
}

// mastersTimeout bounds masters' wait for a slot map (it has one but
// while the Cluster client loads its first).
const mastersTimeout = 100 * time.Millisecond

// stallLog tells a lane's switches into and out of stalled (see lane):
// a WARN line when its sends start being cut off unanswered (and Redis
// leaves it unanswered for stallWait: see lane.suspect), an INFO line
// when one is answered again. Lines start at most once every stallEvery
// per lane, so that a flapping link does not flood the log; Stalls counts
// every switch. A nil *stallLog writes and counts nothing.
type stallLog struct {
	log   *slog.Logger
	count *atomic.Int64 // the Store's Stalls
	node  string        // the lane's master on a Cluster; "" for one server
	next  atomic.Int64  // Unix ns before which no WARN line is written
	since atomic.Int64  // Unix ns of the WARN line whose INFO line is due; 0: none
	cutAt atomic.Int64  // Unix ns of the stall's latest send cut off unanswered
	// ask sends the lane's server a script and returns its error (see
	// askScript); nil: no one server to ask (a Cluster's calls whose
	// master is not known), the lane's own answers tell.
	ask func(context.Context) error
	// refuses reports whether the lane's server refuses a connection now
	// (see dials.refuses); nil: not known, a stall is told.
	refuses func() bool
	// The lane's suspected stalls (lane.suspect), numbered; settled: the
	// last one told or found answered; asking: lane.confirm runs.
	mu                 sync.Mutex
	suspected, settled uint64
	asking             bool
}

// A send cut off unanswered is a stall once Redis has left the lane
// unanswered for stallWait from the send's start: stallAfter, or lateRTTs
// of its answered round trips if longer. Most sends last that long (a 50
// ms caller's, 150 ms), and are told at once; one cut sooner, by its
// caller's short deadline, may have had its reply on the way.
const stallAfter = 50 * time.Millisecond

func stallWait(rtt time.Duration) time.Duration { return max(stallAfter, lateRTTs*rtt) }

// askScript returns stallLog.ask for c: a script, not a PING, so that
// what holds the lane's calls (CLIENT PAUSE WRITE) holds it too. Nil for
// no client and for a Cluster, which has no one server to ask.
func askScript(c redis.UniversalClient) func(context.Context) error {
	if c == nil {
		return nil
	}
	if _, ok := c.(*redis.ClusterClient); ok {
		return nil
	}
	return func(ctx context.Context) error { return c.Eval(ctx, "return 1", nil).Err() }
}

// suspect settles the stall that a send cut off unanswered after d may
// have started (l has just switched to stalled): told at once when d is
// stallWait or more; else only if Redis leaves the lane unanswered for
// the rest of that time (confirm). A caller's own deadline shorter than
// a healthy Redis's reply (50 µs) cut its send, and was told as Redis
// stopping. The lane goes one batch at a time at once either way.
func (l *lane) suspect(d time.Duration) {
	w := l.stall
	if w == nil {
		return
	}
	wait := stallWait(l.answeredRTT()) - d
	w.mu.Lock()
	w.suspected++
	if wait <= 0 {
		w.settled = w.suspected
	}
	start := wait > 0 && !w.asking
	w.asking = w.asking || start
	w.mu.Unlock()
	switch {
	case wait <= 0:
		go l.tell()
	case start:
		go l.confirm(wait)
	}
}

// confirm settles l's suspected stalls, one at a time: the latest is told
// if l is still stalled once Redis has left a script of the lane's
// unanswered for wait; one answered ends l's stall.
func (l *lane) confirm(wait time.Duration) {
	w := l.stall
	for {
		w.mu.Lock()
		n := w.suspected
		if n == w.settled {
			w.asking = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
		answered := l.stalled.Load() && w.answers(wait)
		if answered {
			l.seen(0, nil)
		}
		w.mu.Lock()
		w.settled = max(w.settled, n)
		tell := !answered && l.stalled.Load() && n == w.suspected
		w.mu.Unlock()
		if tell {
			l.tell()
		}
		wait = stallWait(l.answeredRTT())
	}
}

// answers reports whether Redis answered the lane's script within wait,
// an error reply included. Without a script to send it only waits: the
// lane's own answers, if any, end the stall meanwhile.
func (w *stallLog) answers(wait time.Duration) bool {
	if w.ask == nil {
		time.Sleep(wait)
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	return !connLost(boundedErr(ctx, func() error { return w.ask(ctx) }))
}

// tell tells l's stall, unless its server refuses connections: a Redis
// that is down, not stalled, which its calls' errors and the caller's
// checks tell as unreachable. It may dial (dials.refuses), so it runs outside
// the send that found the stall.
func (l *lane) tell() {
	w := l.stall
	if w == nil || (w.refuses != nil && w.refuses()) || !l.stalled.Load() {
		return
	}
	w.stalled()
}

// stallEvery: at most one WARN line per lane this often.
const stallEvery = 10 * time.Second

func (w *stallLog) stalled() {
	if w == nil {
		return
	}
	w.count.Add(1)
	now := time.Now().UnixNano()
	w.cutAt.Store(now)
	next := w.next.Load()
	if now < next || !w.next.CompareAndSwap(next, now+int64(stallEvery)) {
		return
	}
	w.since.Store(now)
	w.log.Warn("redisstore: Redis stopped answering: its calls go one batch at a time, and hurried ones queue, until it answers",
		w.attrs("stalls", w.count.Load())...)
}

// cut notes a send cut off unanswered while the lane is stalled.
func (w *stallLog) cut() {
	if w != nil {
		w.cutAt.Store(time.Now().UnixNano())
	}
}

// answered writes the INFO line. When Redis resumed is known only between
// the stall's last send cut off and its first answer: nothing is sent
// between a stalled lane's calls, so with sparse calls the first answer
// comes with the next call, whenever that is. The line gives both bounds,
// from the WARN line: stalled_for_at_least, to the last send cut off;
// answered_after, to the first answer.
func (w *stallLog) answered() {
	if w == nil {
		return
	}
	since := w.since.Swap(0)
	if since == 0 {
		return
	}
	now := time.Now().UnixNano()
	w.log.Info("redisstore: Redis answering again",
		w.attrs("stalled_for_at_least", time.Duration(max(w.cutAt.Load()-since, 0)).Round(time.Millisecond),
			"answered_after", time.Duration(now-since).Round(time.Millisecond))...)
}

func (w *stallLog) attrs(kv ...any) []any {
	if w.node != "" {
		kv = append(kv, "node", w.node)
	}
	return kv
}

// Stalls returns how many times a Redis server (a Cluster master) stopped
// answering the Store's calls: a send cut off at its deadline unanswered
// after one was answered, and nothing answered for 50 ms (or 8 of its
// round trips, if longer) from that send's start; a send cut sooner by its
// caller's deadline is followed by a script of the Store's own, sent to
// learn whether Redis answers. A server that refuses connections then
// (killed, or down), or whose TCP connect times out (its host drops
// packets, or is gone), is unreachable, not stalled: it counts none, and
// writes no line (see WatchDials). While it lasts the Store sends that server
// one batch at a time (see the package doc).
func (s *Store) Stalls() int64 {
	if s == nil {
		return 0
	}
	return s.stalls.Load()
}
