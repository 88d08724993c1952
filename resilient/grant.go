package resilient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ctxutil"
)

// ErrNoGrant: the Store cannot grant or take back units now: its breaker
// is not letting calls through, the backend failed, or the backend is not a
// sluice.Granter. The failure policy never grants (a fallback's units are
// not the fleet's), so the caller answers the request with Take instead,
// which the policy answers; package lease does.
var ErrNoGrant = errors.New("resilient: no grant")

// ErrNotSent accompanies ErrNoGrant when the call never reached the
// backend: the breaker held it back, or the backend cannot grant. Without
// it the call was sent and failed, and may have run.
var ErrNotSent = errors.New("resilient: not sent to the backend")

// Grant implements sluice.Granter when the backend does: it passes through
// while the breaker lets calls through, bounded by Options.Timeout, and
// fails with ErrNoGrant otherwise. A grant that timed out may still run on
// the backend; it is never resent, and its units are stranded, which can
// only lower admissions.
func (s *Store) Grant(ctx context.Context, key string, limit sluice.Limit, n int64) (sluice.Grant, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := sluice.ValidateGrant(key, limit, n); err != nil {
		return sluice.Grant{}, err
	}
	g, err := s.granter()
	if err != nil {
		return sluice.Grant{}, err
	}
	return pass(ctx, s, "grant", key, func(ctx context.Context) (sluice.Grant, error) {
		return g.Grant(ctx, key, limit, n)
	})
}

// Return implements sluice.Granter when the backend does, as Grant: a
// return the breaker holds back, or that fails, is not sent again and its
// units stay out of the store. A return clears the key's cached denials,
// which the returned units may have made stale.
func (s *Store) Return(ctx context.Context, key string, limit sluice.Limit, grant sluice.Grant, unused int64) (int64, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := sluice.ValidateReturn(key, limit, grant, unused); err != nil {
		return 0, err
	}
	g, err := s.granter()
	if err != nil {
		return 0, err
	}
	n, err := pass(ctx, s, "return", key, func(ctx context.Context) (int64, error) {
		return g.Return(ctx, key, limit, grant, unused)
	})
	if n > 0 && s.cache != nil {
		s.cache.forget(key, limit)
	}
	return n, err
}

// Regrant implements sluice.Regranter as Grant and Return do: passed in
// one call to a backend that is a sluice.Regranter while the breaker lets
// calls through, ErrNoGrant otherwise, never resent; one that failed may
// have run, so the units it gave back stay out of the store, as a failed
// return's. A regrant that gives units back clears the key's cached
// denials. Over a backend that cannot regrant it is Return then Grant,
// each passed as on its own; the grant is not sent when the return fails.
func (s *Store) Regrant(ctx context.Context, key string, limit sluice.Limit, grant sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := sluice.ValidateRegrant(key, limit, grant, unused, n); err != nil {
		return 0, sluice.Grant{}, err
	}
	g, err := s.granter()
	if err != nil {
		return 0, sluice.Grant{}, err
	}
	rg, ok := g.(sluice.Regranter)
	if !ok {
		back, err := s.Return(ctx, key, limit, grant, unused)
		if err != nil {
			return 0, sluice.Grant{}, err
		}
		next, err := s.Grant(ctx, key, limit, n)
		return back, next, err
	}
	type regranted struct {
		back int64
		next sluice.Grant
	}
	r, err := pass(ctx, s, "regrant", key, func(ctx context.Context) (regranted, error) {
		back, next, err := rg.Regrant(ctx, key, limit, grant, unused, n)
		return regranted{back, next}, err
	})
	if r.back > 0 && s.cache != nil {
		s.cache.forget(key, limit)
	}
	return r.back, r.next, err
}

// granter is the backend as a sluice.Granter.
func (s *Store) granter() (sluice.Granter, error) {
	if s == nil || s.backend == nil {
		return nil, ErrZeroStore
	}
	g, ok := s.backend.(sluice.Granter)
	if !ok {
		return nil, fmt.Errorf("%w: %w: backend %T cannot grant", ErrNoGrant, ErrNotSent, s.backend)
	}
	return g, nil
}

// TakeByPolicy answers a take by the failure policy without calling the
// backend, as Take does while the breaker is open: for a caller whose own
// call for the key (package lease's grant) has just failed, so that the
// request waits for a backend that does not answer once, not twice, before
// the breaker has seen enough failures to open. cause is that call's
// error as it returned it; the Observer event carries the backend's error
// in it, marked sluice.StoreEvent.Reported (the decision is answered for
// a failed call, though it made none), or none when the call was not
// sent.
func (s *Store) TakeByPolicy(ctx context.Context, key string, limit sluice.Limit, cost int64, cause error) (sluice.Decision, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := s.refuse(ctx, "take", key, limit, cost); err != nil {
		return sluice.Decision{}, err
	}
	cause = backendErr(cause)
	return s.failOne(ctx, s.breakerFor(key), "take", key, limit, cost, true, 0, cause, cause != nil)
}

