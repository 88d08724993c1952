package resilient

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ctxutil"
	"github.com/sluicehq/sluice/internal/logpace"
)

// In-flight slots go to the backend under the breaker, as takes do. When
// the backend fails or the breaker is open, the policy answers an
// Acquire: FallbackLocal acquires in the fallback store against a 1/n
// share of Max (n the fleet size, as for rates: a weight w is charged as
// w·n against Max, or Max when w·n is larger, so that the share survives a
// change of n); FailOpen admits, holding nothing; FailClosed denies. A
// holder granted by the policy is remembered here, and its Extend and
// Release go where it was granted; every other holder's go to the backend.
// A holder ReleaseOnce freed where the policy granted it stays remembered
// while its release is, so that the release sent again goes there too.
// In-flight denials never enter the deny cache: a slot can free at any
// instant.

// slotGrant is where a holder was granted by the policy, and until when
// this Store remembers it: its hold's end.
type slotGrant struct {
	open    bool // FailOpen: nothing is held in the fallback
	expires time.Time
	// backend: the backend's Acquire failed, perhaps after running, so the
	// backend may hold the holder too; its release frees it there as well.
	backend bool
	// released: ReleaseOnce freed it, and expires is when its release is
	// forgotten. Kept so that the release sent again goes where the
	// release is remembered, not to the backend, which never held it.
	released bool
}

type slotRef struct{ key, holder string }

// policySlots remembers the holders the policy granted. The zero value is
// empty and ready. While it is empty (the backend healthy) lookups take no
// lock.
type policySlots struct {
	mu    sync.Mutex
	m     map[slotRef]slotGrant
	prune int          // size at which expired entries are next dropped
	size  atomic.Int64 // len(m), for lookups that need no lock
}

func (p *policySlots) put(r slotRef, g slotGrant, now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = make(map[slotRef]slotGrant)
	}
	p.m[r] = g
	if len(p.m) >= p.prune { // amortised: the map at most doubles between prunes
		for k, v := range p.m {
			if !now.Before(v.expires) {
				delete(p.m, k)
			}
		}
		p.prune = max(2*len(p.m), 64)
	}
	p.size.Store(int64(len(p.m)))
}

