package memory

import (
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// params are a Limit in the integer microseconds every algorithm computes in.
type params struct {
	alg      sluice.Algorithm
	rate     int64 // units per period
	period   int64 // µs
	interval int64 // µs per unit (bucket algorithms and GCRA), rounded up
	capacity int64
	span     int64  // capacity × interval: how far GCRA's TAT may run ahead
	fillPer  uint64 // 2⁶²/capacity: fillOf multiplies, not divides, per decision
	limit    sluice.Limit
}

func newParams(l sluice.Limit) params {
	p := params{
		alg:      l.Algorithm,
		rate:     l.Rate,
		period:   l.Period.Microseconds(),
		interval: l.Interval().Microseconds(),
		capacity: l.Capacity(),
		limit:    l,
	}
	p.span = p.capacity * p.interval
	if p.capacity > 0 {
		p.fillPer = (1 << 62) / uint64(p.capacity)
	}
	return p
}

// limitCache holds the params of limits already validated, so a decision
// neither validates its limit again nor divides to derive it: both cost more
// than the decision itself. It is direct-mapped: a limit evicts the one in
// its slot, which only costs the next call on that one a validation.
type limitCache [16]atomic.Pointer[params]

// params returns limit's params, validating it on a miss (errors wrap
// sluice.ErrInvalidLimit, as Limit.Validate's do).
func (c *limitCache) params(limit sluice.Limit) (*params, error) {
	if p := c.lookup(limit); p != nil {
		return p, nil
	}
	if err := limit.Validate(); err != nil {
		return nil, err
	}
	p := newParams(limit)
	c.slot(limit).Store(&p)
	return &p, nil
}

// lookup returns limit's params if the cache holds them, else nil.
func (c *limitCache) lookup(limit sluice.Limit) *params {
	if p := c.slot(limit).Load(); p != nil && p.limit == limit {
		return p
	}
	return nil
}

func (c *limitCache) slot(limit sluice.Limit) *atomic.Pointer[params] {
	return &c[uint64(limit.Rate^int64(limit.Period)^limit.Burst^int64(limit.Algorithm))%uint64(len(c))]
}

// result is a decision in microseconds, as the Lua scripts return it.
type result struct {
	allowed   bool
	remaining int64
	retry     int64 // µs
	reset     int64 // µs
}

// fill writes r into d field by field: d's result registers are then
// loaded from stores of their own size, not from a copy of a whole
// Decision built on the stack, whose wide loads cannot be forwarded from
// the narrow stores that built it (a stall of several ns per decision).
func (r result) fill(d *sluice.Decision, l sluice.Limit) {
	d.Allowed = r.allowed
	d.Limit = l
	d.Remaining = max(r.remaining, 0)
	d.RetryAfter = time.Duration(r.retry) * time.Microsecond
	d.ResetAfter = time.Duration(max(r.reset, 0)) * time.Microsecond
}

// decide runs the limit's algorithm on st at now. With commit it takes cost
// units when they are available (mutating st) and reports the state after.
// Without commit (Peek) st is left as it was and Remaining and ResetAfter
// describe it as it is: only Allowed and RetryAfter depend on cost.
func decide(st *state, now int64, p *params, cost int64, commit bool) result {
	switch p.alg {
	case sluice.TokenBucket:
		return tokenBucket(st, now, p, cost, commit)
	case sluice.LeakyBucket:
		return leakyBucket(st, now, p, cost, commit)
	case sluice.FixedWindow:
		return fixedWindow(st, now, p, cost, commit)
	case sluice.SlidingWindowLog:
		return slidingWindowLog(st, now, p, cost, commit)
	case sluice.SlidingWindowCounter:
		return slidingWindowCounter(st, now, p, cost, commit)
	default:
		return gcra(st, now, p, cost, commit)
	}
}

// floorDiv is a/b rounded toward negative infinity (b > 0), as Lua's
// math.floor(a / b) is for the exact integers the scripts use.
func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && a < 0 {
		q--
	}
	return q
}
