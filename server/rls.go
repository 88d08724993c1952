package server

import (
	"context"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	core "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
)

// RegisterRLS registers the service as Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService) on g.
func (s *Service) RegisterRLS(g grpc.ServiceRegistrar) {
	rlsv3.RegisterRateLimitServiceServer(g, rlsServer{svc: s})
}

type rlsServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc *Service
}

func (r rlsServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return r.svc.ShouldRateLimit(ctx, req)
}

var envoyUnitByPeriod = map[time.Duration]rlsv3.RateLimitResponse_RateLimit_Unit{
	time.Second:          rlsv3.RateLimitResponse_RateLimit_SECOND,
	time.Minute:          rlsv3.RateLimitResponse_RateLimit_MINUTE,
	time.Hour:            rlsv3.RateLimitResponse_RateLimit_HOUR,
	24 * time.Hour:       rlsv3.RateLimitResponse_RateLimit_DAY,
	7 * 24 * time.Hour:   rlsv3.RateLimitResponse_RateLimit_WEEK,
	30 * 24 * time.Hour:  rlsv3.RateLimitResponse_RateLimit_MONTH,
	365 * 24 * time.Hour: rlsv3.RateLimitResponse_RateLimit_YEAR,
}

var periodByEnvoyUnit = func() map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration {
	m := map[rlsv3.RateLimitResponse_RateLimit_Unit]time.Duration{}
	for d, u := range envoyUnitByPeriod {
		m[u] = d
	}
	return m
}()

var headerPool = sync.Pool{New: func() any { return http.Header{} }}

// rlsHeaders are the headers SetHeaders may write, in response order.
var rlsHeaders = func() []struct{ name, canonical string } {
	var out []struct{ name, canonical string }
	for _, n := range []string{httplimit.HeaderLimit, httplimit.HeaderRemaining, httplimit.HeaderReset,
		httplimit.HeaderRateLimitPolicy, httplimit.HeaderRateLimit, httplimit.HeaderRetryAfter} {
		out = append(out, struct{ name, canonical string }{n, http.CanonicalHeaderKey(n)})
	}
	return out
}()

// descriptorState is one request descriptor on its way to a status.
type descriptorState struct {
	kind     int // none, unlimited, blocked, limited
	rule     *rule
	policy   *Policy
	key      string // the policy's key (identity)
	storeKey string
	limit    sluice.Limit
	period   time.Duration // blocked only
	hits     int64
	shadow   bool // shadow_mode, quota_mode or a shadow policy: never over limit
	over     bool // decided over the limit before any store call
	dec      sluice.Decision
	decided  bool
	taken    bool // dec comes from a take (counted in statistics)
}

// ruleName is the name of the descriptor's Envoy rule, if it has one.
func (st *descriptorState) ruleName() string {
	if st.rule == nil {
		return ""
	}
	return st.rule.name
}

const (
	kindNone = iota
	kindUnlimited
	kindBlocked
	kindLimited
)

