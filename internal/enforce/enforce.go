// Package enforce is the policy engine shared by the HTTP and gRPC
// middleware (and the service): given the rules that apply to one request,
// it checks them against a Store all-or-nothing, applies each rule's
// strategy (reject, delay, shadow, penalty), reports to an Observer, and
// picks the decision the response should describe.
//
// Front ends do the request-specific part: which rules match, the key and
// the cost of each, and how a verdict is written back.
package enforce

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
)

// Strategy is what a rule does with a request over its limit.
type Strategy uint8

const (
	// Reject answers at once with "too many requests". The zero value.
	Reject Strategy = iota
	// Delay waits for quota up to the rule's MaxDelay, then serves; a
	// request that would need longer is rejected at once.
	Delay
	// Shadow decides and records but never blocks: a dry run. Shadow rules
	// take their own units apart from the enforcing rules.
	Shadow
	// Penalty rejects, and on a violation blocks the key for the rule's
	// Penalty duration. The block is a key in the store, so it holds across
	// a fleet. A denial made up by a failure policy (Decision.Source
	// SourceFailClosed) is no violation and starts no block.
	Penalty
)

var strategyNames = [...]string{"reject", "delay", "shadow", "penalty"}

// String returns the strategy's config name.
func (s Strategy) String() string {
	if int(s) < len(strategyNames) {
		return strategyNames[s]
	}
	return fmt.Sprintf("Strategy(%d)", uint8(s))
}

// ParseStrategy parses a config name ("reject", "delay", "shadow" or
// "dry_run", "penalty").
func ParseStrategy(s string) (Strategy, error) {
	switch s {
	case "", "reject":
		return Reject, nil
	case "delay":
		return Delay, nil
	case "shadow", "dry_run", "dry-run":
		return Shadow, nil
	case "penalty":
		return Penalty, nil
	}
	return 0, fmt.Errorf("%w: unknown strategy %q (want reject, delay, shadow or penalty)", ErrInvalidRule, s)
}

// Errors.
var (
	// ErrInvalidRule: a rule failed Validate.
	ErrInvalidRule = errors.New("invalid rule")
	// ErrNeedMultiStore: several enforcing rules apply but the store cannot
	// check them all-or-nothing.
	ErrNeedMultiStore = errors.New("layered limits need a sluice.MultiStore")
)

// Rule is a named limit with a strategy.
type Rule struct {
	// Name identifies the policy in headers, problem bodies and metrics.
	Name     string
	Limit    sluice.Limit
	Strategy Strategy
	// MaxDelay is the longest a Delay rule waits.
	MaxDelay time.Duration
	// MaxWaiting bounds the requests a Delay rule holds at once in this
	// process; past it, a request over the limit is rejected at once, so
	// that a flood cannot pile up held requests. 0 means DefaultMaxWaiting.
	MaxWaiting int
	// Penalty is how long a Penalty rule blocks a key after a violation.
	Penalty time.Duration

	waiting *atomic.Int64 // requests held now (Delay rules set up by Setup)
}

// hold takes a waiting slot on every Delay rule among the checks at idx,
// or none if one of them is full.
func hold(checks []Check, idx []int) bool {
	for n, i := range idx {
		r := checks[i].Rule
		if r.waiting == nil {
			continue
		}
		limit := int64(r.MaxWaiting)
		if limit == 0 {
			limit = DefaultMaxWaiting
		}
		if r.waiting.Add(1) > limit {
			r.waiting.Add(-1)
			release(checks, idx[:n])
			return false
		}
	}
	return true
}

// release returns the slots hold took.
func release(checks []Check, idx []int) {
	for _, i := range idx {
		if w := checks[i].Rule.waiting; w != nil {
			w.Add(-1)
		}
	}
}

// MaxNameLen bounds rule names.
const MaxNameLen = 64

// DefaultMaxWaiting is a Delay rule's MaxWaiting when none is set.
const DefaultMaxWaiting = 1024

