package memory

// leakyBucket is the leaky bucket as a meter: each unit adds one to the
// level, which drains one every interval; a request fits while
// level + cost <= capacity. State: a = level, b = time (µs) of the last
// whole leak, or when the bucket was last found empty. Integer throughout,
// so the remaining count is the floored one. It decides exactly as GCRA and
// the token bucket do. Mirrors redisstore/scripts/leaky_bucket.lua.
func leakyBucket(st *state, now int64, p *params, cost int64, commit bool) result {
	level, last := st.a, st.b
	if st.expires == 0 {
		level, last = 0, now
	}
	// A larger burst wrote it: full at last, and draining since, so that
	// the key admits again within this limit's capacity × interval.
	level = min(level, p.capacity)
	if now > last {
		leaked := (now - last) / p.interval
		if leaked >= level {
			level, last = 0, now
		} else {
			level -= leaked
			last += leaked * p.interval
		}
	}
	var r result
	if level+cost <= p.capacity {
		r.allowed = true
		if commit {
			level += cost
			st.a, st.b = level, last
		}
	} else {
		r.retry = last + (level+cost-p.capacity)*p.interval - now
	}
	r.remaining = p.capacity - level
	if level > 0 {
		r.reset = last + level*p.interval - now
	}
	return r
}