// ShouldRateLimit decides an Envoy rate limit request. Descriptors are
// matched as envoyproxy/ratelimit matches them, with its replaces,
// unlimited, shadow_mode and hits_addend semantics, and sluice-format
// policies answer descriptors that fill their key templates. The request
// is over the limit if any enforced descriptor is, and then nothing is
// taken from the others: no quota leaks.
func (s *Service) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	dom := s.Config().domains[req.Domain]
	if dom == nil {
		s.metrics.unknownDomain()
	}
	states := make([]descriptorState, len(req.Descriptors))
	replacing := map[string]bool{}
	for i, d := range req.Descriptors {
		st := &states[i]
		st.hits = hitsAddend(req, i)
		if dom == nil {
			continue
		}
		entries := make([]Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			entries[j] = Entry{e.GetKey(), e.GetValue()}
		}
		if o := d.GetLimit(); o != nil {
			if err := s.overrideLimit(st, req.Domain, entries, o); err != nil {
				return nil, err
			}
			continue
		}
		m, ok := dom.lookup(entries)
		if !ok {
			m, ok = dom.lookupPolicy(entries)
		}
		if !ok {
			s.metrics.rlsUnmatched(req.Domain)
			continue
		}
		st.key = m.key
		if m.policy != nil { // sluice-format policy
			st.kind, st.policy, st.shadow = kindLimited, m.policy, m.policy.Strategy == Shadow
			if req.HitsAddend == 0 && d.GetHitsAddend() == nil {
				st.hits = m.policy.Cost
			}
			st.limit = m.policy.limitFor(m.key)
			continue
		}
		st.rule = m.rule
		for _, name := range m.rule.replaces { // unlimited ones too, as envoyproxy/ratelimit
			replacing[name] = true
		}
		switch {
		case m.rule.unlimited:
			st.kind = kindUnlimited
		case m.rule.blocked:
			st.kind, st.period, st.shadow = kindBlocked, m.rule.period, m.rule.shadow
		default:
			p := m.rule.policy
			st.kind, st.policy, st.limit = kindLimited, p, p.Limit
			st.shadow = p.Strategy == Shadow // shadow_mode or quota_mode
		}
	}
	for i := range states {
		st := &states[i]
		if st.rule != nil && st.rule.name != "" && replacing[st.rule.name] && st.kind != kindUnlimited {
			st.kind = kindNone
		}
	}
	if err := s.decideAll(ctx, states); err != nil {
		for i := range states {
			if st := &states[i]; st.kind == kindLimited && st.hits > 0 {
				s.metrics.decisionError(st.policy.Name)
			}
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	return s.response(states), nil
}

// hitsAddend is the descriptor's hits_addend if set (zero means "check
// only"), else the request's, else 1, as envoyproxy/ratelimit reads them.
// Negative hits (giving units back) are not supported: such a descriptor
// is only checked.
func hitsAddend(req *rlsv3.RateLimitRequest, i int) int64 {
	if req.Descriptors[i].GetIsNegativeHits() {
		return 0
	}
	if h := req.Descriptors[i].GetHitsAddend(); h != nil {
		return int64(min(h.GetValue(), math.MaxInt64))
	}
	return int64(max(req.GetHitsAddend(), 1))
}

// overrideLimit applies a limit that the request itself carries (Envoy's
// descriptor limit override), as a fixed window like envoyproxy/ratelimit.
func (s *Service) overrideLimit(st *descriptorState, domain string, entries []Entry, o *rlcommon.RateLimitDescriptor_RateLimitOverride) error {
	// RateLimitUnit and RateLimitResponse_RateLimit_Unit share numbers.
	period, ok := periodByEnvoyUnit[rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit())]
	if !ok {
		return status.Errorf(codes.InvalidArgument, "descriptor limit override has invalid unit %v", o.GetUnit())
	}
	// One counter per entries, rate and unit, so that two overrides never
	// share a counter under different limits. The leading '|' cannot start
	// a configured descriptor's key, so neither do the two.
	st.key = "|" + strconv.FormatUint(uint64(o.GetRequestsPerUnit()), 10) + "/" +
		strings.ToLower(rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit()).String()) + "|" + entriesKey(entries, nil)
	if o.GetRequestsPerUnit() == 0 {
		st.kind, st.period = kindBlocked, period
		st.policy = &Policy{Name: domain + ".override", Domain: domain, envoy: true} // names the headers
		return nil
	}
	lim := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: int64(o.GetRequestsPerUnit()), Period: period}
	if err := lim.Validate(); err != nil {
		return status.Errorf(codes.InvalidArgument, "descriptor limit override: %v", err)
	}
	st.kind, st.limit = kindLimited, lim
	st.policy = &Policy{Name: domain + ".override", Limit: lim, Cost: 1, Domain: domain, envoy: true}
	return nil
}

// decideAll takes the enforced descriptors' hits all-or-nothing, then the
// shadow ones' if the request goes through; everything else is peeked.
func (s *Service) decideAll(ctx context.Context, states []descriptorState) error {
	overall := true
	var enforced []int
	for i := range states {
		st := &states[i]
		switch st.kind {
		case kindBlocked:
			if st.hits > 0 {
				st.over = true
				if !st.shadow {
					overall = false
				}
			}
		case kindLimited:
			st.storeKey = s.storeKey(st.policy, st.key)
			if st.hits > st.limit.Capacity() { // could never be admitted
				st.over = true
				if !st.shadow {
					overall = false
				}
			} else if st.hits > 0 && !st.shadow {
				enforced = append(enforced, i)
			}
		}
	}
	if overall && len(enforced) > 0 {
		// Descriptors naming the same counter (Envoy sends the same
		// descriptor from route and virtual host; a policy is reachable by
		// template and by name) take their hits together, once.
		// A store key names one policy (and one limit: request-carried
		// limits key by rate and unit), so the key alone identifies it.
		reqs := make([]sluice.Request, 0, len(enforced))
		req := make([]int, len(enforced)) // enforced[j]'s index in reqs
		var seen map[string]int
		if len(enforced) > 1 {
			seen = make(map[string]int, len(enforced))
		}
		for j, i := range enforced {
			st := &states[i]
			k, ok := seen[st.storeKey]
			if !ok {
				k = len(reqs)
				if seen != nil {
					seen[st.storeKey] = k
				}
				reqs = append(reqs, sluice.Request{Key: st.storeKey, Limit: st.limit})
			}
			reqs[k].Cost += st.hits
			req[j] = k
		}
		for _, r := range reqs {
			if r.Cost > r.Limit.Capacity() { // together they could never be admitted
				overall = false
			}
		}
		if overall {
			decs, err := s.takeAll(ctx, reqs)
			if err != nil {
				return err
			}
			for j, i := range enforced {
				d := decs[req[j]]
				states[i].dec, states[i].decided, states[i].taken = d, true, true
				if !d.Allowed {
					overall = false
				}
			}
		} else {
			for j, i := range enforced {
				states[i].over = reqs[req[j]].Cost > reqs[req[j]].Limit.Capacity()
			}
		}
	}
	for i := range states {
		st := &states[i]
		if st.kind != kindLimited || st.decided {
			continue
		}
		cost := max(min(st.hits, st.limit.Capacity()), 1)
		var err error
		if overall && st.shadow && st.hits > 0 && !st.over {
			st.dec, err = s.take(ctx, st.storeKey, st.limit, cost)
			st.taken = true
		} else {
			st.dec, err = s.peek(ctx, st.storeKey, st.limit, cost)
			if st.over {
				st.dec.Allowed = false
			} else if st.hits == 0 {
				st.dec.Allowed = true // check only: never over
			}
		}
		if err != nil {
			return err
		}
		st.decided = true
	}
	for i := range states {
		st := &states[i]
		if st.kind == kindLimited && (st.taken || st.over) {
			s.record(Result{Policy: st.policy, Key: st.key, Decision: st.dec, Outcome: outcome(st.policy, st.dec)})
		}
	}
	return nil
}

