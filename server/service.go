package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/logpace"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/server/config"
)

// Errors the service returns for bad requests. Store failures are returned
// as they come, wrapped.
var (
	// ErrUnknownPolicy: no policy has the requested name.
	ErrUnknownPolicy = errors.New("server: unknown policy")
	// ErrBadRequest: a request the service cannot answer (empty key, bad
	// cost); it also wraps the sluice error saying why.
	ErrBadRequest = errors.New("server: bad request")
	// ErrZeroService: the Service is a zero value, not built by NewService.
	ErrZeroService = errors.New("server: zero Service: build one with NewService")

	// Errors of in-flight requests (slots.go).

	// ErrBadToken: a token is not one Acquire returns (malformed).
	ErrBadToken = errors.New("server: malformed slot token")
	// ErrSlotNotHeld: a well-formed token whose slot is not held: it
	// expired at its hold timeout, or was never acquired (forged), or its
	// policy is gone. Nothing was freed.
	ErrSlotNotHeld = errors.New("server: slot not held")
	// ErrSlotElsewhere: a token's slot was granted by another instance's
	// local failure policy, held in that instance's memory, and the call
	// could not be passed on to it (Redis away, or it did not answer).
	// Nothing changed.
	ErrSlotElsewhere = errors.New("server: slot held by another instance")
	// ErrNoSlots: the store keeps no in-flight slots (a custom store that
	// does not implement sluice.Slots).
	ErrNoSlots = errors.New("server: the store keeps no in-flight slots")
)

// Result is a policy's decision for one key.
type Result struct {
	Policy *config.Policy
	Key    string
	// Decision is the policy's own answer: Allowed false when over the
	// limit, a shadow policy's included.
	Decision sluice.Decision
	// Allowed reports whether the request may be served: a shadow policy's
	// denial is let through.
	Allowed bool
	// Look marks a check of cost 0: never refused, though Decision may
	// carry a cached denial.
	Look bool
}

// ShadowDenied reports a shadow policy over its limit: let through, but
// counted as denied.
func (r Result) ShadowDenied() bool { return r.Allowed && !r.Decision.Allowed && !r.Look }

// Service is the state behind both transports (Envoy RLS over gRPC and the
// JSON API): the configuration in force, the engine (package
// internal/enforce) and its store keys, statistics and metrics. The
// transports turn their requests into the engine's checks and its verdict
// back into answers. It is safe for concurrent use; the configuration can
// be swapped at any time without disturbing requests in flight, which keep
// the snapshot they started with.
//
// The zero value refuses: its decisions fail with ErrZeroService, its
// handler answers 503 and its RLS UNAVAILABLE. Build one with NewService.
type Service struct {
	engine *enforce.Engine
	slots  sluice.Slots // nil when the store keeps none (slots.go)
	holds  *heldSlots
	// notes carries the slots released or extended here but acquired
	// through another instance, for the fleet to tell (fleetslots.go); nil
	// without a fleet.
	notes   chan slotNote
	keyer   *enforce.Keyer
	snap    atomic.Pointer[snapshot]
	clock   func() time.Time
	stats   *Stats
	mon     *monitor
	metrics *Metrics
	log     *slog.Logger
	version atomic.Uint64 // counts SetConfig calls
	leases  *lease.Store  // nil when the store cannot grant
	// dropped paces the lines of failed releases not sent again.
	dropped logpace.Pacer
	// retrying: the holders whose releases retryRelease sends again, by
	// when RetryRelease gives up (pendingReleases).
	retrying sync.Map

	keyLabels keyLabels // the top-key metrics' hashed labels

	unknownMu sync.Mutex
	unknown   map[string]bool // unknown domains logged, at most maxUnknownDomains

	// The shadow policies whose last store call failed (logged once until
	// one succeeds); shadowN counts them, so that a success costs no lock
	// while none is failing.
	shadowMu      sync.Mutex
	shadowFailing map[string]bool
	shadowN       atomic.Int32

	// rejected: why the configuration files on disk are not the one in
	// force; nil once SetConfig swaps one in.
	rejectedMu sync.Mutex
	rejected   *ConfigRejection
}

// maxUnknownDomains bounds the unknown domains remembered (each is logged
// once): a client sending random domains cannot grow the set, nor the log,
// past it.
const maxUnknownDomains = 1000

// maxDomainsLogged bounds the configured domains an unknown domain's log
// line lists.
const maxDomainsLogged = 10