// get returns r's grant if the policy granted it and its hold has not
// ended.
func (p *policySlots) get(r slotRef, now time.Time) (slotGrant, bool) {
	if p.size.Load() == 0 {
		return slotGrant{}, false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	g, ok := p.m[r]
	return g, ok && now.Before(g.expires)
}

func (p *policySlots) forget(r slotRef) {
	if p.size.Load() == 0 {
		return
	}
	p.mu.Lock()
	delete(p.m, r)
	p.size.Store(int64(len(p.m)))
	p.mu.Unlock()
}

// Acquire implements sluice.Slots.
func (s *Store) Acquire(ctx context.Context, key string, l sluice.InFlightLimit, weight int64, holder string) (sluice.SlotDecision, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := sluice.ValidateSlot(key, l, weight, holder); err != nil {
		return sluice.SlotDecision{}, err
	}
	bs, err := s.slotBackend()
	if err != nil {
		return sluice.SlotDecision{}, err
	}
	if err := s.ended(ctx, "acquire"); err != nil {
		return sluice.SlotDecision{}, err
	}
	now := s.clock()
	s.evict.check(now)
	b := s.breakerFor(key)
	call, tn := b.allow(now)
	if !call {
		return s.failSlot(ctx, b, key, l, weight, holder, now, 0, nil)
	}
	d, lat, err := bounded(ctx, s.timeout, s.inline, func(ctx context.Context) (sluice.SlotDecision, error) {
		return bs.Acquire(ctx, key, l, weight, holder)
	})
	if err == nil {
		s.answered(b, tn, now, d.Allowed) // a denial wrote nothing
		s.observe("acquire", key, sluice.SourceBackend, lat, nil)
		if d.Allowed { // a resend, now held by the backend: free its fallback slot
			ref := slotRef{key, holder}
			if g, ok := s.slots.get(ref, now); ok && !g.open {
				if fb, ok := s.fallback.(sluice.Slots); ok {
					_, _ = fb.Release(ctx, key, holder) // failed, the hold frees it
				}
			}
			s.slots.forget(ref)
			s.sent.forget(ref)
		}
		return d, nil
	}
	// The acquire may have run in the backend all the same: remembered, so
	// that AbandonSlot releases it there, and only such holders.
	s.sent.put(slotRef{key, holder}, slotGrant{expires: now.Add(l.Hold)}, now)
	if err := s.callerFault(ctx, "acquire", err, gate{b, tn}); err != nil {
		return sluice.SlotDecision{}, err
	}
	b.failure(tn, now, s.clock(), err)
	return s.failSlot(ctx, b, key, l, weight, holder, now, lat, err)
}

// AbandonSlot releases holder, given up after its Acquire failed or the
// policy denied it, in the backend, when its backend Acquire failed and so
// may have run: straight to the backend in the background
// (sluice.ReleaseAbandoned), not through the breaker, which during the
// outage it is meant for would refuse it, or count it as one more failure.
// A holder the breaker kept from the backend never reached it: nothing is
// sent. On a zero or nil Store it does nothing, and after Close it sends
// nothing either, as Release is refused then: a slot the backend may hold
// frees at its hold timeout. It does not say when the release could not
// be started: TryAbandonSlot does.
func (s *Store) AbandonSlot(key, holder string) {
	_ = s.TryAbandonSlot(key, holder)
}

// TryAbandonSlot is AbandonSlot that reports a release it could not
// start: sluice.ErrRetriesFull when sluice.MaxBackgroundReleases are at
// work already (sluice.TryReleaseAbandoned), and an error wrapping
// sluice.ErrStoreClosed after Close, for the caller to count and log. A
// holder with nothing to send (the breaker kept its Acquire from the
// backend) is no error, closed or not: the caller has no release to
// count as dropped. sluice.ReleaseAbandoned and sluice.TryReleaseAbandoned
// call it.
func (s *Store) TryAbandonSlot(key, holder string) error {
	if s == nil || s.backend == nil {
		return nil
	}
	ref := slotRef{key, holder}
	if _, ok := s.sent.get(ref, s.clock()); !ok {
		return nil
	}
	s.sent.forget(ref)
	if s.closed.Load() {
		return fmt.Errorf("resilient: abandon slot: %w", sluice.ErrStoreClosed)
	}
	bs, err := s.slotBackend()
	if err != nil {
		return nil
	}
	return sluice.TryReleaseAbandoned(bs, key, holder)
}

// droppedAbandons paces the line of a backend release that onSlot could
// not start, per Store name.
var droppedAbandons logpace.Pacer

// failSlot answers an Acquire by the policy.
func (s *Store) failSlot(ctx context.Context, b *breaker, key string, l sluice.InFlightLimit, weight int64, holder string, now time.Time, lat time.Duration, berr error) (sluice.SlotDecision, error) {
	ref := slotRef{key, holder}
	b.policyAnswered(berr)
	switch s.policyNow() {
	case FailOpen:
		s.observe("acquire", key, sluice.SourceFailOpen, lat, berr)
		s.slots.put(ref, slotGrant{open: true, expires: now.Add(l.Hold), backend: berr != nil}, now)
		return sluice.SlotDecision{Allowed: true, Limit: l, InUse: weight, Remaining: l.Max - weight, Source: sluice.SourceFailOpen}, nil
	case FailClosed:
		s.observe("acquire", key, sluice.SourceFailClosed, lat, berr)
		return sluice.SlotDecision{Limit: l, RetryAfter: s.probe, Source: sluice.SourceFailClosed}, nil
	}
	s.observe("acquire", key, sluice.SourceFallback, lat, berr)
	fb, ok := s.fallback.(sluice.Slots)
	if !ok {
		return sluice.SlotDecision{}, fmt.Errorf("%w: fallback %T", ErrNoSlots, s.fallback)
	}
	n := s.fleetSize()
	d, err := fb.Acquire(ctx, key, l, scaled(l.Max, weight, n), holder)
	if err != nil {
		return sluice.SlotDecision{}, err
	}
	if d.Allowed {
		s.slots.put(ref, slotGrant{expires: now.Add(l.Hold), backend: berr != nil}, now)
	}
	return shareSlots(d, l, n), nil
}

// shareSlots reports a fallback decision in the caller's units: this
// process's share of Max, and the weight it holds of it.
func shareSlots(d sluice.SlotDecision, l sluice.InFlightLimit, n int64) sluice.SlotDecision {
	d.Limit.Max = max(l.Max/n, 1)
	d.InUse = (d.InUse + n - 1) / n
	d.Remaining = max(d.Limit.Max-d.InUse, 0)
	d.Expired = (d.Expired + n - 1) / n
	d.Source = sluice.SourceFallback
	return d
}

// Extend implements sluice.Slots. A holder the policy granted is extended
// where it was granted; any other goes to the backend, and when the
// backend cannot be reached the error wraps ErrSlotUnreachable.
func (s *Store) Extend(ctx context.Context, key string, l sluice.InFlightLimit, holder string) (bool, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := sluice.ValidateSlot(key, l, 1, holder); err != nil {
		return false, err
	}
	a, err := s.onSlot(ctx, "extend", key, holder, l.Hold, 0, func(ctx context.Context, st sluice.Slots) (slotAnswer, error) {
		ok, err := st.Extend(ctx, key, l, holder)
		return slotAnswer{held: ok}, err
	})
	return a.held, err
}

// Release implements sluice.Slots. A holder the policy granted is released
// where it was granted; any other goes to the backend, and when the
// backend cannot be reached the error wraps ErrSlotUnreachable: the slot
// then frees at its hold timeout.
func (s *Store) Release(ctx context.Context, key string, holder string) (bool, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := sluice.ValidateKey(key); err != nil {
		return false, err
	}
	if err := sluice.ValidateHolder(holder); err != nil {
		return false, err
	}
	a, err := s.onSlot(ctx, "release", key, holder, 0, 0, func(ctx context.Context, st sluice.Slots) (slotAnswer, error) {
		ok, err := st.Release(ctx, key, holder)
		return slotAnswer{held: ok}, err
	})
	return a.held, err
}

// onceReleaser is a store that frees a slot and remembers its release in
// one step (redisstore.Store.ReleaseOnce, memory.Store.ReleaseOnce).
type onceReleaser interface {
	ReleaseOnce(ctx context.Context, key, holder string, remember time.Duration) (released, before bool, err error)
}

// ReleaseOnce is Release that also remembers, for remember, a release that
// freed holder's slot, in the same step as it frees it, where the slot is
// held: the backend's ReleaseOnce (redisstore.Store.ReleaseOnce) for a
// holder the backend holds, the fallback's (memory.Store.ReleaseOnce) for
// one the policy granted there. Sent again within remember, after an
// error that left its outcome unknown (ErrSlotUnreachable: the backend may
// have run it), or racing with the first, it reports the slot released
// before rather than not held. A holder FailOpen granted holds nothing:
// its release is remembered here. released is false when holder held no
// slot and no release of it is remembered. A backend or fallback without
// ReleaseOnce releases with Release and remembers nothing.
func (s *Store) ReleaseOnce(ctx context.Context, key, holder string, remember time.Duration) (released, before bool, err error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := sluice.ValidateSlot(key, sluice.Concurrent(1, remember), 1, holder); err != nil {
		return false, false, err
	}
	a, err := s.onSlot(ctx, "release", key, holder, 0, remember, func(ctx context.Context, st sluice.Slots) (slotAnswer, error) {
		if r, ok := st.(onceReleaser); ok {
			released, before, err := r.ReleaseOnce(ctx, key, holder, remember)
			return slotAnswer{held: released, before: before}, err
		}
		ok, err := st.Release(ctx, key, holder)
		return slotAnswer{held: ok}, err
	})
	return a.held, a.before, err
}

// slotAnswer is a store's answer to an extend or a release: held (for a
// release: freed, now or by an earlier release) and before (freed by an
// earlier release, which the store remembered).
type slotAnswer struct{ held, before bool }

// onSlot runs an extend (hold > 0, the new hold) or a release (hold 0;
// remember > 0 for a ReleaseOnce) where holder was granted.
func (s *Store) onSlot(ctx context.Context, op, key, holder string, hold, remember time.Duration, fn func(context.Context, sluice.Slots) (slotAnswer, error)) (slotAnswer, error) {
	bs, err := s.slotBackend()
	if err != nil {
		return slotAnswer{}, err
	}
	if err := s.ended(ctx, op); err != nil {
		return slotAnswer{}, err
	}
	now := s.clock()
	ref := slotRef{key, holder}
	if g, ok := s.slots.get(ref, now); ok {
		if g.released {
			return s.releasedAgain(ctx, op, ref, g, remember, now, fn)
		}
		if !g.open && hold > 0 && s.policyNow() != FallbackLocal {
			// No longer counted by the fleet (Fleet.Counted): the share
			// this slot is part of is the others' now, so it is not
			// extended but freed, and its holder told it is lost.
			s.observe(op, key, sluice.SourceFailClosed, 0, nil)
			if _, err := s.fallback.(sluice.Slots).Release(ctx, key, holder); err != nil {
				return slotAnswer{}, err
			}
			s.slots.forget(ref)
			return slotAnswer{}, nil
		}
		a := slotAnswer{held: true}
		if !g.open {
			s.observe(op, key, sluice.SourceFallback, 0, nil)
			if a, err = fn(ctx, s.fallback.(sluice.Slots)); err != nil {
				return slotAnswer{}, err
			}
		} else {
			s.observe(op, key, sluice.SourceFailOpen, 0, nil)
		}
		if hold == 0 && g.backend {
			s.sent.forget(ref)
			if err := sluice.TryReleaseAbandoned(bs, key, holder); err != nil {
				// The caller's release succeeded (here): only a line says
				// the backend may hold the slot to its hold timeout.
				droppedAbandons.Log(s.name, func(notLogged int64) {
					orDefault(s.opts.Logger, slog.Default()).Warn("resilient: release of a slot the backend may hold not sent: too many being sent in the background; it frees at its hold timeout",
						"store", s.name, "dropped", notLogged+1, "max_background", sluice.MaxBackgroundReleases)
				})
			}
		}
		switch {
		case a.held && remember > 0:
			s.slots.put(ref, slotGrant{open: g.open, released: true, expires: now.Add(remember)}, now)
		case !a.held || hold == 0:
			s.slots.forget(ref)
		default:
			g.expires = now.Add(hold)
			s.slots.put(ref, g, now)
		}
		return a, nil
	}
	b := s.breakerFor(key)
	call, tn := b.allow(now)
	if !call {
		s.observe(op, key, s.policySource(), 0, nil)
		return slotAnswer{}, fmt.Errorf("resilient: %s: %w: breaker open", op, ErrSlotUnreachable)
	}
	a, lat, err := bounded(ctx, s.timeout, s.inline, func(ctx context.Context) (slotAnswer, error) { return fn(ctx, bs) })
	if err == nil {
		s.answered(b, tn, now, a.held) // a holder not held: nothing written
		s.observe(op, key, sluice.SourceBackend, lat, nil)
		return a, nil
	}
	if err := s.callerFault(ctx, op, err, gate{b, tn}); err != nil {
		return slotAnswer{}, err
	}
	b.failure(tn, now, s.clock(), err)
	s.observe(op, key, s.policySource(), lat, err)
	return slotAnswer{}, fmt.Errorf("resilient: %s: %w: %w", op, ErrSlotUnreachable, err)
}

// releasedAgain answers a call on a holder the policy granted that a
// ReleaseOnce has freed: an extend or a Release finds it not held; a
// ReleaseOnce asks the fallback, which remembers the release (an open
// grant's is remembered here alone), and renews it.
func (s *Store) releasedAgain(ctx context.Context, op string, ref slotRef, g slotGrant, remember time.Duration, now time.Time, fn func(context.Context, sluice.Slots) (slotAnswer, error)) (slotAnswer, error) {
	if remember == 0 {
		return slotAnswer{}, nil
	}
	a := slotAnswer{held: true, before: true}
	if g.open {
		s.observe(op, ref.key, sluice.SourceFailOpen, 0, nil)
	} else {
		s.observe(op, ref.key, sluice.SourceFallback, 0, nil)
		var err error
		if a, err = fn(ctx, s.fallback.(sluice.Slots)); err != nil {
			return slotAnswer{}, err
		}
	}
	if !a.held {
		s.slots.forget(ref)
		return a, nil
	}
	g.expires = now.Add(remember)
	s.slots.put(ref, g, now)
	return a, nil
}

// slotBackend returns the backend as sluice.Slots.
func (s *Store) slotBackend() (sluice.Slots, error) {
	if s == nil || s.backend == nil {
		return nil, ErrZeroStore
	}
	bs, ok := s.backend.(sluice.Slots)
	if !ok {
		return nil, fmt.Errorf("%w: backend %T", ErrNoSlots, s.backend)
	}
	return bs, nil
}

// policySource is the Source of what the policy answers now.
func (s *Store) policySource() sluice.Source {
	switch s.policyNow() {
	case FailOpen:
		return sluice.SourceFailOpen
	case FailClosed:
		return sluice.SourceFailClosed
	}
	return sluice.SourceFallback
}