func (s *Service) response(states []descriptorState) *rlsv3.RateLimitResponse {
	now := s.clock()
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(states)),
	}
	// Headers describe the first enforced descriptor over the limit, else
	// the one closest to it, as envoyproxy/ratelimit chooses. A shadow
	// descriptor over its limit is only close to it.
	head, headOver := -1, false
	for i := range states {
		st := &states[i]
		ds := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = ds
		switch st.kind {
		case kindUnlimited:
			ds.LimitRemaining = math.MaxUint32
			continue
		case kindNone:
			continue
		case kindBlocked:
			window := st.period - time.Duration(now.UnixNano())%st.period
			st.dec = sluice.Decision{
				Allowed:    !st.over,
				Limit:      sluice.Limit{Algorithm: sluice.FixedWindow, Period: st.period},
				RetryAfter: window,
				ResetAfter: window,
			}
			ds.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Unit: envoyUnitByPeriod[st.period], Name: st.ruleName()}
			ds.DurationUntilReset = durationpb.New(window)
		case kindLimited:
			ds.CurrentLimit = currentLimit(st)
			ds.LimitRemaining = uint32(min(st.dec.Remaining, math.MaxUint32))
			ds.DurationUntilReset = durationpb.New(untilReset(st, now))
		}
		if !st.dec.Allowed && !st.shadow {
			ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			if !headOver {
				head, headOver = i, true
			}
			continue
		}
		if !headOver && (head < 0 || st.dec.Remaining < states[head].dec.Remaining) {
			head = i
		}
	}
	if head >= 0 {
		st := &states[head]
		name := st.ruleName()
		if st.policy != nil {
			name = st.policy.Name
		}
		h := headerPool.Get().(http.Header)
		d := st.dec
		if st.shadow {
			d.Allowed, d.RetryAfter = true, 0
		}
		httplimit.SetHeaders(h, name, d, now)
		// Envoy passes names through as written: keep the usual spelling.
		for _, n := range rlsHeaders {
			if v := h[n.canonical]; len(v) > 0 {
				resp.ResponseHeadersToAdd = append(resp.ResponseHeadersToAdd, &core.HeaderValue{Key: n.name, Value: v[0]})
			}
		}
		clear(h)
		headerPool.Put(h)
	}
	return resp
}

func currentLimit(st *descriptorState) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: uint32(st.limit.Rate)}
	if u, ok := envoyUnitByPeriod[st.limit.Period]; ok {
		l.Unit = u
	}
	switch {
	case st.rule != nil:
		l.Name = st.rule.name
	case st.policy != nil && !st.policy.envoy:
		l.Name = st.policy.Name
	}
	return l
}

// untilReset is duration_until_reset: when the key is fresh again. A fixed
// window with nothing taken yet reports the end of the current window, as
// envoyproxy/ratelimit always does.
func untilReset(st *descriptorState, now time.Time) time.Duration {
	d := st.dec.ResetAfter
	if d <= 0 && st.limit.Algorithm == sluice.FixedWindow {
		p := st.limit.Period
		d = p - time.Duration(now.UnixMicro()%p.Microseconds())*time.Microsecond
	}
	return d
}
