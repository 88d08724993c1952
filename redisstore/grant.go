package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

var (
	_ sluice.Regranter  = (*Store)(nil)
	_ sluice.GrantAller = (*Store)(nil)
)

// grantScripts is indexed by sluice.Algorithm: each algorithm's script
// wrapped as a function, then grant.lua (see its header); nil for the
// sliding window log, which cannot grant.
var grantScripts = make([]*script, len(algorithms))

func init() {
	now := mustRead("now.lua")
	for a := range algorithms {
		if sluice.Algorithm(a) == sluice.SlidingWindowLog {
			continue
		}
		body := now + mustRead(algorithms[a].file)
		grantScripts[a] = newTakeScript(now + "local function alg(KEYS, ARGV)\n" + body + "\nend\n" + mustRead("grant.lua"))
	}
}

const (
	modeGrant   = "grant"
	modeReturn  = "return"
	modeRegrant = "regrant"
)

// Grant implements sluice.Granter in one script call, never resent.
func (s *Store) Grant(ctx context.Context, key string, limit sluice.Limit, n int64) (sluice.Grant, error) {
	if err := sluice.ValidateGrant(key, limit, n); err != nil {
		return sluice.Grant{}, err
	}
	v, err := s.runGrant(ctx, modeGrant, key, limit, n, horizonMS(limit), nil, nil)
	if err != nil {
		return sluice.Grant{}, err
	}
	return grantReply(limit, modeGrant, n, v)
}

// Return implements sluice.Granter in one script call, never resent.
func (s *Store) Return(ctx context.Context, key string, limit sluice.Limit, g sluice.Grant, unused int64) (int64, error) {
	if err := sluice.ValidateReturn(key, limit, g, unused); err != nil {
		return 0, err
	}
	v, err := s.runGrant(ctx, modeReturn, key, limit, unused, g.At, returnInterval(limit), g.Epoch)
	if err != nil {
		return 0, err
	}
	if len(v) != 1 || v[0] < 0 || v[0] > unused {
		return 0, fmt.Errorf("redisstore: %v return: %w: %v", limit.Algorithm, ErrUnexpectedReply, v)
	}
	return v[0], nil
}

// Regrant implements sluice.Regranter in one script call, never resent:
// the return and the grant run in one script, at one now.
func (s *Store) Regrant(ctx context.Context, key string, limit sluice.Limit, g sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	if err := sluice.ValidateRegrant(key, limit, g, unused, n); err != nil {
		return 0, sluice.Grant{}, err
	}
	v, err := s.runGrant(ctx, modeRegrant, key, limit, unused, g.At, returnInterval(limit), g.Epoch, n, horizonMS(limit))
	if err != nil {
		return 0, sluice.Grant{}, err
	}
	return regrantReply(limit, unused, n, v)
}

