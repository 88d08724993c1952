package server

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Errors the service returns for bad requests. Store failures are returned
// as they come, wrapped.
var (
	// ErrUnknownPolicy: no policy has the requested name.
	ErrUnknownPolicy = errors.New("server: unknown policy")
	// ErrBadRequest: a request the service cannot answer (empty key, bad
	// cost); it also wraps the sluice error saying why.
	ErrBadRequest = errors.New("server: bad request")
)

// Outcome is how a decision is counted.
type Outcome uint8

const (
	Allowed Outcome = iota
	Denied
	// ShadowDenied: over the limit under a shadow policy, so let through.
	ShadowDenied
)

func (o Outcome) String() string {
	switch o {
	case Denied:
		return "denied"
	case ShadowDenied:
		return "shadow_denied"
	}
	return "allowed"
}

// Result is a policy's decision for one key.
type Result struct {
	Policy   *Policy
	Key      string
	Decision sluice.Decision
	Outcome  Outcome
	// Latency is how long the store took to decide (for several
	// descriptors decided together, the whole call).
	Latency time.Duration
}

// Service makes the decisions behind both transports (Envoy RLS over gRPC
// and the JSON API): policy lookup, store keys, all-or-nothing checks,
// shadow policies, statistics and metrics. It is safe for concurrent use;
// the configuration can be swapped at any time without disturbing
// requests in flight, which keep the snapshot they started with. Make one
// with NewService: the zero value is not usable.
type Service struct {
	store   sluice.Store
	multi   sluice.MultiStore // nil if store cannot TakeAll
	snap    atomic.Pointer[snapshot]
	prefix  string
	clock   func() time.Time
	stats   *Stats
	mon     *monitor
	metrics *Metrics
	version atomic.Uint64 // counts SetConfig calls

	// When the store has no TakeAll, multi-limit checks take this lock
	// exclusively (peek all, then take all) while single takes share it, so
	// no other take can slip in between. It only makes sense for a store
	// private to this process, such as the memory store.
	takeMu sync.RWMutex
}

// ServiceOptions configures a Service. A nil *ServiceOptions is valid.
type ServiceOptions struct {
	// KeyPrefix is prepended to every store key. Default: none (the Redis
	// store adds its own prefix).
	KeyPrefix string
	// Clock is used for statistics buckets and Envoy reset times.
	// Default time.Now.
	Clock func() time.Time
	// Metrics receives decision and store metrics. Default: none.
	Metrics *Metrics
}