// ServiceOptions configures a Service. A nil *ServiceOptions is valid.
type ServiceOptions struct {
	// KeyPrefix is prepended to every store key. Default: none (the Redis
	// store adds its own prefix).
	KeyPrefix string
	// HashKey, when set, replaces every key by its HMAC-SHA-256 in the
	// store, so raw client identities never reach Redis. Default: keys as
	// they are (hashed only when too long).
	HashKey []byte
	// Clock is used for statistics buckets, Envoy reset times and lease
	// lifetimes. Default time.Now.
	Clock func() time.Time
	// Metrics receives decision and store metrics. Default: none.
	Metrics *Metrics
	// FleetSize returns how many instances share the store: a lease holds
	// at most 1/(2 × FleetSize) of a limit's burst (lease.Options).
	// Default: nil, one instance.
	FleetSize func() int
	// Logger receives the service's events (unknown domains). Default:
	// slog.Default().
	Logger *slog.Logger
	// KeyHashSecret keys the hash that stands for a key in the top-key
	// metrics' labels (HMAC-SHA-256). Instances given the same secret show
	// a key under the same label. Default: a random secret, so labels
	// differ between instances and restarts.
	KeyHashSecret []byte
}

// NewService returns a Service deciding with store under cfg. Requests
// that check several limits at once need a sluice.MultiStore (the memory
// and Redis stores are); on another store they fail with
// enforce.ErrNeedMultiStore. When store can grant (sluice.Granter), the
// policies with a lease are answered from leases in front of it; Close
// returns their unused units. In-flight slots need a sluice.Slots; a
// repeated release of a token is 204 only on one that also remembers its
// releases (ReleaseOnce: the memory, Redis and resilient stores do).
func NewService(store sluice.Store, cfg *config.Config, opts *ServiceOptions) *Service {
	var o ServiceOptions
	if opts != nil {
		o = *opts
	}
	// Leases measure their lives on the monotonic clock unless a test
	// injects one: time.Now's wall reading would let a clock step back
	// stretch every live lease.
	leaseClock := o.Clock
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if store == nil {
		// Every decision then fails as a store never built does, rather
		// than panicking in the engine on a caller's request.
		store = unbuiltStore{}
	}
	s := &Service{keyer: enforce.NewKeyer(o.KeyPrefix, o.HashKey), clock: o.Clock, metrics: o.Metrics, log: o.Logger,
		keyLabels: newKeyLabels(o.KeyHashSecret)}
	s.stats = newStats(o.Clock)
	// Slots come from the store itself: leases wrap rate decisions only.
	s.slots, _ = store.(sluice.Slots) // nil: acquires fail with ErrNoSlots
	// Timed below the leases, as a failure-policy store is: grants,
	// returns and regrants are store calls of their own, and decisions a
	// lease answers are none.
	store = timedStore(store, o.Metrics)
	if s.leases = s.newLeases(store, leaseClock, &o); s.leases != nil {
		store = s.leases
	}
	s.engine = enforce.New(store, observer{s})
	s.holds = newHeldSlots(o.Clock, observer{s})
	o.Metrics.watchSlots(s.holds)
	s.mon = newMonitor(s)
	s.SetConfig(cfg)
	return s
}

// snapshot is a configuration with what the service keeps per policy,
// swapped in as one.
type snapshot struct {
	cfg   *config.Config
	bases map[*config.Policy]string // store key stems
	// stems are the key stems of the policies' rules, with their limits
	// (Keyer.LimitStem).
	stems map[*enforce.Rule]string
	// leases maps the stems of policies with a lease to its maximum
	// staleness.
	leases map[string]time.Duration
	// policies maps the policies' key stems (bases) back to their names.
	policies map[string]string
	rings    map[string]*ring // statistics by policy name
	// version travels with cfg, so whoever reads it can rely on
	// Config returning that configuration or a newer one.
	version uint64
	loaded  time.Time // when SetConfig swapped it in
}

// Config returns the configuration in force (an empty one for a zero
// Service).
func (s *Service) Config() *config.Config {
	if s == nil {
		return &config.Config{}
	}
	if snap := s.snap.Load(); snap != nil {
		return snap.cfg
	}
	return &config.Config{}
}

