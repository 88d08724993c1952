package memory

import (
	"time"

	"github.com/sluicehq/sluice"
)

// maxSkew is sluice.MaxClockSkew in µs.
const maxSkew = int64(sluice.MaxClockSkew / time.Microsecond)

// lagging reports whether stored window sw is ahead of the caller's window
// w by no more than a clock lagging by up to maxSkew can explain: w+1 may
// start within a microsecond of now. Further ahead, sw counts windows of
// another period (the limit changed) and the state is stale. Counted in
// windows, so that sw·period is never computed for an sw that could
// overflow it.
func lagging(sw, w, period int64) bool {
	return sw > w && sw-w <= 1+maxSkew/period
}

// olderClock shifts a decision made at the start of the stored window back
// to a caller whose clock is skew behind it (another host's clock, or
// Redis's TIME after a failover; see lagging for how far). Such a caller is
// charged in the newer window, as at its start: an older window must never
// replace a newer one, which would admit its whole rate again.
func olderClock(skew int64, r result) result {
	if r.retry > 0 {
		r.retry += skew
	}
	if r.reset > 0 {
		r.reset += skew
	}
	return r
}

// fixedWindow counts units per calendar window [w·period, (w+1)·period).
// State: a = window number w, b = units taken in it. A denied request adds
// nothing, so the count never passes rate. A stored window other than w
// (and not lagging) counts nothing: the key is fresh. Mirrors
// redisstore/scripts/fixed_window.lua.
func fixedWindow(st *state, now int64, p *params, cost int64, commit bool) result {
	w := floorDiv(now, p.period)
	if st.expires != 0 && lagging(st.a, w, p.period) {
		return olderClock(st.a*p.period-now, fixedWindow(st, st.a*p.period, p, cost, commit))
	}
	count := st.b
	if st.expires == 0 || st.a != w {
		count = 0
	}
	end := (w + 1) * p.period
	var r result
	if count+cost <= p.rate {
		r.allowed = true
		if commit {
			count += cost
			st.a, st.b = w, count
		}
	} else {
		r.retry = end - now
	}
	r.remaining = p.rate - count
	if count > 0 {
		r.reset = end - now
	}
	return r
}