// NewService returns a Service deciding with store under cfg.
func NewService(store sluice.Store, cfg *Config, opts *ServiceOptions) *Service {
	var o ServiceOptions
	if opts != nil {
		o = *opts
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	s := &Service{store: store, prefix: o.KeyPrefix, clock: o.Clock, metrics: o.Metrics}
	s.multi, _ = store.(sluice.MultiStore)
	s.stats = newStats(o.Clock)
	s.mon = newMonitor(s)
	s.SetConfig(cfg)
	return s
}

// snapshot is a configuration with what the service keeps per policy,
// swapped in as one.
type snapshot struct {
	cfg *Config
	rt  map[*Policy]*policyRuntime
	// version travels with cfg, so whoever reads it can rely on
	// Config returning that configuration or a newer one.
	version uint64
}

// policyRuntime is a policy's precomputed key prefix and statistics ring,
// so that a decision takes no lock.
type policyRuntime struct {
	keyPrefix string
	stats     *ring
}

// Config returns the configuration in force.
func (s *Service) Config() *Config { return s.snap.Load().cfg }

// SetConfig swaps in a new configuration and changes ConfigVersion.
func (s *Service) SetConfig(cfg *Config) {
	if old := s.snap.Load(); old != nil {
		var gone []string
		for _, p := range old.cfg.Policies {
			if cfg.Policy(p.Name) == nil {
				gone = append(gone, p.Name)
			}
		}
		s.metrics.forget(gone)
	}
	rings := s.stats.setPolicies(cfg.Policies)
	s.mon.setPolicies(cfg.Policies)
	snap := &snapshot{cfg: cfg, rt: make(map[*Policy]*policyRuntime, len(cfg.Policies)), version: s.version.Add(1)}
	for _, p := range cfg.Policies {
		snap.rt[p] = &policyRuntime{keyPrefix: s.keyPrefix(p), stats: rings[p.Name]}
	}
	s.snap.Store(snap)
}

// ConfigVersion is a number that changes with every SetConfig, even one
// that swaps in an equal configuration, so clients can tell a reload.
func (s *Service) ConfigVersion() uint64 { return s.snap.Load().version }

// runtime returns p's runtime state; policies made up per request (Envoy
// limit overrides) get a fresh one without statistics.
func (s *Service) runtime(p *Policy) *policyRuntime {
	if rt := s.snap.Load().rt[p]; rt != nil {
		return rt
	}
	return &policyRuntime{keyPrefix: s.keyPrefix(p)}
}

func (s *Service) keyPrefix(p *Policy) string {
	var b strings.Builder
	b.WriteString(s.prefix)
	escapeTo(&b, p.Name)
	b.WriteByte('|')
	return b.String()
}

// Stats returns the rolling decision statistics.
func (s *Service) Stats() *Stats { return s.stats }

// storeKey is the store key of a policy's key: prefix, policy name
// (escaped, so it cannot run into the key), '|' and key. Keys that would be too
// long for the store are hashed; so is the policy name with the key when the
// name alone is too long (a deep Envoy descriptor path).
func (s *Service) storeKey(p *Policy, key string) string {
	prefix := s.runtime(p).keyPrefix
	switch {
	case len(prefix)+len(key) <= sluice.MaxKeyLen:
		return prefix + key
	case len(prefix)+1+2*sha256.Size <= sluice.MaxKeyLen:
		sum := sha256.Sum256([]byte(key))
		return prefix + "#" + hex.EncodeToString(sum[:])
	}
	sum := sha256.Sum256([]byte(prefix[len(s.prefix):] + key)) // the name ends in '|'
	return s.prefix + "##" + hex.EncodeToString(sum[:])
}

func (s *Service) policy(name string) (*Config, *Policy, error) {
	cfg := s.Config()
	p := cfg.Policy(name)
	if p == nil {
		return cfg, nil, fmt.Errorf("%w: %q", ErrUnknownPolicy, name)
	}
	return cfg, p, nil
}

func checkKey(key string) error {
	if err := sluice.ValidateKey(key); err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return nil
}

// Check takes cost units (the policy's cost when cost is 0) for key under
// the named policy. A shadow policy's denial is reported with Outcome
// ShadowDenied and Decision.Allowed false; the caller lets it through.
func (s *Service) Check(ctx context.Context, policy, key string, cost int64) (Result, error) {
	return s.decide(ctx, policy, key, cost, true)
}

// Peek reports what Check would decide without taking anything. It is
// not counted in statistics.
func (s *Service) Peek(ctx context.Context, policy, key string, cost int64) (Result, error) {
	return s.decide(ctx, policy, key, cost, false)
}

func (s *Service) decide(ctx context.Context, policy, key string, cost int64, take bool) (Result, error) {
	_, p, err := s.policy(policy)
	if err != nil {
		return Result{}, err
	}
	if err := checkKey(key); err != nil {
		return Result{}, err
	}
	if cost == 0 {
		cost = p.Cost
	}
	lim := p.limitFor(key)
	if err := lim.ValidateCost(cost); err != nil {
		return Result{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	var d sluice.Decision
	start := time.Now()
	if take {
		d, err = s.take(ctx, s.storeKey(p, key), lim, cost)
	} else {
		d, err = s.peek(ctx, s.storeKey(p, key), lim, cost)
	}
	if err != nil {
		if take {
			s.metrics.decisionError(p.Name)
		}
		return Result{}, err
	}
	r := Result{Policy: p, Key: key, Decision: d, Outcome: outcome(p, d), Latency: time.Since(start)}
	if take {
		s.record(r)
	}
	return r, nil
}

func outcome(p *Policy, d sluice.Decision) Outcome {
	switch {
	case d.Allowed:
		return Allowed
	case p.Strategy == Shadow:
		return ShadowDenied
	}
	return Denied
}

// Reset returns key to its fresh state under the named policy.
func (s *Service) Reset(ctx context.Context, policy, key string) error {
	_, p, err := s.policy(policy)
	if err != nil {
		return err
	}
	if err := checkKey(key); err != nil {
		return err
	}
	sk := s.storeKey(p, key)
	lim := p.limitFor(key)
	if err := s.observe("reset", func() error { return s.store.Reset(ctx, sk, lim) }); err != nil {
		return err
	}
	return nil
}

func (s *Service) record(r Result) {
	rt := s.runtime(r.Policy)
	if rt.stats != nil {
		s.stats.add(rt.stats, r.Outcome != Allowed)
		s.mon.record(r)
	}
	s.metrics.decision(r)
}

func (s *Service) observe(op string, f func() error) error {
	start := time.Now()
	err := f()
	s.metrics.store(op, time.Since(start), err)
	if err != nil {
		return fmt.Errorf("server: store %s: %w", op, err)
	}
	return nil
}

func (s *Service) take(ctx context.Context, key string, lim sluice.Limit, cost int64) (sluice.Decision, error) {
	var d sluice.Decision
	err := s.observe("take", func() error {
		if s.multi == nil {
			s.takeMu.RLock()
			defer s.takeMu.RUnlock()
		}
		var err error
		d, err = s.store.Take(ctx, key, lim, cost)
		return err
	})
	return d, err
}

func (s *Service) peek(ctx context.Context, key string, lim sluice.Limit, cost int64) (sluice.Decision, error) {
	var d sluice.Decision
	err := s.observe("peek", func() error {
		var err error
		d, err = s.store.Peek(ctx, key, lim, cost)
		return err
	})
	return d, err
}

// takeAll takes every request's units or none, through the store's TakeAll
// when it has one.
func (s *Service) takeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	if len(reqs) == 1 {
		d, err := s.take(ctx, reqs[0].Key, reqs[0].Limit, reqs[0].Cost)
		if err != nil {
			return nil, err
		}
		return []sluice.Decision{d}, nil
	}
	var out []sluice.Decision
	err := s.observe("take_all", func() error {
		var err error
		if s.multi != nil {
			out, err = s.multi.TakeAll(ctx, reqs)
			return err
		}
		s.takeMu.Lock()
		defer s.takeMu.Unlock()
		out = make([]sluice.Decision, len(reqs))
		all := true
		for i, r := range reqs {
			if out[i], err = s.store.Peek(ctx, r.Key, r.Limit, r.Cost); err != nil {
				return err
			}
			all = all && out[i].Allowed
		}
		if !all {
			return nil
		}
		// Under the lock nothing else takes, and time only gives units
		// back, so every take succeeds.
		for i, r := range reqs {
			if out[i], err = s.store.Take(ctx, r.Key, r.Limit, r.Cost); err != nil {
				return err
			}
		}
		return nil
	})
	return out, err
}
