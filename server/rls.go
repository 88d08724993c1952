package server

import (
	"context"
	"errors"
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
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/header"
	"github.com/sluicehq/sluice/server/config"
)

// maxDomainLen bounds an unknown domain's length: longer is refused, not
// answered OK (a configured domain of any length is served).
const maxDomainLen = sluice.MaxKeyLen

// rlsServer is Envoy's rate limit service: it turns a request's
// descriptors into engine checks and the checks' decisions into statuses.
type rlsServer struct {
	rlsv3.UnimplementedRateLimitServiceServer
	svc *Service
}

func registerRLS(g grpc.ServiceRegistrar, s *Service) {
	rlsv3.RegisterRateLimitServiceServer(g, rlsServer{svc: s})
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

// rlsHeaders are the headers header.Selection.Set may write, in response
// order.
var rlsHeaders = func() []struct{ name, canonical string } {
	var out []struct{ name, canonical string }
	for _, n := range []string{header.Limit, header.Remaining, header.Reset, header.Policy, header.RateLimit, header.RetryAfter} {
		out = append(out, struct{ name, canonical string }{n, http.CanonicalHeaderKey(n)})
	}
	return out
}()

// blockedRule stands for an Envoy limit of 0 in the engine's checks: an
// Over check, never stored nor observed.
var blockedRule = enforce.Rule{Name: "blocked"}

// descriptor is one request descriptor on its way to a status.
type descriptor struct {
	kind   int
	rl     *config.RateLimit // Envoy-format match
	policy *config.Policy    // limited; names a blocked override's headers
	period time.Duration     // blocked only
	unit   time.Duration     // a limit override's unit as sent, without unit_multiplier
	hits   int64
	shadow bool // shadow_mode, quota_mode or a shadow policy: never over limit
	check  int  // index of the descriptor's check, or -1
}

const (
	kindNone = iota
	kindUnlimited
	kindBlocked
	kindLimited
)

// name is what the descriptor's headers are named after: its policy, else
// its rate_limit's name, else its descriptor path.
func (d *descriptor) name() string {
	switch {
	case d.policy != nil:
		return d.policy.Name
	case d.rl == nil:
		return ""
	case d.rl.Name != "":
		return d.rl.Name
	}
	return d.rl.Path
}

// MaxDescriptors and MaxDescriptorEntries bound one rate limit request: far
// above what Envoy's route actions produce (a descriptor per rate_limit
// action, an entry per action within it), low enough that no request costs
// more than a few milliseconds (checks are all-or-nothing, so a request's
// cost grows faster than its descriptors).
const (
	MaxDescriptors       = 128
	MaxDescriptorEntries = 64
)

// ShouldRateLimit decides an Envoy rate limit request. Descriptors are
// matched as envoyproxy/ratelimit matches them, with its replaces,
// unlimited, shadow_mode and hits_addend semantics, and sluice-format
// policies answer descriptors that fill their key templates. The engine
// decides the checks all-or-nothing: if any enforced descriptor is over
// its limit, nothing is taken from the others.
func (r rlsServer) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if r.svc.engine == nil {
		return nil, status.Error(codes.Unavailable, ErrZeroService.Error())
	}
	if req.GetDomain() == "" {
		return nil, status.Error(codes.InvalidArgument, "rate limit domain must not be empty")
	}
	if len(req.GetDescriptors()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "rate limit descriptor list must not be empty")
	}
	if n := len(req.Descriptors); n > MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "%d descriptors in one request: at most %d", n, MaxDescriptors)
	}
	for i, d := range req.Descriptors {
		if n := len(d.GetEntries()); n > MaxDescriptorEntries {
			return nil, status.Errorf(codes.InvalidArgument, "descriptor %d has %d entries: at most %d", i, n, MaxDescriptorEntries)
		}
	}
	dom := r.svc.Config().Domain(req.Domain)
	if dom == nil {
		if len(req.Domain) > maxDomainLen {
			return nil, status.Errorf(codes.InvalidArgument, "rate limit domain of %d bytes exceeds %d: no configuration names one so long", len(req.Domain), maxDomainLen)
		}
		r.svc.unknownDomain(req.Domain)
	}
	descs := make([]descriptor, len(req.Descriptors))
	keys := make([]string, len(req.Descriptors))
	replacing := map[string]bool{}
	for i, d := range req.Descriptors {
		st := &descs[i]
		st.hits, st.check = hitsAddend(req, i), -1
		if dom == nil {
			continue
		}
		entries := make([]config.Entry, len(d.GetEntries()))
		for j, e := range d.GetEntries() {
			entries[j] = config.Entry{Key: e.GetKey(), Value: e.GetValue()}
		}
		if o := d.GetLimit(); o != nil {
			key, err := overrideLimit(st, req.Domain, entries, o)
			if err != nil {
				return nil, err
			}
			keys[i] = key
			continue
		}
		m, ok := dom.Match(entries)
		if !ok {
			r.svc.metrics.rlsUnmatched(req.Domain)
			continue
		}
		keys[i] = m.Key
		if m.Policy != nil { // sluice-format policy
			st.kind, st.policy, st.shadow = kindLimited, m.Policy, m.Policy.Strategy == enforce.Shadow
			// The policy's cost stands in for hits left unsaid; negative
			// hits only look, whatever the cost.
			if req.HitsAddend == 0 && d.GetHitsAddend() == nil && !d.GetIsNegativeHits() {
				st.hits = m.Policy.Cost
			}
			continue
		}
		st.rl = m.RateLimit
		for _, name := range m.RateLimit.Replaces { // unlimited ones too, as envoyproxy/ratelimit
			replacing[name] = true
		}
		switch {
		case m.RateLimit.Unlimited:
			st.kind = kindUnlimited
		case m.RateLimit.Blocked:
			st.kind, st.period, st.shadow = kindBlocked, m.RateLimit.Period, m.RateLimit.Shadow
		default:
			p := m.RateLimit.Policy
			st.kind, st.policy = kindLimited, p
			st.shadow = p.Strategy == enforce.Shadow // shadow_mode or quota_mode
		}
	}
	checks := make([]enforce.Check, 0, len(descs))
	checkKeys := make([]string, 0, len(descs))
	for i := range descs {
		st := &descs[i]
		if st.rl != nil && st.rl.Name != "" && replacing[st.rl.Name] && st.kind != kindUnlimited {
			st.kind = kindNone
		}
		switch {
		case st.kind == kindLimited:
			st.check = len(checks)
			checks = append(checks, r.svc.check(st.policy, keys[i], st.hits))
			checkKeys = append(checkKeys, keys[i])
		case st.kind == kindBlocked && st.hits > 0 && !st.shadow:
			st.check = len(checks)
			checks = append(checks, enforce.Check{Rule: &blockedRule, Over: true})
			checkKeys = append(checkKeys, keys[i])
		}
	}
	if _, err := r.svc.enforce(ctx, checks, checkKeys); err != nil {
		if cerr := ended(ctx); cerr != nil && !errors.As(err, new(*enforce.ConfigError)) {
			// Its caller gave up while the store was awaited: no store
			// failure, so the context's code, as grpclimit returns it.
			return nil, status.FromContextError(cerr).Err()
		}
		return nil, status.Error(codes.Unavailable, err.Error())
	}
	resp := r.response(descs, checks)
	r.observeStateless(descs, keys, resp.OverallCode == rlsv3.RateLimitResponse_OK)
	return resp, nil
}