// Validate checks r. Names are 1 to MaxNameLen bytes of letters, digits,
// '_', '-' and '.': they appear in store keys, header fields and metric
// labels, and the characters they exclude separate key parts.
func (r *Rule) Validate() error {
	if err := ValidateName(r.Name); err != nil {
		return err
	}
	if err := r.Limit.Validate(); err != nil {
		return fmt.Errorf("%w: %q: %w", ErrInvalidRule, r.Name, err)
	}
	switch r.Strategy {
	case Reject, Shadow:
	case Delay:
		if r.MaxDelay <= 0 {
			return fmt.Errorf("%w: %q: delay needs a positive MaxDelay", ErrInvalidRule, r.Name)
		}
		if r.MaxWaiting < 0 {
			return fmt.Errorf("%w: %q: negative MaxWaiting %d", ErrInvalidRule, r.Name, r.MaxWaiting)
		}
	case Penalty:
		if err := r.PenaltyLimit().Validate(); err != nil || r.Penalty <= 0 {
			return fmt.Errorf("%w: %q: penalty %v must be between %v and %v", ErrInvalidRule, r.Name, r.Penalty, sluice.MinPeriod, sluice.MaxPeriod)
		}
	default:
		return fmt.Errorf("%w: %q: unknown strategy %d", ErrInvalidRule, r.Name, r.Strategy)
	}
	return nil
}

// ValidateName checks a rule name.
func ValidateName(name string) error {
	if name == "" || len(name) > MaxNameLen {
		return fmt.Errorf("%w: name %q must be 1 to %d bytes", ErrInvalidRule, name, MaxNameLen)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-' || c == '.') {
			return fmt.Errorf("%w: name %q: only letters, digits, '_', '-' and '.' are allowed", ErrInvalidRule, name)
		}
	}
	return nil
}

// PenaltyLimit is the limit of a rule's block key: one unit per Penalty, so
// taking it blocks the key for exactly Penalty.
func (r *Rule) PenaltyLimit() sluice.Limit {
	return sluice.Limit{Algorithm: sluice.GCRA, Rate: 1, Period: r.Penalty}
}

// Check is one rule applied to one request.
type Check struct {
	Rule *Rule
	// Key is the store key for the rule's limit.
	Key string
	// PenaltyKey is the store key of the rule's block (Penalty rules only).
	// It must never equal any rule's Key.
	PenaltyKey string
	Cost       int64
	// Tag is the front end's own reference to the rule (an index); the
	// engine does not read it.
	Tag int
}

// Verdict is the engine's answer for one request.
type Verdict struct {
	// Allowed reports whether the request may be served.
	Allowed bool
	// Report indexes the check whose Decision the response should describe:
	// when denied, the violated rule needing the longest wait; when allowed,
	// the enforcing rule closest to exhaustion. -1 when no enforcing rule
	// applied.
	Report int
	// Decision is the reported check's decision. For a Penalty rule that
	// blocks, RetryAfter is the time left in the block.
	Decision sluice.Decision
	// Waited is how long Delay rules held the request.
	Waited time.Duration
}

// Engine checks rules against a store. It is safe for concurrent use.
type Engine struct {
	store    sluice.Store
	multi    sluice.MultiStore // nil if store is not one
	observer sluice.Observer
}

// New returns an Engine over store, reporting to observer (which may be
// nil).
func New(store sluice.Store, observer sluice.Observer) *Engine {
	e := &Engine{store: store, observer: observer}
	e.multi, _ = store.(sluice.MultiStore)
	return e
}

// Multi reports whether the store checks layered limits all-or-nothing.
func (e *Engine) Multi() bool { return e.multi != nil }

