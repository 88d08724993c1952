package memory

// gcra is the generic cell rate algorithm. State: a = TAT, the theoretical
// arrival time (µs) at which the key would be fresh again.
//
// Taking n units moves TAT to max(TAT, now) + n·interval; that is allowed
// while it stays within capacity·interval of now. One integer per key, no
// floating point, no drift.
//
// A TAT up to span ahead of now is the key's own; up to maxSkew further, a
// clock lagging the one that wrote it, charged as at that TAT. Further
// still, a longer span wrote it (the limit changed) or it is garbage: the
// key is fresh, as if it had expired. Mirrors redisstore/scripts/gcra.lua.
func gcra(st *state, now int64, p *params, cost int64, commit bool) result {
	span := p.span
	tat := st.a
	if st.expires == 0 || tat < now || tat-now > span+maxSkew {
		tat = now
	}
	next := tat + cost*p.interval
	var r result
	if next-now <= span {
		r.allowed = true
		if commit {
			tat = next
			st.a = tat
		}
	} else {
		r.retry = next - now - span
	}
	r.remaining = floorDiv(now+span-tat, p.interval)
	r.reset = tat - now
	return r
}
