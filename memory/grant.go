package memory

import (
	"context"
	"math"
	"time"

	"github.com/sluicehq/sluice"
)

var _ sluice.Granter = (*Store)(nil)

// Grant implements sluice.Granter: it takes what a Peek says is available,
// up to n, through the algorithm's own take.
func (s *Store) Grant(ctx context.Context, key string, limit sluice.Limit, n int64) (sluice.Grant, error) {
	if err := ctxErr(ctx); err != nil {
		return sluice.Grant{}, err
	}
	if err := sluice.ValidateGrant(key, limit, n); err != nil {
		return sluice.Grant{}, err
	}
	if s.zero() {
		return sluice.Grant{}, s.unbuilt()
	}
	p := newParams(limit)
	sh, tag, now := s.lock(key, limit.Algorithm)
	defer sh.mu.Unlock()
	return sh.grant(tag, key, limit, &p, n, now), nil
}

// Return implements sluice.Granter.
func (s *Store) Return(ctx context.Context, key string, limit sluice.Limit, g sluice.Grant, unused int64) (int64, error) {
	if err := ctxErr(ctx); err != nil {
		return 0, err
	}
	if err := sluice.ValidateReturn(key, limit, g, unused); err != nil {
		return 0, err
	}
	if s.zero() {
		return 0, s.unbuilt()
	}
	p := newParams(limit)
	sh, tag, now := s.lock(key, limit.Algorithm)
	defer sh.mu.Unlock()
	return sh.giveBack(tag, key, limit, &p, g, unused, now), nil
}

// Regrant implements sluice.Regranter: Return then Grant under one lock,
// at one reading of the clock.
func (s *Store) Regrant(ctx context.Context, key string, limit sluice.Limit, g sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	if err := ctxErr(ctx); err != nil {
		return 0, sluice.Grant{}, err
	}
	if err := sluice.ValidateRegrant(key, limit, g, unused, n); err != nil {
		return 0, sluice.Grant{}, err
	}
	if s.zero() {
		return 0, sluice.Grant{}, s.unbuilt()
	}
	p := newParams(limit)
	sh, tag, now := s.lock(key, limit.Algorithm)
	defer sh.mu.Unlock()
	back := sh.giveBack(tag, key, limit, &p, g, unused, now)
	return back, sh.grant(tag, key, limit, &p, n, now), nil
}

// grant is Grant at now on sh, which must be locked.
func (sh *shard) grant(tag uint32, key string, limit sluice.Limit, p *params, n, now int64) sluice.Grant {
	e := sh.find(tag, key, p.alg)
	var st state
	if e.found() {
		if st = e.get(); st.expires <= now { // expired but not yet swept: fresh again
			st.a, st.b, st.c, st.fill, st.expires = 0, 0, 0, 0, 0
		}
	}
	r, granted := grant(&st, now, p, n)
	epoch := sh.epoch(key, limit, now, granted > 0)
	at := now
	if granted > 0 {
		st.expires = now + r.reset
		st.fill = fillOf(&r, p)
		if e.found() {
			e.set(&st)
		} else {
			sh.insert(tag, key, p.alg, &st, now)
		}
		if windowed(limit.Algorithm) {
			at = max(now, st.a*p.period) // charged in a newer window: as at its start
		}
	}
	g := grantOf(limit, r, granted, at, now)
	g.Epoch = epoch
	return g
}

// giveBack is Return at now on sh, which must be locked: it reports what
// the key took back.
func (sh *shard) giveBack(tag uint32, key string, limit sluice.Limit, p *params, g sluice.Grant, unused, now int64) int64 {
	give := unused
	if !windowed(limit.Algorithm) {
		give = sluice.ReturnAllowance(limit, unused, grantAge(now, g.At))
	}
	e := sh.find(tag, key, p.alg)
	if give == 0 || !e.found() {
		return 0
	}
	st := e.get()
	if st.expires <= now || sh.epoch(key, limit, now, false) != g.Epoch {
		return 0 // a fresh or reset key has nothing to give back into
	}
	// Report what the key took back: what a take could have more now.
	before := decide(&st, now, p, 1, false).remaining
	after := p.capacity
	if refund(&st, now, p, give, g.At) {
		sh.remove(tag, key, p.alg)
		sh.n--
	} else {
		r := decide(&st, now, p, 1, false)
		after, st.fill = r.remaining, fillOf(&r, p)
		e.set(&st)
	}
	return min(give, max(after-before, 0))
}

// grantAge is the age at now of a grant made at, µs. At is the caller's
// to forge: one so far in the past that now-at wraps (near
// math.MinInt64) is as old as can be, nothing to give back, as redisstore
// (whose script computes in floats) finds it, not a negative age, which
// ReturnAllowance reads as 0 and gave every unit back; so far in the
// future, as young as can be.
func grantAge(now, at int64) int64 {
	age := now - at
	if (now^at)&(now^age) < 0 { // wrapped: now and at of unlike signs, age of at's
		if at < 0 {
			return math.MaxInt64
		}
		return math.MinInt64
	}
	return age
}