// observeStateless reports the decisions of the descriptors that matched
// a rule without state, which the engine never sees (a block is an Over
// check, an unlimited rule none), as the engine reports the others': in
// the metrics, the statistics and the top keys, under the rule's path
// (an override's under its policy). A block that hits is denied (a
// shadow one shadow_denied); an unlimited rule that hits is allowed when
// the request is, and otherwise took nothing, as a policy the request
// did not reach. Looks (no hits) are not decisions.
func (r rlsServer) observeStateless(descs []descriptor, keys []string, admitted bool) {
	for i := range descs {
		st := &descs[i]
		if st.hits <= 0 || (st.kind != kindBlocked && st.kind != kindUnlimited) {
			continue
		}
		var name string
		switch {
		case st.rl != nil:
			name = st.rl.Path
		case st.policy != nil: // a block the request carried
			name = st.policy.Name
		}
		e := sluice.DecisionEvent{Policy: name, Outcome: sluice.OutcomeAllowed}
		switch {
		case st.kind == kindUnlimited && !admitted:
			continue
		case st.kind == kindUnlimited:
			// Never near a limit: as much left as Envoy is told.
			e.Decision = sluice.Decision{Allowed: true, Remaining: math.MaxUint32}
		default:
			e.Decision = blockDecision(st)
			e.Outcome = sluice.OutcomeDenied
			if st.shadow {
				e.Outcome = sluice.OutcomeShadowDenied
			}
			r.svc.mon.top.record(name, keys[i], e.Decision)
		}
		observer{r.svc}.ObserveDecision(e)
	}
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
// descriptor limit override), as a fixed window like envoyproxy/ratelimit,
// and returns the descriptor's key.
func overrideLimit(st *descriptor, domain string, entries []config.Entry, o *rlcommon.RateLimitDescriptor_RateLimitOverride) (string, error) {
	// RateLimitUnit and RateLimitResponse_RateLimit_Unit share numbers.
	period, ok := periodByEnvoyUnit[rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit())]
	if !ok {
		return "", status.Errorf(codes.InvalidArgument, "descriptor limit override has invalid unit %v", o.GetUnit())
	}
	// One counter per entries, rate and unit, so that two overrides never
	// share a counter under different limits. The leading '|' cannot start
	// a configured descriptor's key, so neither do the two.
	unit := period
	mult := strings.ToLower(rlsv3.RateLimitResponse_RateLimit_Unit(o.GetUnit()).String())
	if m := o.GetUnitMultiplier().GetValue(); m > 1 {
		// As Envoy's API says: the period is unit_multiplier units.
		if int64(m) > int64(sluice.MaxPeriod/period) {
			return "", status.Errorf(codes.InvalidArgument, "descriptor limit override: unit_multiplier %d makes a window longer than %v", m, sluice.MaxPeriod)
		}
		period *= time.Duration(m)
		mult = strconv.FormatUint(uint64(m), 10) + "x" + mult
	}
	key := "|" + strconv.FormatUint(uint64(o.GetRequestsPerUnit()), 10) + "/" +
		mult + "|" + config.EntriesKey(entries)
	st.unit = unit
	name := config.OverrideName(domain)
	if o.GetRequestsPerUnit() == 0 {
		st.kind, st.period = kindBlocked, period
		st.policy = &config.Policy{Name: name, Domain: domain} // names the headers
		return key, nil
	}
	// Above sluice.MaxRate a window never fills in practice: count it at
	// that rate rather than refuse the whole request (the counter's key
	// keeps the rate as sent).
	lim := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: min(int64(o.GetRequestsPerUnit()), sluice.MaxRate), Period: period}
	p, err := config.NewEnvoyPolicy(name, domain, lim)
	if err != nil {
		return "", status.Errorf(codes.InvalidArgument, "descriptor limit override: %v", err)
	}
	st.kind, st.policy = kindLimited, p
	return key, nil
}

