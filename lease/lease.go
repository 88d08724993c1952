// Package lease decides at memory speed under one shared limit: it takes
// part of a key's budget from a store in one atomic step (a lease) and
// spends it locally, without a round trip per request, and it says exactly
// how far over the limit a fleet can go.
//
// A Store asks its sluice.Granter for up to Options.Size units of a key and
// admits requests from them in memory until they are spent or the lease
// expires. A lease lives at most the key's maximum staleness D
// (Options.MaxStaleness, or Options.For per key; zero: no lease), measured from
// when its grant was sent, so no network delay stretches it; under the
// window algorithms it also ends where the window it was taken from ends.
// When the store grants nothing, the Store remembers that until the key's
// retry time. Unused units go back to the store, under sluice.Granter's
// return rule, on the first request an expired lease or one too small
// cannot answer, and on Close; a lease forgotten among many idle keys
// strands its units, which can only lower admissions.
//
// # The bound
//
// Cumulative admissions never exceed what the store granted minus what was
// returned: a unit is admitted once, from a lease that holds it.
//
// GCRA, TokenBucket, LeakyBucket, with burst B and I = Limit.Interval (one
// unit per I, so r = 1/I ≤ Rate/Period): over any closed interval of time
// of length t, a fleet of any number of processes admits at most
//
//	B + ⌊(t + D) / I⌋
//
// that is B + r·(t + D): the exact limiter's bound plus r·D. Proof sketch.
// Without returns: a unit admitted at time x was granted at some g ≤ x no
// earlier than its lease's send time s ≥ x − D, so the units admitted in
// [a, a+t] were granted in [a−D, a+t], and the store, an exact limiter of
// burst B, grants at most B + ⌊(t+D)/I⌋ over a closed interval of that
// length. With returns: a lease granted k units at g and returns u ≤
// max(0, unused − c) at g + age, c being the refills (one per I) that can
// fall in (g, g+age]. Compare the same history in which the lease was
// granted only the k − unused units it used: its bucket held unused more
// units, and two buckets under the same refills and takes differ by less
// only where the fuller one is capped at B, which loses at most one unit per
// refill, so the difference is still at least unused − c ≥ u at the return.
// After the return the real bucket is therefore no fuller than the
// compared one; buckets are monotone (a fuller bucket grants everything a
// less full one does, and stays fuller), so every later grant was possible
// in the history without that return. By induction over returns, the
// admissions are those of a history without returns, bounded above. The
// bound is reached with equality (lease_test.go replays the schedule): a
// lease granted B−1 units at a−D while the next unit is 1µs away, one unit
// granted every I after it, each held by a request it cannot cover, and all
// spent from a on. A naive return (every unused unit, at any age) breaks
// it: a lease granted B, returned whole after the bucket refilled, lets the
// fleet take B again on top of the refills.
//
// FixedWindow: a lease never outlives the window its units were taken
// from, as the store's clock sees it, and its unused units return only into
// that window's count, so each window admits at most Rate, exactly as
// without leases. SlidingWindowCounter: the same, and at any local
// admission the weighted estimate of what was admitted is at most the
// estimate at the lease's grant, which was within the limit: the estimate
// never exceeds the limit. Its own approximation against a true sliding
// window is unchanged. The lifetime is measured on the process's clock from
// the send, and only the rate at which clocks run enters: a Store whose
// clock runs slower than the store's by a fraction ε may spend a lease up to
// ε·D after the window ended. With a store that dates grants by its
// callers' clocks (redisstore's Options.Clock) rather than its own, a
// window's units may be spent up to the callers' skew either side of its
// edges, as seen by one clock.
//
// SlidingWindowLog is refused (sluice.ErrGrantUnsupported): its units are
// dated when taken, so a leased unit spent later would leave the log early.
//
// # What callers see
//
// A decision answered from a lease has Source sluice.SourceLease, Remaining
// the units left in this process's lease (not the key's global figure), and
// ResetAfter the grant's ResetAfter less the lease's age. A request that a
// partial grant cannot cover is denied with a RetryAfter that is an upper
// bound (one Interval per missing unit; the window's end for the window
// algorithms) rather than exact. Peek answers from a live lease without
// taking, and otherwise asks the store. Reset drops this process's lease
// and resets the key; other processes' leases live on for at most D.
package lease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