// SetConfig swaps in a new configuration and changes ConfigVersion; nil
// is an empty one. On a zero Service it does nothing.
func (s *Service) SetConfig(cfg *config.Config) {
	if s == nil || s.engine == nil {
		return
	}
	if cfg == nil {
		cfg = &config.Config{}
	}
	counted := countedPolicies(cfg)
	if old := s.snap.Load(); old != nil {
		kept := make(map[string]bool, len(counted))
		for _, p := range counted {
			kept[p.Name] = true
		}
		var gone []string
		for _, p := range countedPolicies(old.cfg) {
			if !kept[p.Name] {
				gone = append(gone, p.Name)
			}
		}
		s.holds.forget(gone)
		s.metrics.forget(gone)
		s.forgetShadows(gone)
		s.mon.top.forget(gone)
	}
	s.metrics.configured(counted)
	snap := &snapshot{cfg: cfg, bases: make(map[*config.Policy]string, len(cfg.Policies)), stems: map[*enforce.Rule]string{},
		policies: make(map[string]string, len(cfg.Policies)), version: s.version.Add(1), loaded: s.clock()}
	snap.rings = s.stats.setPolicies(counted)
	s.mon.setPolicies(cfg.Policies)
	for _, p := range cfg.Policies {
		snap.bases[p] = s.keyer.Base(p.Name)
		snap.policies[snap.bases[p]] = p.Name
		rules := p.Rules()
		for i := range rules {
			snap.stems[&rules[i]] = s.keyer.LimitStem(snap.bases[p], rules[i].Limit)
		}
		if p.Lease > 0 {
			if snap.leases == nil {
				snap.leases = map[string]time.Duration{}
			}
			snap.leases[snap.bases[p]] = p.Lease
		}
	}
	// Under rejectedMu, so that a rejection recorded after this swap is
	// never cleared by it.
	s.rejectedMu.Lock()
	s.snap.Store(snap)
	s.rejected = nil
	s.rejectedMu.Unlock()
}

// ConfigStatus is the configuration part of /v1/status: the one in force
// and, while the files on disk are rejected, why.
type ConfigStatus struct {
	// Version is /v1/stats's config_version of the configuration in force.
	Version uint64 `json:"version"`
	// LoadedAt is when it was loaded (at start or by a reload).
	LoadedAt time.Time `json:"loaded_at"`
	// Rejected is set while the last reload was rejected: the files on
	// disk are not what runs. The next successful reload clears it.
	Rejected *ConfigRejection `json:"rejected,omitempty"`
}

// ConfigRejection is why the configuration on disk is not in force.
type ConfigRejection struct {
	// At is when the last reload was rejected; Since when the first one
	// since the configuration in force was loaded was.
	At    time.Time `json:"at"`
	Since time.Time `json:"since"`
	// Error is the reload's error as logged; Errors the same, one problem
	// each, with its position when it has one.
	Error  string        `json:"error"`
	Errors []ConfigError `json:"errors"`
}

// ConfigError is one problem of a rejected configuration.
type ConfigError struct {
	File string `json:"file,omitempty"`
	// Line and Column are 1-based; absent for a problem of the file as a
	// whole (missing, unreadable, no policies).
	Line    int    `json:"line,omitempty"`
	Column  int    `json:"column,omitempty"`
	Message string `json:"message"`
}

// ConfigStatus reports the configuration in force and the last reload's
// rejection, if the files on disk are still rejected.
func (s *Service) ConfigStatus() ConfigStatus {
	if s == nil || s.engine == nil {
		return ConfigStatus{}
	}
	s.rejectedMu.Lock()
	defer s.rejectedMu.Unlock()
	snap := s.snap.Load()
	st := ConfigStatus{Version: snap.version, LoadedAt: snap.loaded}
	if r := s.rejected; r != nil {
		c := *r
		c.Errors = slices.Clone(r.Errors)
		st.Rejected = &c
	}
	return st
}

// rejectConfig records a reload of file that failed with err: the
// configuration in force stays, and ConfigStatus says why until SetConfig
// swaps in another.
func (s *Service) rejectConfig(file string, err error) {
	if s == nil || s.engine == nil || err == nil {
		return
	}
	now := s.clock()
	r := &ConfigRejection{At: now, Since: now, Error: err.Error(), Errors: configErrors(file, err)}
	s.rejectedMu.Lock()
	defer s.rejectedMu.Unlock()
	if s.rejected != nil {
		r.Since = s.rejected.Since
	}
	s.rejected = r
}

// configErrors splits a configuration error into its problems: the loader
// joins one *config.Error per problem; anything else is one problem of
// file.
func configErrors(file string, err error) []ConfigError {
	var out []ConfigError
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		if ce, ok := err.(*config.Error); ok {
			out = append(out, ConfigError{File: ce.File, Line: ce.Line, Column: ce.Column, Message: ce.Msg})
			return
		}
		out = append(out, ConfigError{File: file, Message: err.Error()})
	}
	walk(err)
	return out
}