func (r rlsServer) response(descs []descriptor, checks []enforce.Check) *rlsv3.RateLimitResponse {
	now := r.svc.clock()
	resp := &rlsv3.RateLimitResponse{
		OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses:    make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(descs)),
	}
	// Headers describe the first enforced descriptor over the limit, else
	// the enforced one closest to it, as envoyproxy/ratelimit chooses. A
	// shadow descriptor never does: a dry run must not change what clients
	// see, so shadow descriptors alone get no headers (as the library's
	// Shadow strategy sends none).
	head, headOver := -1, false
	decs := make([]sluice.Decision, len(descs))
	for i := range descs {
		st := &descs[i]
		ds := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
		resp.Statuses[i] = ds
		switch st.kind {
		case kindUnlimited:
			ds.LimitRemaining = math.MaxUint32
			continue
		case kindNone:
			continue
		case kindBlocked:
			decs[i] = blockDecision(st)
			ds.CurrentLimit = currentLimit(st, sluice.Limit{Period: st.period})
			ds.CurrentLimit.Name = "" // a block's status names only its rate_limit's name
			if st.rl != nil {
				ds.CurrentLimit.Name = st.rl.Name
			}
			ds.DurationUntilReset = durationpb.New(0) // as the headers' reset: now
		case kindLimited:
			decs[i] = checks[st.check].Decision
			ds.CurrentLimit = currentLimit(st, checks[st.check].Rule.Limit)
			ds.LimitRemaining = uint32(min(decs[i].Remaining, math.MaxUint32))
			// The headers' reset: until the key is full again, so 0 for
			// one nothing has been taken from, whose window's end would
			// bring nothing back.
			ds.DurationUntilReset = durationpb.New(max(decs[i].ResetAfter, 0))
		}
		if st.shadow {
			continue
		}
		if !decs[i].Allowed {
			ds.Code = rlsv3.RateLimitResponse_OVER_LIMIT
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
			if !headOver {
				head, headOver = i, true
			}
			continue
		}
		if !headOver && (head < 0 || decs[i].Remaining < decs[head].Remaining) {
			head = i
		}
	}
	if head >= 0 {
		st := &descs[head]
		h := headerPool.Get().(http.Header)
		d := decs[head]
		header.All.Set(h, st.name(), d, now)
		if !d.Allowed && (st.kind == kindBlocked || keyCost(checks, st.check) > checks[st.check].Rule.Limit.Capacity()) {
			// More hits than the limit's capacity (a block's is 0), from
			// one descriptor or several naming the counter: no wait admits
			// them, and RateLimit's t on a denial is a wait. The
			// X-RateLimit-* fields and RateLimit-Policy still tell the
			// capacity.
			h.Del(header.RetryAfter)
			h.Del(header.RateLimit)
		}
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

// blockDecision is a block's (capacity 0): a hit is denied and no wait
// admits it, and a key that can hold nothing is as full as it gets, so its
// reset is now. A look is allowed, with nothing left.
func blockDecision(st *descriptor) sluice.Decision {
	return sluice.Decision{Allowed: st.hits == 0, Limit: sluice.Limit{Algorithm: sluice.FixedWindow, Period: st.period}}
}

// keyCost is what the request asks of check i's counter: the costs of
// every check naming its key, added up as the engine adds them
// (saturating).
func keyCost(checks []enforce.Check, i int) int64 {
	var sum int64
	for _, c := range checks {
		if c.Key != checks[i].Key {
			continue
		}
		if c.Cost > math.MaxInt64-sum {
			return math.MaxInt64
		}
		sum += c.Cost
	}
	return sum
}

func currentLimit(st *descriptor, lim sluice.Limit) *rlsv3.RateLimitResponse_RateLimit {
	l := &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: uint32(lim.Rate)}
	unit, period := lim.Period, lim.Period
	switch {
	case st.rl != nil:
		unit, period = st.rl.Unit, st.rl.Period // the unit as written; the window is unit × unit_multiplier
	case st.unit != 0:
		unit = st.unit // a limit override's unit as sent
	}
	if u, ok := envoyUnitByPeriod[unit]; ok {
		l.Unit = u
		if period > unit && period%unit == 0 {
			l.UnitMultiplier = wrapperspb.UInt32(uint32(period / unit))
		}
	}
	switch {
	case st.rl != nil:
		l.Name = st.rl.Name
	case !st.policy.Envoy():
		l.Name = st.policy.Name
	}
	return l
}