var _ sluice.Store = (*Store)(nil)

var (
	// ErrInvalidStaleness: Options.MaxStaleness is negative, or neither it
	// nor Options.For is set, or a key's staleness is longer than its
	// limit's period.
	ErrInvalidStaleness = errors.New("lease: invalid maximum staleness")
	// ErrNoGranter: the Store is a zero value, or was built without a
	// granter.
	ErrNoGranter = errors.New("lease: no granter")
)

// Options configures a Store. MaxStaleness or For must be set.
type Options struct {
	// MaxStaleness (D) is the longest a lease lives, from when its grant
	// was sent: the most a fleet's admissions can run ahead of the store,
	// in units of time (see the package doc's bound). It must be no longer
	// than the Period of any limit the Store is used with. Default: none;
	// it must be positive when For is nil, and is unused when For is set.
	MaxStaleness time.Duration

	// For, when set, is each key's maximum staleness D in place of
	// MaxStaleness (a service knows each key's policy). Zero means no
	// lease: the key is answered exactly by the granter, as without
	// leases. A D below zero or longer than the limit's period is
	// ErrInvalidStaleness on that call. It is called once per decision and
	// must be safe for concurrent use. Default: nil, MaxStaleness for
	// every key.
	For func(key string, limit sluice.Limit) time.Duration

	// Size is how many units each grant asks for, capped at a limit's
	// Capacity (and raised to a request's cost). Default: a tenth of the
	// limit's Capacity, at least 1.
	Size int64

	// Clock returns the current time. Default time.Now. It measures lease
	// lifetimes and remembered denials only.
	Clock func() time.Time
}

// Store is a sluice.Store that answers from leases on a sluice.Granter. It
// is safe for concurrent use; at most one grant per key is in flight at a
// time in one Store. Build one with New and Close it to return unused
// units. The zero value refuses every call with ErrNoGranter.
type Store struct {
	granter   sluice.Granter
	staleness time.Duration
	stale     func(key string, limit sluice.Limit) time.Duration
	size      int64
	clock     func() time.Time

	mu      sync.Mutex
	leases  map[leaseKey]*lease
	sweepAt int // sweep idle leases when the map reaches this size

	local, grants, granted, returned atomic.Uint64
}

// Stats counts what a Store has done since New; every field is cumulative
// but Keys.
type Stats struct {
	Local    uint64 // decisions answered from a lease, without the store
	Grants   uint64 // grant calls sent to the store
	Granted  uint64 // units the store granted
	Returned uint64 // units the store took back
	Keys     int    // keys holding a lease or a remembered denial now
}

// Stats returns the Store's counters. It is safe to call at any time; a
// zero Store reports zeros.
func (s *Store) Stats() Stats {
	return Stats{
		Local:    s.local.Load(),
		Grants:   s.grants.Load(),
		Granted:  s.granted.Load(),
		Returned: s.returned.Load(),
		Keys:     s.Len(),
	}
}

// minSweep is the least number of leases held before idle ones are swept.
const minSweep = 10_000

type leaseKey struct {
	key   string
	limit sluice.Limit
}

// lease is one key's lease in this process; mu is held across store calls
// so that concurrent requests wait for one grant rather than each asking.
type lease struct {
	mu    sync.Mutex
	grant sluice.Grant
	units int64     // left to spend
	sent  time.Time // when grant was sent
	until time.Time // spendable while now ≤ until
	end   time.Time // window algorithms: spendable while now < end
	deny  time.Time // a zero grant is remembered until then
	reset time.Time // and the key was fresh again by then
}

