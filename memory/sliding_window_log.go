package memory

import "math"

// slidingWindowLog records the time of every admitted unit and admits while
// fewer than rate units fall in (now−period, now]. A denied request records
// nothing. The retry time comes from the entry that must expire for cost
// units to fit. State: the log (sorted ascending); memory O(rate) per key.
// Mirrors redisstore/scripts/sliding_window_log.lua.
func slidingWindowLog(st *state, now int64, p *params, cost int64, commit bool) result {
	var empty ring
	lg := st.log
	switch {
	case lg != nil:
	case commit:
		st.log = new(ring)
		lg = st.log
	default:
		lg = &empty
	}
	threshold := now - p.period // entries at or before it have expired
	if commit {
		lg.dropThrough(threshold)
	}
	skip := lg.countThrough(threshold) // zero once pruned
	count := lg.n - skip
	var r result
	if count+cost <= p.rate {
		r.allowed = true
		if commit {
			count += cost
			for i := int64(0); i < cost; i++ {
				lg.insert(now, p.rate)
			}
		}
	} else {
		r.retry = lg.at(skip+count+cost-p.rate-1) + p.period - now
	}
	r.remaining = p.rate - count
	if count > 0 {
		newest := int64(math.MinInt64)
		if lg.n > 0 {
			newest = lg.at(lg.n - 1)
		}
		if r.allowed && commit {
			newest = max(newest, now)
		}
		r.reset = newest + p.period - now
	}
	return r
}

// ring is a sorted log of timestamps in a circular buffer that grows to at
// most the limit's rate.
type ring struct {
	buf  []int64
	head int64
	n    int64
}

func (g *ring) at(i int64) int64 { return g.buf[(g.head+i)%int64(len(g.buf))] }

func (g *ring) clear() { g.head, g.n = 0, 0 }

// countThrough returns how many entries are <= t (a prefix, as g is sorted).
func (g *ring) countThrough(t int64) int64 {
	lo, hi := int64(0), g.n
	for lo < hi {
		mid := (lo + hi) / 2
		if g.at(mid) <= t {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

func (g *ring) dropThrough(t int64) {
	k := g.countThrough(t)
	if k == g.n {
		g.clear()
		return
	}
	g.head = (g.head + k) % int64(len(g.buf))
	g.n -= k
}

// insert adds v keeping the log sorted. Callers ensure n < limit.
func (g *ring) insert(v, limit int64) {
	if g.n == int64(len(g.buf)) {
		g.grow(limit)
	}
	size := int64(len(g.buf))
	i := g.n
	// Time normally moves forward, so this loop rarely runs.
	for i > 0 && g.at(i-1) > v {
		g.buf[(g.head+i)%size] = g.at(i - 1)
		i--
	}
	g.buf[(g.head+i)%size] = v
	g.n++
}

func (g *ring) grow(limit int64) {
	size := min(max(2*int64(len(g.buf)), 4), limit)
	buf := make([]int64, size)
	for i := int64(0); i < g.n; i++ {
		buf[i] = g.at(i)
	}
	g.buf, g.head = buf, 0
}
