package memory

import (
	"context"
	"slices"

	"github.com/sluicehq/sluice"
)

var _ sluice.MultiStore = (*Store)(nil)

// TakeAll implements sluice.MultiStore: it locks every shard involved (in
// index order, so concurrent calls cannot deadlock), checks every limit, and
// takes from all of them only if all allow.
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	if err := ctxErr(ctx); err != nil {
		return nil, err
	}
	if s.zero() {
		return nil, s.unbuilt()
	}
	if err := sluice.ValidateRequests(reqs); err != nil {
		return nil, err
	}
	idx := make([]int, len(reqs))
	for i, r := range reqs {
		idx[i] = int(s.shardIndex(r.Key))
	}
	locked := slices.Clone(idx)
	slices.Sort(locked)
	locked = slices.Compact(locked)
	for _, i := range locked {
		s.shards[i].mu.Lock()
	}
	defer func() {
		for _, i := range locked {
			s.shards[i].mu.Unlock()
		}
	}()

	now := s.now()
	out := make([]sluice.Decision, len(reqs))
	params := make([]params, len(reqs))
	all := true
	for i, r := range reqs {
		params[i] = newParams(r.Limit)
		var cp state
		sh, tag := s.locate(r.Key, r.Limit.Algorithm)
		if e := sh.find(tag, r.Key, r.Limit.Algorithm); e.found() {
			if cp = e.get(); cp.expires <= now {
				cp = state{}
			}
		}
		res := decide(&cp, now, &params[i], r.Cost, false)
		res.fill(&out[i], r.Limit)
		all = all && res.allowed
	}
	if !all {
		return out, nil
	}
	for i, r := range reqs {
		sh, tag := s.locate(r.Key, r.Limit.Algorithm)
		e := sh.find(tag, r.Key, r.Limit.Algorithm)
		if !e.found() {
			e = sh.insertKeeping(tag, r.Key, r.Limit.Algorithm, &state{}, now, reqs)
		}
		st := e.get()
		if st.expires <= now {
			st.clear()
		}
		res := decide(&st, now, &params[i], r.Cost, true)
		st.expires = now + res.reset
		st.fill = fillOf(&res, &params[i])
		e.set(&st)
		res.fill(&out[i], r.Limit)
	}
	return out, nil
}