// refund returns u units to st, taken at µs (the window algorithms'
// grant time), and reports whether st is fresh again. The bucket
// algorithms and GCRA decide alike, so each state is read through a Peek as
// the time until it is fresh, which u units shorten by u intervals.
func refund(st *state, now int64, p *params, u, at int64) (fresh bool) {
	switch p.alg {
	case sluice.FixedWindow:
		if st.a == floorDiv(at, p.period) {
			st.b -= u
		}
		return st.b <= 0
	case sluice.SlidingWindowCounter:
		switch w := floorDiv(at, p.period); st.a {
		case w:
			st.b = max(st.b-u, 0)
		case w + 1:
			st.c = int32(max(int64(st.c)-u, 0))
		default:
			return false
		}
		switch {
		case st.b > 0:
			st.expires = (st.a + 2) * p.period
		case st.c > 0:
			st.expires = (st.a + 1) * p.period
		}
		return st.b == 0 && st.c == 0
	}
	r := decide(st, now, p, 1, false)
	reset := r.reset - u*p.interval
	if reset <= 0 {
		return true
	}
	st.expires = now + reset
	switch p.alg {
	case sluice.TokenBucket:
		tokens := r.remaining + u
		st.a, st.b = tokens, now+reset-(p.capacity-tokens)*p.interval
	case sluice.LeakyBucket:
		level := p.capacity - r.remaining - u
		st.a, st.b = level, now+reset-level*p.interval
	default:
		st.a = now + reset
	}
	return false
}

func windowed(a sluice.Algorithm) bool {
	return a == sluice.FixedWindow || a == sluice.SlidingWindowCounter
}

// lock locks key's shard and returns it, key's tag under algorithm a, and
// the time read under the lock.
func (s *Store) lock(key string, a sluice.Algorithm) (*shard, uint32, int64) {
	sh, tag := s.locate(key, a)
	sh.mu.Lock()
	return sh, tag, s.now()
}

// grant takes min(n, available) units from st, as a Peek counts them. The
// take is tried once more, one unit smaller, where the sliding window
// counter's floored estimate and its float comparison disagree by a
// rounding.
func grant(st *state, now int64, p *params, n int64) (result, int64) {
	r := decide(st, now, p, 1, false)
	k := min(n, r.remaining)
	for _, try := range [2]int64{k, k - 1} {
		if try < 1 {
			break
		}
		if t := decide(st, now, p, try, true); t.allowed {
			return t, try
		}
	}
	r.retry = max(r.retry, 1) // no whole unit now, whatever the rounding
	return r, 0
}

// grantOf reports a grant of granted units at now (µs), charged at at (µs,
// see sluice.Grant.At), after result r.
func grantOf(l sluice.Limit, r result, granted, at, now int64) sluice.Grant {
	var d sluice.Decision
	r.fill(&d, l)
	g := sluice.Grant{Granted: granted, Limit: l, Remaining: d.Remaining, ResetAfter: d.ResetAfter, At: at}
	if granted == 0 {
		g.RetryAfter = d.RetryAfter
		return g
	}
	if l.Algorithm == sluice.FixedWindow || l.Algorithm == sluice.SlidingWindowCounter {
		period := l.Period.Microseconds()
		g.Window = time.Duration((floorDiv(at, period)+1)*period-now) * time.Microsecond
	}
	return g
}

// resetKey names a key under one algorithm, as the table's tag does.
type resetKey struct {
	key string
	alg sluice.Algorithm
}

// mark counts a key's Resets (its epoch) until no return of a grant made
// before the last Reset or since could give anything back (µs).
type mark struct{ epoch, until int64 }

// markReset starts a new epoch of a key that held state, at now, so that a
// return of a grant made before gives nothing back into the key as it is
// now (sluice.Granter's contract).
func (sh *shard) markReset(key string, l sluice.Limit, now int64) {
	if l.Algorithm == sluice.SlidingWindowLog {
		return // never granted
	}
	k := resetKey{key, l.Algorithm}
	m := sh.resets[k]
	if now >= m.until {
		m = mark{}
	}
	// The longer of the Reset's horizon and that of the grants made before,
	// whose limit a reload may have changed (see epoch).
	sh.putMark(k, mark{epoch: m.epoch + 1, until: max(m.until, now+sluice.ReturnHorizon(l).Microseconds())})
}

// putMark stores m under k. The marks are bounded as the keys are: at
// MaxKeys, one is dropped at random, which can only let one return through
// that the mark would have stopped.
func (sh *shard) putMark(k resetKey, m mark) {
	if sh.resets == nil {
		sh.resets = make(map[resetKey]mark)
	}
	if _, had := sh.resets[k]; !had && len(sh.resets) >= sh.maxKeys {
		for k := range sh.resets {
			delete(sh.resets, k)
			break
		}
	}
	sh.resets[k] = m
}

// epoch is key's epoch under l at now: 0 for a key never Reset, or not for
// long. granting keeps the epoch for the horizon of a grant made now: a
// Reset meanwhile counts on from it, so the grant's return finds another
// epoch even when the Reset's limit (reloaded) has a shorter horizon; had
// the mark lapsed and come back at 0, the grant's 0 would pass for the new
// key's.
func (sh *shard) epoch(key string, l sluice.Limit, now int64, granting bool) int64 {
	k := resetKey{key, l.Algorithm}
	m := sh.resets[k]
	if now >= m.until { // none, or lapsed
		m = mark{}
	}
	if granting {
		m.until = max(m.until, now+sluice.ReturnHorizon(l).Microseconds())
		sh.putMark(k, m)
	}
	return m.epoch
}

// sweepResets forgets the marks no return can reach any more, a chunk at
// a time (h), as sweepSlots walks its map. The caller holds sh.mu.
func (sh *shard) sweepResets(now int64, h *sweepHold) {
	for k, m := range sh.resets {
		if m.until <= now {
			delete(sh.resets, k)
		}
		h.walked(1)
	}
}
