package memory

// fixedWindow counts units per calendar window [w·period, (w+1)·period).
// State: a = window number w, b = units taken in it. A denied request adds
// nothing, so the count never passes rate. Mirrors
// redisstore/scripts/fixed_window.lua.
func fixedWindow(st *state, now int64, p *params, cost int64, commit bool) result {
	w := floorDiv(now, p.period)
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
