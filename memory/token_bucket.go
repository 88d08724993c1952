package memory

// tokenBucket holds up to capacity whole tokens; one comes back every
// interval. State: a = tokens, b = time (µs) the last whole token arrived,
// or the time the bucket was last found full. Whole tokens and integer
// microseconds: no floating-point drift. It decides exactly as GCRA does.
// Mirrors redisstore/scripts/token_bucket.lua.
func tokenBucket(st *state, now int64, p *params, cost int64, commit bool) result {
	tokens, last := st.a, st.b
	if st.expires == 0 {
		tokens, last = p.capacity, now
	}
	tokens = min(tokens, p.capacity) // a larger burst wrote it
	if now > last {
		added := (now - last) / p.interval
		if tokens+added >= p.capacity {
			tokens, last = p.capacity, now
		} else {
			tokens += added
			last += added * p.interval
		}
	}
	var r result
	if tokens >= cost {
		r.allowed = true
		if commit {
			tokens -= cost
			st.a, st.b = tokens, last
		}
	} else {
		r.retry = last + (cost-tokens)*p.interval - now
	}
	r.remaining = tokens
	if tokens < p.capacity {
		r.reset = last + (p.capacity-tokens)*p.interval - now
	}
	return r
}
