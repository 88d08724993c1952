package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice"
)

// TakeAll implements sluice.MultiStore: either every request's units are
// taken or none are.
//
// When every key lives in one hash slot (always on a standalone or Sentinel
// client; on a Cluster when the keys share a slot) one script checks all the
// limits and then takes from all of them: atomic.
//
// Otherwise the requests are taken in turn, and on a denial (or error) the
// units already taken are given back. No quota leaks, but this path is not
// atomic: between a take and its refund, concurrent callers see those units
// gone and may be denied. A take whose reply is lost (a timeout, a context
// ended while the call was in flight) is not given back, since it may not
// have run: it can cost quota, never admit extra. To stay on the atomic
// path in a Cluster, give related keys a common hash tag, anywhere in the
// key ("{tenant42}:user7", "api:{tenant42}:ip"): a tagged key's state is
// stored so that Redis hashes exactly its tag (see the package doc).
//
// Two requests on the same key and algorithm are rejected with
// sluice.ErrInvalidKey, as by the memory store.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	if err := sluice.ValidateRequests(reqs); err != nil {
		return nil, fmt.Errorf("redisstore: %w", err)
	}
	switch {
	case len(reqs) == 0:
		return []sluice.Decision{}, nil
	case len(reqs) == 1:
		d, err := s.Take(ctx, reqs[0].Key, reqs[0].Limit, reqs[0].Cost)
		if err != nil {
			return nil, err
		}
		return []sluice.Decision{d}, nil
	case s == nil || s.client == nil:
		return nil, s.unbuilt()
	}
	keys := make([]string, len(reqs))
	for i, r := range reqs {
		keys[i] = s.redisKey(r.Key, r.Limit.Algorithm)
	}
	switch {
	case s.oneSlot(keys):
		return s.takeAtomic(ctx, reqs, keys)
	default:
		return s.takeInTurn(ctx, reqs)
	}
}

// oneSlot reports whether one script may touch all of keys.
func (s *Store) oneSlot(keys []string) bool {
	group := groupOf(s.client)
	first := group(keys[0])
	for _, k := range keys[1:] {
		if group(k) != first {
			return false
		}
	}
	return true
}

func (s *Store) takeAtomic(ctx context.Context, reqs []sluice.Request, keys []string) ([]sluice.Decision, error) {
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	c := &call{script: takeAllScript, alg: -1}
	c.args = make([]any, 0, 4+len(keys)+4*len(reqs))
	c.args = append(c.args, "evalsha", takeAllScript.sha, len(keys))
	for _, k := range keys {
		c.args = append(c.args, k)
	}
	c.args = append(c.args, now)
	for _, r := range reqs {
		p := s.paramsOf(r.Limit)
		c.args = append(c.args, int64(r.Limit.Algorithm), p[0], p[1], r.Cost)
	}
	v, err := s.run(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("redisstore: take all: %w", err)
	}
	rs, err := parseAll(v, len(reqs))
	if err != nil {
		return nil, fmt.Errorf("redisstore: take all: %w", err)
	}
	out := make([]sluice.Decision, len(reqs))
	for i, r := range rs {
		out[i] = r.decision(reqs[i].Limit)
	}
	return out, nil
}

// takeInTurn takes each request in order; on a denial it refunds what it
// took and reports the other verdicts as Peek sees them.
func (s *Store) takeInTurn(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	out := make([]sluice.Decision, len(reqs))
	taken := make([]result, 0, len(reqs))
	// Refunds must run even if ctx ends mid-way, or quota would leak.
	undo := func() error {
		var errs []error
		for i := len(taken) - 1; i >= 0; i-- {
			errs = append(errs, s.refund(context.WithoutCancel(ctx), reqs[i], taken[i]))
		}
		return errors.Join(errs...)
	}
	for i, req := range reqs {
		r, err := s.decide(ctx, modeTake, req.Key, req.Limit, req.Cost)
		if err != nil {
			return nil, errors.Join(&keyFailed{req.Key, err}, undo())
		}
		out[i] = r.decision(req.Limit)
		if r.allowed {
			taken = append(taken, r)
			continue
		}
		if err := undo(); err != nil {
			return nil, err
		}
		for j, q := range reqs {
			if j == i {
				continue
			}
			p, err := s.decide(ctx, modePeek, q.Key, q.Limit, q.Cost)
			if err != nil {
				return nil, &keyFailed{q.Key, err}
			}
			out[j] = p.decision(q.Limit)
		}
		return out, nil
	}
	return out, nil
}

// keyFailed is the error of a TakeAll in turn (keys spanning Cluster
// slots) on one of its keys: as err, and a sluice.KeyFailure naming the
// key, so that a breaker per master charges that key's master alone.
type keyFailed struct {
	key string
	err error
}

var _ sluice.KeyFailure = (*keyFailed)(nil)

func (e *keyFailed) Error() string     { return e.err.Error() }
func (e *keyFailed) Unwrap() error     { return e.err }
func (e *keyFailed) FailedKey() string { return e.key }