// Enforce decides one request. Errors are store failures (or
// ErrNeedMultiStore); checks are not modified.
func (e *Engine) Enforce(ctx context.Context, checks []Check) (Verdict, error) {
	enforcing := 0
	for i := range checks {
		if checks[i].Rule.Strategy == Shadow {
			e.shadow(ctx, &checks[i])
		} else {
			enforcing++
		}
	}
	failed := Verdict{Report: -1} // returned with every error: never Allowed
	switch enforcing {
	case 0:
		return Verdict{Allowed: true, Report: -1}, nil
	case 1:
	default:
		if e.multi == nil {
			return failed, ErrNeedMultiStore
		}
	}
	blocked := Verdict{Report: -1}
	for i := range checks {
		c := &checks[i]
		if c.Rule.Strategy != Penalty {
			continue
		}
		d, err := e.store.Peek(ctx, c.PenaltyKey, c.Rule.PenaltyLimit(), 1)
		if err != nil {
			e.observeErrors(checks)
			return failed, err
		}
		if !d.Allowed {
			b := sluice.Decision{Limit: c.Rule.Limit, RetryAfter: d.RetryAfter, ResetAfter: d.RetryAfter, Source: d.Source}
			e.observe(c.Rule.Name, sluice.OutcomeDenied, b)
			// Report the block needing the longest wait.
			if blocked.Report < 0 || b.RetryAfter > blocked.Decision.RetryAfter {
				blocked = Verdict{Report: i, Decision: b}
			}
		}
	}
	if blocked.Report >= 0 {
		return blocked, nil
	}
	var (
		one    [1]sluice.Decision
		oneIdx [1]int
		reqs   []sluice.Request // nil for a single rule: Take, not TakeAll
		idx    = oneIdx[:0]     // ds[j] is the decision of checks[idx[j]]
	)
	if enforcing > 1 {
		reqs = make([]sluice.Request, 0, enforcing)
		idx = make([]int, 0, enforcing)
	}
	for i := range checks {
		if c := &checks[i]; c.Rule.Strategy != Shadow {
			idx = append(idx, i)
			if enforcing > 1 {
				reqs = append(reqs, sluice.Request{Key: c.Key, Limit: c.Rule.Limit, Cost: c.Cost})
			}
		}
	}
	var waited time.Duration
	var timer *time.Timer
	held := false
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if held {
			release(checks, idx)
		}
	}()
	for {
		ds := one[:]
		var err error
		if reqs == nil {
			c := &checks[idx[0]]
			one[0], err = e.store.Take(ctx, c.Key, c.Rule.Limit, c.Cost)
		} else {
			ds, err = e.multi.TakeAll(ctx, reqs)
			if err == nil && len(ds) != len(reqs) {
				err = fmt.Errorf("enforce: store returned %d decisions for %d limits", len(ds), len(reqs))
			}
		}
		if err != nil {
			e.observeErrors(checks)
			return failed, err
		}
		deny, wait := -1, true
		var longest time.Duration
		maxWait := time.Duration(-1)
		for j, d := range ds {
			if d.Allowed {
				continue
			}
			r := checks[idx[j]].Rule
			if deny < 0 || d.RetryAfter > longest {
				deny, longest = j, d.RetryAfter
			}
			if r.Strategy != Delay {
				wait = false
			} else if maxWait < 0 || r.MaxDelay < maxWait {
				maxWait = r.MaxDelay
			}
		}
		if deny < 0 {
			for j, d := range ds {
				e.observe(checks[idx[j]].Rule.Name, sluice.OutcomeAllowed, d)
			}
			j := closest(ds)
			return Verdict{Allowed: true, Report: idx[j], Decision: ds[j], Waited: waited}, nil
		}
		// A denial with no wait would make this loop spin on the store.
		pause := max(longest, time.Millisecond)
		if wait && waited+pause <= maxWait && ctx.Err() == nil && (held || hold(checks, idx)) {
			held = true
			if timer == nil {
				timer = time.NewTimer(pause)
			} else {
				timer.Reset(pause)
			}
			select {
			case <-timer.C:
				waited += pause
				continue
			case <-ctx.Done():
			}
		}
		out := Verdict{Report: idx[deny], Decision: ds[deny], Waited: waited}
		for j, d := range ds {
			if d.Allowed {
				continue
			}
			c := &checks[idx[j]]
			if c.Rule.Strategy == Penalty && !madeUp(d) {
				if block, ok := e.block(ctx, c); ok {
					d.RetryAfter = max(d.RetryAfter, block)
					d.ResetAfter = max(d.ResetAfter, d.RetryAfter)
					if d.RetryAfter > out.Decision.RetryAfter {
						out.Report, out.Decision = idx[j], d
					}
				}
			}
			e.observe(c.Rule.Name, sluice.OutcomeDenied, d)
		}
		return out, nil
	}
}

// blockTimeout bounds the Take that starts a block.
const blockTimeout = time.Second