// GrantAll implements sluice.GrantAller: each of reqs is the one script
// call its Grant or Regrant would be, never resent, and they are sent
// together, as one batch in one round trip; on a ClusterClient one batch
// per master, the masters' side by side. Without batching (MaxBatch 1,
// WaitReplicas) each goes on its own, side by side.
func (s *Store) GrantAll(ctx context.Context, reqs []sluice.GrantRequest) []sluice.GrantResult {
	out := make([]sluice.GrantResult, len(reqs))
	cs := make([]*call, 0, len(reqs))
	at := make([]int, 0, len(reqs))
	for i, r := range reqs {
		var c *call
		var err error
		if r.Unused > 0 {
			if err = sluice.ValidateRegrant(r.Key, r.Limit, r.Grant, r.Unused, r.N); err == nil {
				c, err = s.grantCall(modeRegrant, r.Key, r.Limit, r.Unused, r.Grant.At, returnInterval(r.Limit), r.Grant.Epoch, r.N, horizonMS(r.Limit))
			}
		} else if err = sluice.ValidateGrant(r.Key, r.Limit, r.N); err == nil {
			c, err = s.grantCall(modeGrant, r.Key, r.Limit, r.N, horizonMS(r.Limit))
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		cs, at = append(cs, c), append(at, i)
	}
	errs := s.runAll(ctx, cs)
	for j, i := range at {
		r, res := reqs[i], &out[i]
		mode := modeGrant
		if r.Unused > 0 {
			mode = modeRegrant
		}
		switch {
		case errs[j] != nil:
			res.Err = fmt.Errorf("redisstore: %v %s: %w", r.Limit.Algorithm, mode, errs[j])
		case mode == modeRegrant:
			res.Returned, res.Grant, res.Err = regrantReply(r.Limit, r.Unused, r.N, cs[j].val)
		default:
			res.Grant, res.Err = grantReply(r.Limit, modeGrant, r.N, cs[j].val)
		}
	}
	return out
}

// regrantReply reads a regrant's reply: the units given back of unused,
// then the grant of up to n.
func regrantReply(limit sluice.Limit, unused, n int64, v []int64) (int64, sluice.Grant, error) {
	if len(v) < 1 || v[0] < 0 || v[0] > unused {
		return 0, sluice.Grant{}, fmt.Errorf("redisstore: %v regrant: %w: %v", limit.Algorithm, ErrUnexpectedReply, v)
	}
	next, err := grantReply(limit, modeRegrant, n, v[1:])
	if err != nil {
		return 0, sluice.Grant{}, err
	}
	return v[0], next, nil
}

// grantReply reads a grant's reply to a call of mode that asked for n.
func grantReply(limit sluice.Limit, mode string, n int64, v []int64) (sluice.Grant, error) {
	if len(v) != 7 || v[0] < 0 || v[0] > n {
		return sluice.Grant{}, fmt.Errorf("redisstore: %v %s: %w: %v", limit.Algorithm, mode, ErrUnexpectedReply, v)
	}
	r := result{remaining: v[1], retry: v[2], reset: v[3]}
	d := r.decision(limit)
	g := sluice.Grant{Granted: v[0], Limit: limit, Remaining: d.Remaining, ResetAfter: d.ResetAfter, At: v[4], Epoch: v[6]}
	if g.Granted == 0 {
		g.RetryAfter = d.RetryAfter
		return g, nil
	}
	if w := windowPeriod(limit); w > 0 { // At is never negative: the clock is checked
		g.Window = time.Duration((g.At/w+1)*w-v[5]) * time.Microsecond
	}
	return g, nil
}

// returnInterval is a return's ARGV interval: µs per unit for the age
// rule, 0 for the window algorithms.
func returnInterval(limit sluice.Limit) int64 {
	if windowPeriod(limit) == 0 {
		return limit.Interval().Microseconds()
	}
	return 0
}

// runGrant sends one call of the algorithm's grant script: ARGV is now,
// mode, the limit's two parameters, n, then extra (a grant's horizon; a
// return's at, interval and epoch; a regrant's those of a return, then
// the grant's n and horizon).
func (s *Store) runGrant(ctx context.Context, mode, key string, l sluice.Limit, n int64, extra ...any) ([]int64, error) {
	c, err := s.grantCall(mode, key, l, n, extra...)
	if err != nil {
		return nil, err
	}
	v, err := s.run(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("redisstore: %v %s: %w", l.Algorithm, mode, err)
	}
	return v, nil
}

// grantCall builds runGrant's call.
func (s *Store) grantCall(mode, key string, l sluice.Limit, n int64, extra ...any) (*call, error) {
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	sc := grantScripts[l.Algorithm]
	p := s.paramsOf(l)
	// alg -1: a batch sends it as a command of its own, and WaitReplicas
	// waits for it, as for a take.
	c := &call{script: sc, alg: -1}
	c.args = append([]any{"evalsha", sc.sha, "2", s.redisKey(key, l.Algorithm), s.resetKey(key, l.Algorithm), now, mode, p[0], p[1], n}, extra...)
	return c, nil
}

// resetScript deletes a key's state and marks the Reset (reset.lua).
var resetScript = newScript(mustRead("now.lua") + mustRead("reset.lua"))

// resetKey is the Redis key of key's epoch under a (how many times it was
// Reset, lately), beside its state in the same hash slot. Its last ':' is
// followed by no algorithm's suffix.
func (s *Store) resetKey(key string, a sluice.Algorithm) string {
	return s.redisKey(key, a) + "-reset"
}

// horizonMS is sluice.ReturnHorizon in whole ms, at least 1.
func horizonMS(l sluice.Limit) int64 {
	return max((sluice.ReturnHorizon(l) + time.Millisecond - 1).Milliseconds(), 1)
}

// windowPeriod is the period of a window algorithm's limit, µs, and 0 for
// the others.
func windowPeriod(l sluice.Limit) int64 {
	if l.Algorithm == sluice.FixedWindow || l.Algorithm == sluice.SlidingWindowCounter {
		return l.Period.Microseconds()
	}
	return 0
}