// policyOf names the policy whose store key key is (a rate, in-flight or
// Penalty block key, whatever its limit), under the configuration in
// force; "" for another key (one of a limit a request carried).
func (s *Service) policyOf(key string) string {
	snap := s.snap.Load()
	if snap == nil {
		return ""
	}
	stem, ok := s.keyer.RuleStem(key) // a Penalty rule's block key too
	if !ok {
		return ""
	}
	return snap.policies[stem]
}

// countedPolicies are cfg's policies and, after them, its Envoy-format
// rules without one (blocks and unlimited ones, named by their paths):
// their decisions are counted too (rls.go), though they keep no state.
func countedPolicies(cfg *config.Config) []*config.Policy {
	out := slices.Clone(cfg.Policies)
	for _, name := range cfg.Stateless() {
		if cfg.Policy(name) == nil {
			out = append(out, &config.Policy{Name: name})
		}
	}
	return out
}

// ConfigVersion is a number that changes with every SetConfig, even one
// that swaps in an equal configuration, so clients can tell a reload.
func (s *Service) ConfigVersion() uint64 {
	if snap := s.snap.Load(); snap != nil {
		return snap.version
	}
	return 0
}

// Stats returns the rolling decision statistics (empty for a zero
// Service).
func (s *Service) Stats() *Stats {
	if s.stats == nil {
		return newStats(time.Now)
	}
	return s.stats
}

// RegisterRLS registers the service as Envoy's rate limit service
// (envoy.service.ratelimit.v3.RateLimitService) on g.
func (s *Service) RegisterRLS(g grpc.ServiceRegistrar) { registerRLS(g, s) }

// Handler returns the service's HTTP handler: the JSON API under /v1/,
// Envoy's JSON form of ShouldRateLimit at /json (as envoyproxy/ratelimit
// serves it), /healthz, /readyz, /metrics and the dashboard at "/".
// A zero Service's handler answers every request 503.
func (s *Service) Handler(opts *HandlerOptions) http.Handler {
	if s.engine == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			problem(w, http.StatusServiceUnavailable, ErrZeroService.Error())
		})
	}
	return newHandler(s, opts)
}

// unknownDomain records an Envoy request for a domain the configuration
// lacks: counted every time, logged once per domain.
func (s *Service) unknownDomain(name string) {
	s.metrics.unknownDomain()
	s.unknownMu.Lock()
	defer s.unknownMu.Unlock()
	// Remembered and logged clipped: a client's domain may be a megabyte.
	name = clip(name, logClip)
	switch {
	case s.unknown[name]:
	case len(s.unknown) < maxUnknownDomains:
		if s.unknown == nil {
			s.unknown = map[string]bool{}
		}
		s.unknown[name] = true
		domains := s.snap.Load().cfg.Domains()
		if len(domains) > maxDomainsLogged {
			domains = append(domains[:maxDomainsLogged:maxDomainsLogged], fmt.Sprintf("…(%d domains)", len(domains)))
		}
		s.log.Warn("rate limit request for an unknown domain: answered OK", "domain", name, "domains", domains)
		if len(s.unknown) == maxUnknownDomains {
			s.log.Warn("too many unknown domains: no longer logging each; sluice_rls_unknown_domain_requests_total still counts them", "remembered", maxUnknownDomains)
		}
	}
}

// policyBase is the stem of p's store keys; a policy made up per request
// (an Envoy limit override) has none kept.
func (s *Service) policyBase(p *config.Policy) string {
	if base, ok := s.snap.Load().bases[p]; ok {
		return base
	}
	return s.keyer.Base(p.Name)
}

// ruleStem is the stem of the store keys of rule, one of p's: its name's
// and its limit's, so that instances holding different limits for p (a
// rollout) never read each other's counters.
func (s *Service) ruleStem(p *config.Policy, rule *enforce.Rule) string {
	if stem, ok := s.snap.Load().stems[rule]; ok {
		return stem
	}
	return s.keyer.LimitStem(s.policyBase(p), rule.Limit)
}

// check is the engine check of key under p, taking cost units (0: only
// look).
func (s *Service) check(p *config.Policy, key string, cost int64) enforce.Check {
	rule := p.Rule(key)
	base := s.ruleStem(p, rule)
	c := enforce.Check{Rule: rule, Cost: cost}
	c.Key, c.PenaltyKey = s.keyer.Keys(base, key, rule.Strategy == enforce.Penalty)
	return c
}