// block starts c's block after a violation and returns how long it holds.
// ok is false when no block is known to be in place (the store failed, or a
// failure policy made the answer up): the request is still denied, just
// without the block. The Take does not end with the request's context, so
// that a client cannot escape its block by hanging up.
func (e *Engine) block(ctx context.Context, c *Check) (time.Duration, bool) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), blockTimeout)
	defer cancel()
	d, err := e.store.Take(ctx, c.PenaltyKey, c.Rule.PenaltyLimit(), 1)
	if err != nil || madeUp(d) {
		return 0, false
	}
	if !d.Allowed { // another request started the block already
		return d.RetryAfter, true
	}
	return c.Rule.Penalty, true
}

// madeUp reports whether d came from a failure policy rather than from a
// limit's state: such a denial is no violation.
func madeUp(d sluice.Decision) bool {
	return d.Source == sluice.SourceFailClosed || d.Source == sluice.SourceFailOpen
}

// shadow takes a shadow rule's units and records what would have happened.
// Its failures are recorded and otherwise ignored: a dry run never blocks.
func (e *Engine) shadow(ctx context.Context, c *Check) {
	d, err := e.store.Take(ctx, c.Key, c.Rule.Limit, c.Cost)
	switch {
	case err != nil:
		e.observe(c.Rule.Name, sluice.OutcomeError, sluice.Decision{})
	case d.Allowed:
		e.observe(c.Rule.Name, sluice.OutcomeAllowed, d)
	default:
		e.observe(c.Rule.Name, sluice.OutcomeShadowDenied, d)
	}
}

// closest returns the index of the decision closest to exhaustion: the
// smallest share of capacity remaining, then the fewest units, then the
// longest until reset.
func closest(ds []sluice.Decision) int {
	best := 0
	for j := 1; j < len(ds); j++ {
		a, b := ds[j], ds[best]
		// a.Remaining/a.Cap < b.Remaining/b.Cap; both sides stay below 2^63.
		l, r := a.Remaining*b.Limit.Capacity(), b.Remaining*a.Limit.Capacity()
		if l < r || l == r && (a.Remaining < b.Remaining || a.Remaining == b.Remaining && a.ResetAfter > b.ResetAfter) {
			best = j
		}
	}
	return best
}

func (e *Engine) observe(policy string, o sluice.Outcome, d sluice.Decision) {
	if e.observer != nil {
		e.observer.ObserveDecision(sluice.DecisionEvent{Policy: policy, Outcome: o, Decision: d})
	}
}

func (e *Engine) observeErrors(checks []Check) {
	for i := range checks {
		if checks[i].Rule.Strategy != Shadow {
			e.observe(checks[i].Rule.Name, sluice.OutcomeError, sluice.Decision{})
		}
	}
}

// Setup validates what the HTTP and gRPC constructors share — a store, at
// least one rule, a key prefix of at most 128 bytes, rules that are valid,
// keyed (keyed(i) reports whether rule i has a key function) and uniquely
// named, and a MultiStore when more than one rule enforces — and returns the
// engine and keyer. Errors are plain: callers wrap them with their own
// ErrInvalidConfig.
func Setup(store sluice.Store, rules []Rule, keyed func(i int) bool, prefix string, hashKey []byte, observer sluice.Observer) (*Engine, *Keyer, error) {
	if store == nil {
		return nil, nil, errors.New("nil store")
	}
	if len(rules) == 0 {
		return nil, nil, errors.New("no rules")
	}
	if len(prefix) > 128 {
		return nil, nil, fmt.Errorf("prefix of %d bytes (at most 128)", len(prefix))
	}
	seen := make(map[string]bool, len(rules))
	enforcing := 0
	for i := range rules {
		r := &rules[i]
		if err := r.Validate(); err != nil {
			return nil, nil, fmt.Errorf("rule %d: %w", i, err)
		}
		if r.Strategy == Delay {
			r.waiting = new(atomic.Int64)
		}
		if !keyed(i) {
			return nil, nil, fmt.Errorf("rule %q has no Key", r.Name)
		}
		if seen[r.Name] {
			return nil, nil, fmt.Errorf("two rules named %q", r.Name)
		}
		seen[r.Name] = true
		if r.Strategy != Shadow {
			enforcing++
		}
	}
	eng := New(store, observer)
	if enforcing > 1 && !eng.Multi() {
		return nil, nil, fmt.Errorf("%d enforcing rules on %T: %w", enforcing, store, ErrNeedMultiStore)
	}
	return eng, NewKeyer(prefix, hashKey), nil
}