// New returns a Store that leases from g. opts must set MaxStaleness or
// For.
func New(g sluice.Granter, opts *Options) (*Store, error) {
	if g == nil {
		return nil, ErrNoGranter
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.For == nil && o.MaxStaleness <= 0 {
		return nil, fmt.Errorf("%w: %v must be positive", ErrInvalidStaleness, o.MaxStaleness)
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	return &Store{granter: g, staleness: o.MaxStaleness, stale: o.For, size: o.Size, clock: o.Clock, leases: make(map[leaseKey]*lease), sweepAt: minSweep}, nil
}

// check validates a request against the Store and its limit, and returns
// the key's maximum staleness: zero when the key is not leased.
func (s *Store) check(key string, limit sluice.Limit, cost int64) (time.Duration, error) {
	if s.granter == nil {
		return 0, ErrNoGranter
	}
	d := s.staleness
	if s.stale != nil {
		d = s.stale(key, limit)
	}
	if d == 0 {
		return 0, nil
	}
	if err := sluice.ValidateGrant(key, limit, cost); err != nil {
		return 0, err
	}
	if d < 0 || d > limit.Period {
		return 0, fmt.Errorf("%w: %v for %v (its period is %v)", ErrInvalidStaleness, d, limit, limit.Period)
	}
	return d, nil
}

func (s *Store) lease(key string, limit sluice.Limit) *lease {
	k := leaseKey{key, limit}
	s.mu.Lock()
	defer s.mu.Unlock()
	l := s.leases[k]
	if l == nil {
		if len(s.leases) >= s.sweepAt {
			s.sweep()
		}
		l = new(lease)
		s.leases[k] = l
	}
	return l
}

// sweep forgets the leases that are idle: nothing to spend, no denial to
// remember, no call in flight. An expired lease's unused units are left
// with it: stranded, they can only lower admissions. It runs when the map
// has doubled since the last sweep, so its cost per new key is constant.
func (s *Store) sweep() {
	now := s.clock()
	for k, l := range s.leases {
		if !l.mu.TryLock() {
			continue
		}
		if !l.live(now) && !now.Before(l.deny) {
			delete(s.leases, k)
		}
		l.mu.Unlock()
	}
	s.sweepAt = max(minSweep, 2*len(s.leases))
}

// live reports whether l's units may be spent at now.
func (l *lease) live(now time.Time) bool {
	return l.units > 0 && !now.After(l.until) && (l.end.IsZero() || now.Before(l.end))
}

// local is the decision a lease makes at now.
func (l *lease) local(limit sluice.Limit, now time.Time, allowed bool) sluice.Decision {
	return sluice.Decision{
		Allowed:    allowed,
		Limit:      limit,
		Remaining:  l.units,
		ResetAfter: max(l.grant.ResetAfter-now.Sub(l.sent), 0),
		Source:     sluice.SourceLease,
	}
}

// Take implements sluice.Store: from the key's lease when it is live and
// holds cost units, and otherwise after returning what is left of it and
// asking for a new one.
func (s *Store) Take(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	stale, err := s.check(key, limit, cost)
	if err != nil {
		return sluice.Decision{}, err
	}
	if stale == 0 {
		return s.granter.Take(ctx, key, limit, cost)
	}
	l := s.lease(key, limit)
	l.mu.Lock()
	defer l.mu.Unlock()
	now := s.clock()
	if l.live(now) && l.units >= cost {
		l.units -= cost
		s.local.Add(1)
		return l.local(limit, now, true), nil
	}
	if now.Before(l.deny) {
		return sluice.Decision{Limit: limit, RetryAfter: l.deny.Sub(now), ResetAfter: max(l.reset.Sub(now), 0), Source: sluice.SourceDenyCache}, nil
	}
	if err := s.giveBack(ctx, key, limit, l); err != nil {
		return sluice.Decision{}, err
	}
	sent := s.clock()
	s.grants.Add(1)
	g, err := s.granter.Grant(ctx, key, limit, min(max(s.sizeFor(limit), cost), limit.Capacity()))
	if err != nil {
		return sluice.Decision{}, err
	}
	s.granted.Add(uint64(g.Granted))
	if g.Granted == 0 {
		l.deny, l.reset = sent.Add(g.RetryAfter), sent.Add(g.ResetAfter)
		return sluice.Decision{Limit: limit, RetryAfter: g.RetryAfter, ResetAfter: g.ResetAfter}, nil
	}
	l.grant, l.units, l.sent = g, g.Granted, sent
	l.until, l.end = sent.Add(stale), time.Time{}
	if g.Window > 0 {
		l.end = sent.Add(g.Window)
	}
	now = s.clock()
	if !l.live(now) || l.units < cost {
		d := l.local(limit, now, false)
		d.RetryAfter = time.Duration(cost-l.units) * limit.Interval()
		if g.Window > 0 {
			d.RetryAfter = max(l.end.Sub(now), time.Microsecond)
		}
		d.Source = sluice.SourceBackend
		return d, nil
	}
	l.units -= cost
	d := l.local(limit, now, true)
	d.Source = sluice.SourceBackend
	return d, nil
}

// sizeFor is the grant size Options.Size gives limit.
func (s *Store) sizeFor(limit sluice.Limit) int64 {
	if s.size > 0 {
		return s.size
	}
	return max(limit.Capacity()/10, 1)
}

// giveBack returns l's unused units, once: on an error they stay out of
// the store (a resent return could make budget).
func (s *Store) giveBack(ctx context.Context, key string, limit sluice.Limit, l *lease) error {
	if l.units == 0 {
		return nil
	}
	unused := l.units
	l.units = 0
	n, err := s.granter.Return(ctx, key, limit, l.grant, unused)
	if err != nil {
		return fmt.Errorf("lease: return: %w", err)
	}
	s.returned.Add(uint64(n))
	return nil
}

// Peek implements sluice.Store: a live lease that holds cost units answers
// without taking; otherwise the store does.
func (s *Store) Peek(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	stale, err := s.check(key, limit, cost)
	if err != nil {
		return sluice.Decision{}, err
	}
	if stale == 0 {
		return s.granter.Peek(ctx, key, limit, cost)
	}
	l := s.lease(key, limit)
	l.mu.Lock()
	now := s.clock()
	if l.live(now) && l.units >= cost {
		d := l.local(limit, now, true)
		l.mu.Unlock()
		return d, nil
	}
	l.mu.Unlock()
	return s.granter.Peek(ctx, key, limit, cost)
}

// Reset implements sluice.Store: it drops this process's lease (its units
// are not returned) and resets the key in the store. Other processes'
// leases live on for at most MaxStaleness.
func (s *Store) Reset(ctx context.Context, key string, limit sluice.Limit) error {
	if s.granter == nil {
		return ErrNoGranter
	}
	s.mu.Lock()
	delete(s.leases, leaseKey{key, limit})
	s.mu.Unlock()
	return s.granter.Reset(ctx, key, limit)
}

// Len returns the number of keys the Store holds a lease or a remembered
// denial for, idle ones not yet swept included.
func (s *Store) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.leases)
}

// Close returns every lease's unused units to the store, and forgets the
// leases. The Store still answers afterwards.
func (s *Store) Close(ctx context.Context) error {
	s.mu.Lock()
	leases := s.leases
	s.leases = make(map[leaseKey]*lease)
	s.mu.Unlock()
	var errs []error
	for k, l := range leases {
		l.mu.Lock()
		errs = append(errs, s.giveBack(ctx, k.key, k.limit, l))
		l.mu.Unlock()
	}
	return errors.Join(errs...)
}