// enforce decides checks, giving each its decision; keys are the checks'
// client keys, for the operators' view (top keys, latency).
func (s *Service) enforce(ctx context.Context, checks []enforce.Check, keys []string) (enforce.Verdict, error) {
	start := time.Now()
	v, err := s.engine.EnforceAll(ctx, checks)
	if err != nil {
		return v, fmt.Errorf("server: store: %w", err)
	}
	s.mon.record(checks, keys, time.Since(start))
	s.noteShadows(checks)
	return v, nil
}

// forgetShadows drops the removed policies' failing marks.
func (s *Service) forgetShadows(policies []string) {
	s.shadowMu.Lock()
	defer s.shadowMu.Unlock()
	for _, p := range policies {
		if s.shadowFailing[p] {
			delete(s.shadowFailing, p)
			s.shadowN.Add(-1)
		}
	}
}

// noteShadows logs a shadow policy whose store call failed: the request
// was let through (a dry run never blocks), so only its outcome="error"
// in the metrics and the errors of /v1/stats show it. One line when a
// policy's calls start failing, with the cause (misconfigured: the store
// refused what the policy asks, which no retry mends), one when one
// succeeds again.
func (s *Service) noteShadows(checks []enforce.Check) {
	for i := range checks {
		c := &checks[i]
		if c.Rule.Strategy != enforce.Shadow || c.Cost == 0 || c.Over || (c.Err == nil && s.shadowN.Load() == 0) {
			continue
		}
		name := c.Rule.Name
		s.shadowMu.Lock()
		switch {
		case c.Err != nil && !s.shadowFailing[name]:
			if s.shadowFailing == nil {
				s.shadowFailing = map[string]bool{}
			}
			s.shadowFailing[name] = true
			s.shadowN.Add(1)
			s.log.Warn("shadow policy's store call failed: requests let through, counted as errors (outcome=\"error\"; errors in /v1/stats) until one succeeds",
				"policy", name, "misconfigured", enforce.Misconfigured(c.Err), "error", c.Err)
		case c.Err == nil && s.shadowFailing[name]:
			delete(s.shadowFailing, name)
			s.shadowN.Add(-1)
			s.log.Info("shadow policy's store calls succeeding again", "policy", name)
		}
		s.shadowMu.Unlock()
	}
}

// Check takes cost units (the policy's cost when cost is 0) for key under
// the named policy. A shadow policy over its limit is let through:
// Result.Allowed true, Decision.Allowed false.
func (s *Service) Check(ctx context.Context, policy, key string, cost int64) (Result, error) {
	return s.decide(ctx, policy, key, cost, false)
}

// Look reports key's state under the named policy without taking anything:
// a check of cost 0, never over the limit and not counted.
func (s *Service) Look(ctx context.Context, policy, key string) (Result, error) {
	return s.decide(ctx, policy, key, 0, true)
}

func (s *Service) decide(ctx context.Context, policy, key string, cost int64, look bool) (Result, error) {
	p, c, err := s.request(policy, key, cost)
	if err != nil {
		return Result{}, err
	}
	if look {
		c.Cost = 0
	}
	checks := [1]enforce.Check{c}
	v, err := s.enforce(ctx, checks[:], []string{key})
	if err != nil {
		return Result{}, err
	}
	d := checks[0].Decision
	if look && d.Source == sluice.SourceDenyCache {
		// The deny cache keeps denials only: a look it answers tells that
		// denial and its wait, not an "allowed" nobody decided.
		if pd, err := s.engine.Peek(ctx, &c); err == nil && pd.Source == sluice.SourceDenyCache {
			d = pd
		}
		d.Allowed = false
	}
	return Result{Policy: p, Key: key, Decision: d, Allowed: v.Allowed, Look: look}, nil
}

// Peek reports what Check would decide without taking anything. It is
// not counted in statistics.
func (s *Service) Peek(ctx context.Context, policy, key string, cost int64) (Result, error) {
	p, c, err := s.request(policy, key, cost)
	if err != nil {
		return Result{}, err
	}
	d, err := s.engine.Peek(ctx, &c)
	if err != nil {
		return Result{}, fmt.Errorf("server: store: %w", err)
	}
	return Result{Policy: p, Key: key, Decision: d, Allowed: d.Allowed || p.Strategy == enforce.Shadow}, nil
}

