package enforce

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice"
)

// KeyFunc says whom a request of type R is counted against. It returns
// its front end's no-key error when the request has no key of its kind.
type KeyFunc[R any] func(R) (string, error)

// Spec is a front end's rule over requests of type R: a Rule and the
// functions that apply it to one request.
type Spec[R any] struct {
	Rule
	// Key finds the request's key; required.
	Key KeyFunc[R]
	// Cost weighs the request in units of Limit; nil means 1.
	Cost func(R) int64
	// Match selects the requests the rule applies to; nil means all.
	Match func(R) bool
}

// Rules are the rules of one middleware over requests of type R, the
// engine they are checked with and the keyer of their store keys: what
// httplimit and grpclimit share. The zero value (or nil) has no rules:
// every request passes.
type Rules[R any] struct {
	eng   *Engine
	keyer *Keyer
	specs []Spec[R]
	bases []string // the key stems of specs (see Keyer.LimitStem)
	noKey error
}

// NewRules checks specs (see Setup) and returns them ready to collect.
// noKey is the front end's ErrNoKey: a KeyFunc returning it (wrapped or
// not) means the rule does not apply to the request.
func NewRules[R any](store sluice.Store, specs []Spec[R], prefix string, hashKey []byte, observer sluice.Observer, noKey error) (*Rules[R], error) {
	rules := make([]Rule, len(specs))
	for i := range specs {
		rules[i] = specs[i].Rule
	}
	eng, keyer, err := Setup(store, rules, func(i int) bool { return specs[i].Key != nil }, prefix, hashKey, observer)
	if err != nil {
		return nil, err
	}
	rs := &Rules[R]{eng: eng, keyer: keyer, specs: make([]Spec[R], len(specs)), bases: make([]string, len(specs)), noKey: noKey}
	for i := range specs {
		rs.specs[i] = specs[i]
		rs.specs[i].Rule = rules[i] // as Setup prepared it
		rs.bases[i] = keyer.LimitStem(keyer.Base(rules[i].Name), rules[i].Limit)
	}
	addPolicies(observer, false, len(rules), func(i int) string { return rules[i].Name })
	return rs, nil
}

// policyAdder is an Observer that makes a policy's series before its
// first event (promsluice.Collector), so that alerts on increase() see
// that event too.
type policyAdder interface {
	AddPolicy(name string, inFlight bool)
}

// addPolicies tells observer, if it is a policyAdder, of n policies named
// by name, of the kind inFlight says.
func addPolicies(observer sluice.Observer, inFlight bool, n int, name func(i int) string) {
	a, ok := observer.(policyAdder)
	if !ok {
		return
	}
	for i := range n {
		a.AddPolicy(name(i), inFlight)
	}
}

// Len returns the number of rules.
func (rs *Rules[R]) Len() int {
	if rs == nil {
		return 0
	}
	return len(rs.specs)
}

// Spec returns rule i, the Tag of its checks.
func (rs *Rules[R]) Spec(i int) *Spec[R] { return &rs.specs[i] }

// Collect appends to checks one check per rule that applies to req: its
// Match accepts req and its Key finds a key. Each check's Tag is its rule's
// index. An error (a Key failing otherwise, or a Cost below 1) names the
// rule, which is observed as OutcomeError; the front end wraps it. A Cost above the rule's capacity is kept:
// the engine refuses such a check without taking anything (see Never).
func (rs *Rules[R]) Collect(req R, checks []Check) ([]Check, error) {
	if rs == nil {
		return checks, nil
	}
	for i := range rs.specs {
		s := &rs.specs[i]
		if s.Match != nil && !s.Match(req) {
			continue
		}
		// A Shadow rule is a dry run: its failures are observed as errors
		// and never fail the request.
		shadow := s.Strategy == Shadow
		id, err := s.Key(req)
		if err != nil {
			if errors.Is(err, rs.noKey) {
				continue
			}
			// The rule could not decide: an error, observed as a store
			// failure is, so that a 500 shows in the metrics.
			rs.eng.observe(s.Name, sluice.OutcomeError, sluice.Decision{})
			if shadow {
				continue
			}
			return checks, fmt.Errorf("rule %q: %w", s.Name, err)
		}
		cost := int64(1)
		if s.Cost != nil {
			cost = s.Cost(req)
			if err := s.Limit.ValidateCost(cost); err != nil {
				switch {
				case errors.Is(err, sluice.ErrCostExceedsBurst):
					// No wait would admit it: the engine denies the
					// request without taking (a Shadow rule's is a shadow
					// denial), and the front end says it is for good.
				case shadow:
					rs.eng.observe(s.Name, sluice.OutcomeError, sluice.Decision{})
					continue
				default:
					rs.eng.observe(s.Name, sluice.OutcomeError, sluice.Decision{})
					return checks, fmt.Errorf("rule %q: %w", s.Name, err)
				}
			}
		}
		c := Check{Rule: &s.Rule, Cost: cost, Tag: i}
		c.Key, c.PenaltyKey = rs.keyer.Keys(rs.bases[i], id, s.Strategy == Penalty)
		checks = append(checks, c)
	}
	return checks, nil
}

// Never reports whether c asks more than its rule's capacity, so that no
// wait would admit it: the front end answers without a retry time.
func Never(c *Check) bool {
	return !c.Over && c.Cost > c.Rule.Limit.Capacity()
}

// Enforce decides the collected checks (see Engine.Enforce).
func (rs *Rules[R]) Enforce(ctx context.Context, checks []Check) (Verdict, error) {
	if len(checks) == 0 {
		return Verdict{Allowed: true, Report: -1}, nil
	}
	return rs.eng.Enforce(ctx, checks)
}
