package memory

import "math"

// slidingWindowCounter estimates the units in the last period as
// prev·(period−elapsed)/period + cur, where cur counts the current fixed
// window, prev the one before and elapsed is the time into the current one.
// It checks the estimate before incrementing, so denials never inflate it.
// State: a = current window number, b = cur, c = prev: constant memory.
//
// The estimate is a float64 computed with exactly the operations, in exactly
// the order, of redisstore/scripts/sliding_window_counter.lua (explicit float64
// conversions stop Go from fusing them), so both agree bit for bit.
func slidingWindowCounter(st *state, now int64, p *params, cost int64, commit bool) result {
	w := floorDiv(now, p.period)
	if st.expires != 0 && lagging(st.a, w, p.period) {
		return olderClock(st.a*p.period-now, slidingWindowCounter(st, st.a*p.period, p, cost, commit))
	}
	cur, prev := swcRoll(st, w)
	var r result
	if swcEstimate(prev, cur, now-w*p.period, p.period)+float64(cost) <= float64(p.rate) {
		r.allowed = true
		if commit {
			cur += cost
			st.a, st.b, st.c = w, cur, int32(prev) // prev ≤ rate ≤ sluice.MaxRate
		}
	} else {
		r.retry = swcRetry(w, cur, prev, now, p, cost) - now
	}
	r.remaining = int64(math.Floor(float64(p.rate) - swcEstimate(prev, cur, now-w*p.period, p.period)))
	switch {
	case cur > 0:
		r.reset = (w+2)*p.period - now
	case prev > 0:
		r.reset = (w+1)*p.period - now
	}
	return r
}

// swcRoll returns the current and previous counts as seen from window w.
func swcRoll(st *state, w int64) (cur, prev int64) {
	switch {
	case st.expires == 0:
		return 0, 0
	case st.a == w:
		return st.b, int64(st.c)
	case st.a == w-1:
		return 0, st.b
	default:
		return 0, 0
	}
}

func swcEstimate(prev, cur, elapsed, period int64) float64 {
	weight := float64(float64(period-elapsed) / float64(period))
	return float64(float64(prev)*weight) + float64(cur)
}

// swcRetry finds the first instant t at which cost units fit. It solves the
// estimate for t in exact arithmetic, then checks that against the float
// estimate the decisions use: that estimate never grows with t, so fits is
// monotone, and when the solution is not the first instant that fits (a
// small weighted count can vanish in the float sum beside a large rate, up
// to seconds before the solution over 366 days) a bisection finds it.
func swcRetry(w, cur, prev, now int64, p *params, cost int64) int64 {
	fits := func(t int64) bool {
		tw := floorDiv(t, p.period)
		c, pv := cur, prev
		switch tw {
		case w:
		case w + 1:
			c, pv = 0, cur
		default:
			c, pv = 0, 0
		}
		return swcEstimate(pv, c, t-tw*p.period, p.period)+float64(cost) <= float64(p.rate)
	}
	var t int64
	if free := p.rate - cur - cost; free >= 0 && prev > 0 {
		e := int64(math.Ceil(float64(p.period) - float64(free)*float64(p.period)/float64(prev)))
		t = w*p.period + max(e, 0)
	}
	if t == 0 || t >= (w+1)*p.period { // not this window: the next one
		e := int64(0)
		if cur > 0 {
			e = int64(math.Ceil(float64(p.period) - float64(p.rate-cost)*float64(p.period)/float64(cur)))
		}
		t = (w+1)*p.period + min(max(e, 0), p.period)
	}
	t = max(t, now+1)
	for i := 0; i < 3 && !fits(t); i++ {
		t++
	}
	if !fits(t) {
		t = (w + 2) * p.period // nothing counted is left: cost ≤ rate fits
	}
	if t-1 > now && fits(t-1) { // fits(now) is false: it was denied
		lo := now
		for t-lo > 1 {
			mid := lo + (t-lo)/2
			if fits(mid) {
				t = mid
			} else {
				lo = mid
			}
		}
	}
	return t
}