// Reset returns key to its fresh state under the named policy, ending a
// penalty block too.
func (s *Service) Reset(ctx context.Context, policy, key string) error {
	_, c, err := s.request(policy, key, 1)
	if err != nil {
		return err
	}
	if err := s.engine.Reset(ctx, &c); err != nil {
		return fmt.Errorf("server: store: %w", err)
	}
	return nil
}

// request validates a JSON API request and returns its check; cost 0 is
// the policy's cost.
func (s *Service) request(policy, key string, cost int64) (*config.Policy, enforce.Check, error) {
	if s == nil || s.engine == nil {
		return nil, enforce.Check{}, ErrZeroService
	}
	cfg := s.Config()
	p := cfg.Policy(policy)
	if p == nil {
		return nil, enforce.Check{}, fmt.Errorf("%w: %q", ErrUnknownPolicy, policy)
	}
	if p.InFlight != nil {
		return nil, enforce.Check{}, fmt.Errorf("%w: policy %q bounds requests in flight, not a rate: use /v1/acquire", ErrBadRequest, policy)
	}
	// No length cap: the keyer hashes a key too long for the store, as it
	// does the same key rendered from Envoy descriptors, so both front ends
	// reach one counter.
	if key == "" {
		return nil, enforce.Check{}, fmt.Errorf("%w: %w", ErrBadRequest, sluice.ValidateKey(key))
	}
	if !cfg.Reaches(p, key) {
		if why := p.KeyEscapeProblem(key); why != "" {
			return nil, enforce.Check{}, fmt.Errorf("%w: key %q of policy %q: %s", ErrBadRequest, clip(key, logClip), policy, why)
		}
		if counted, ok := cfg.CountedKey(p, key); ok {
			return nil, enforce.Check{}, fmt.Errorf("%w: Envoy's requests with the entries of key %q count under key %q of policy %q (a share_threshold wildcard counts every value it matches as one, and ipv6_prefix groups addresses): send that", ErrBadRequest, key, counted, policy)
		}
		return nil, enforce.Check{}, fmt.Errorf("%w: no descriptor reaches key %q of policy %q: write the descriptor's entries, key=value,key=value", ErrBadRequest, key, policy)
	}
	if cost == 0 {
		cost = p.Cost
	}
	c := s.check(p, key, cost)
	if err := c.Rule.Limit.ValidateCost(cost); err != nil {
		return nil, enforce.Check{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return p, c, nil
}

// observer counts the engine's decisions and the in-flight events in the
// statistics and metrics.
type observer struct{ s *Service }

var _ sluice.SlotObserver = observer{}

func (o observer) ObserveDecision(e sluice.DecisionEvent) {
	if r := o.s.snap.Load().rings[e.Policy]; r != nil {
		if e.Outcome == sluice.OutcomeError {
			o.s.stats.addError(r)
		} else {
			o.s.stats.add(r, e.Outcome != sluice.OutcomeAllowed)
			if e.Decision.Source == sluice.SourceLease {
				o.s.stats.addLocal(r)
			}
		}
	}
	if m := o.s.metrics; m != nil {
		m.ObserveDecision(e)
	}
}

func (o observer) ObserveSlot(e sluice.SlotEvent) {
	if e.Op == sluice.SlotAcquire {
		if r := o.s.snap.Load().rings[e.Policy]; r != nil {
			if e.Outcome == sluice.OutcomeError {
				o.s.stats.addError(r)
			} else {
				o.s.stats.add(r, e.Outcome != sluice.OutcomeAllowed)
			}
		}
	}
	if m := o.s.metrics; m != nil {
		m.ObserveSlot(e)
	}
}

func (observer) ObserveStore(sluice.StoreEvent)     {}
func (observer) ObserveBreaker(sluice.BreakerEvent) {}

// unbuiltStore stands in for the nil store NewService was given.
type unbuiltStore struct{}

var errNilStore = fmt.Errorf("%w: NewService was given a nil store", sluice.ErrStoreNotBuilt)

func (unbuiltStore) Take(context.Context, string, sluice.Limit, int64) (sluice.Decision, error) {
	return sluice.Decision{}, errNilStore
}

func (unbuiltStore) Peek(context.Context, string, sluice.Limit, int64) (sluice.Decision, error) {
	return sluice.Decision{}, errNilStore
}

func (unbuiltStore) Reset(context.Context, string, sluice.Limit) error { return errNilStore }

func (unbuiltStore) CheckBuilt() error { return errNilStore }