// PeekByPolicy answers a peek by the failure policy without calling the
// backend, as TakeByPolicy answers a take: for package lease's Peek, whose
// return of an ended lease's units has just failed (its event carries
// that error, as TakeByPolicy's) or been held back.
func (s *Store) PeekByPolicy(ctx context.Context, key string, limit sluice.Limit, cost int64, cause error) (sluice.Decision, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := s.refuse(ctx, "peek", key, limit, cost); err != nil {
		return sluice.Decision{}, err
	}
	cause = backendErr(cause)
	return s.failOne(ctx, s.breakerFor(key), "peek", key, limit, cost, false, 0, cause, cause != nil)
}

// TakeAllByPolicy answers a TakeAll by the failure policy without calling
// the backend, all or nothing, as a TakeAll the breaker held back: for
// package lease's TakeAll, whose grant of one check has just failed, so
// that the checks no live lease answers wait no more for the backend.
// Under FallbackLocal the fallback's own TakeAll takes them in one step,
// so that requests racing for its last units never take one check's and
// not another's (a Fallback that is no sluice.MultiStore takes them one at
// a time, each Peeked first, and a race can lose the units taken before a
// denial); FailOpen admits every one and FailClosed denies every one, as
// for TakeAll. Each request is one Observer event, op "take", as from
// TakeByPolicy: one request's answer is TakeByPolicy's. cause: see
// TakeByPolicy.
func (s *Store) TakeAllByPolicy(ctx context.Context, reqs []sluice.Request, cause error) ([]sluice.Decision, error) {
	ctx = ctxutil.OrBackground(ctx)
	for i, r := range reqs {
		if err := sluice.ValidateRequest(r.Key, r.Limit, r.Cost); err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
	}
	if s == nil || s.backend == nil {
		return nil, ErrZeroStore
	}
	if err := s.ended(ctx, "take"); err != nil {
		return nil, err
	}
	cause = backendErr(cause)
	switch len(reqs) {
	case 0:
		return []sluice.Decision{}, nil
	case 1:
		d, err := s.failOne(ctx, s.breakerFor(reqs[0].Key), "take", reqs[0].Key, reqs[0].Limit, reqs[0].Cost, true, 0, cause, cause != nil)
		if err != nil {
			return nil, err
		}
		return []sluice.Decision{d}, nil
	}
	src := s.policySource()
	for _, r := range reqs {
		s.breakerFor(r.Key).policyAnswered(cause)
		if s.observer != nil {
			s.observer.ObserveStore(sluice.StoreEvent{Store: s.name, Op: "take", Key: r.Key, Source: src, Err: cause, Reported: cause != nil})
		}
	}
	out := make([]sluice.Decision, len(reqs))
	switch src {
	case sluice.SourceFailOpen:
		now := s.clock()
		for i, r := range reqs {
			out[i] = openDecision(r.Limit, r.Cost, true, now)
		}
		return out, nil
	case sluice.SourceFailClosed:
		for i, r := range reqs {
			out[i] = s.closedDecision(r.Limit)
		}
		return out, nil
	}
	n := s.fleetSize()
	local := make([]sluice.Request, len(reqs))
	for i, r := range reqs {
		local[i] = sluice.Request{Key: r.Key, Limit: r.Limit, Cost: localCost(r.Limit, r.Cost, n)}
	}
	var ds []sluice.Decision
	var err error
	if fb, ok := s.fallback.(sluice.MultiStore); ok {
		ds, err = fb.TakeAll(ctx, local)
	} else {
		ds, err = takeInTurn(ctx, s.fallback, local)
	}
	s.evict.check(s.clock())
	if err != nil {
		return nil, err
	}
	if len(ds) != len(reqs) {
		return nil, fmt.Errorf("resilient: fallback returned %d decisions for %d requests", len(ds), len(reqs))
	}
	for i, r := range reqs {
		out[i] = share(ds[i], r.Limit, n, r.Cost)
	}
	return out, nil
}

// takeInTurn is a TakeAll from a store that has none: every request
// Peeked, then, when all admit, each Taken until one denies, the rest
// then Peeked.
func takeInTurn(ctx context.Context, st sluice.Store, reqs []sluice.Request) ([]sluice.Decision, error) {
	out := make([]sluice.Decision, len(reqs))
	take := true
	for i, r := range reqs {
		d, err := st.Peek(ctx, r.Key, r.Limit, r.Cost)
		if err != nil {
			return nil, err
		}
		out[i], take = d, take && d.Allowed
	}
	for i, r := range reqs {
		if !take {
			break
		}
		d, err := st.Take(ctx, r.Key, r.Limit, r.Cost)
		if err != nil {
			return nil, err
		}
		out[i], take = d, d.Allowed
	}
	return out, nil
}

// backendErr is the backend's own error in err, a call's error as pass
// returns it: nil when the call was not sent (the breaker was open), so
// that a decision the policy answers for it reports the failure the
// call's own event did, or none.
func backendErr(err error) error {
	if err == nil || errors.Is(err, ErrNotSent) {
		return nil
	}
	if u, ok := err.(interface{ Unwrap() []error }); ok {
		if es := u.Unwrap(); len(es) == 2 && es[0] == ErrNoGrant {
			return es[1]
		}
	}
	return err
}

// pass sends a call for key that the failure policy cannot answer to the
// backend through the breaker, and counts its outcome there as any call's.
func pass[T any](ctx context.Context, s *Store, op, key string, fn func(context.Context) (T, error)) (T, error) {
	var zero T
	now := s.clock()
	g, err := s.admit(ctx, op, key, now)
	if err != nil {
		return zero, err
	}
	v, lat, err := bounded(ctx, s.timeout, s.inline, fn)
	if err := s.passed(ctx, op, key, g, now, lat, err); err != nil {
		return zero, err
	}
	return v, nil
}

// admit is pass's gate for a call for key at now: the caller's context
// not ended, and key's breaker letting the call through (ErrNotSent
// otherwise).
func (s *Store) admit(ctx context.Context, op, key string, now time.Time) (gate, error) {
	if err := s.ended(ctx, op); err != nil {
		return gate{}, err
	}
	b := s.breakerFor(key)
	call, tn := b.allow(now)
	if !call {
		return gate{}, fmt.Errorf("%w: %w: %s: breaker %v", ErrNoGrant, ErrNotSent, op, b.current())
	}
	return gate{b, tn}, nil
}

// passed counts the outcome of a call for key that pass sent through
// breaker turn g at now, which took lat and ended in err, and returns the
// call's error as pass does.
func (s *Store) passed(ctx context.Context, op, key string, g gate, now time.Time, lat time.Duration, err error) error {
	if err == nil {
		g.b.success(g.t, now)
	} else if ferr := s.callerFault(ctx, op, err, g); ferr != nil {
		return ferr
	} else {
		g.b.failure(g.t, now, s.clock(), err)
	}
	s.observe(op, key, sluice.SourceBackend, lat, err)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrNoGrant, op, err)
	}
	return nil
}

// GrantAll implements sluice.GrantAller: each of reqs is its Grant or
// Regrant, passed as that call is (through its key's breaker, bounded by
// Options.Timeout, its outcome counted there, never resent), and those
// the breakers let through go to the backend together, in one GrantAll
// when it is a sluice.GrantAller, else each on its own, side by side. A
// backend that does not answer costs them one Timeout, each counted a
// failed call.
func (s *Store) GrantAll(ctx context.Context, reqs []sluice.GrantRequest) []sluice.GrantResult {
	ctx = ctxutil.OrBackground(ctx)
	out := make([]sluice.GrantResult, len(reqs))
	g, err := s.granter()
	ga, ok := g.(sluice.GrantAller)
	if err != nil || !ok || len(reqs) < 2 {
		var wg sync.WaitGroup
		for i, r := range reqs {
			wg.Go(func() {
				res := &out[i]
				if r.Unused > 0 {
					res.Returned, res.Grant, res.Err = s.Regrant(ctx, r.Key, r.Limit, r.Grant, r.Unused, r.N)
				} else {
					res.Grant, res.Err = s.Grant(ctx, r.Key, r.Limit, r.N)
				}
			})
		}
		wg.Wait()
		return out
	}
	now := s.clock()
	sent := make([]sluice.GrantRequest, 0, len(reqs))
	at := make([]int, 0, len(reqs))
	gates := make([]gate, 0, len(reqs))
	for i, r := range reqs {
		op := opOf(r)
		if r.Unused > 0 {
			err = sluice.ValidateRegrant(r.Key, r.Limit, r.Grant, r.Unused, r.N)
		} else {
			err = sluice.ValidateGrant(r.Key, r.Limit, r.N)
		}
		var g gate
		if err == nil {
			g, err = s.admit(ctx, op, r.Key, now)
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		sent, at, gates = append(sent, r), append(at, i), append(gates, g)
	}
	if len(sent) == 0 {
		return out
	}
	res, lat, err := bounded(ctx, s.timeout, s.inline, func(ctx context.Context) ([]sluice.GrantResult, error) {
		return ga.GrantAll(ctx, sent), nil
	})
	if err == nil && len(res) != len(sent) {
		err = fmt.Errorf("resilient: backend's GrantAll returned %d results for %d grants", len(res), len(sent))
	}
	for j, i := range at {
		r := sent[j]
		var got sluice.GrantResult
		if err == nil {
			got = res[j]
		} else {
			got.Err = err
		}
		if perr := s.passed(ctx, opOf(r), r.Key, gates[j], now, lat, got.Err); perr != nil {
			got = sluice.GrantResult{Err: perr}
		}
		if got.Returned > 0 && s.cache != nil {
			s.cache.forget(r.Key, r.Limit)
		}
		out[i] = got
	}
	return out
}

// opOf is the op a GrantAll's request is passed as.
func opOf(r sluice.GrantRequest) string {
	if r.Unused > 0 {
		return "regrant"
	}
	return "grant"
}
