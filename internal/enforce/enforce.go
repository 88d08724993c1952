// Package enforce is the one policy engine under every front end (the HTTP
// and gRPC middleware, the service's Envoy RLS and JSON API): given the
// rules that apply to one request, it checks them against a Store
// all-or-nothing, applies each rule's strategy (reject, delay, shadow,
// penalty), reports to an Observer, gives each check its decision and picks
// the one the middleware's response describes. Keys (keys.go) have one
// grammar for all of them.
//
// Front ends do the request-specific part: which rules match, the key and
// the cost of each, and how the decisions are written back. In-flight and
// shedding rules (inflight.go) and request priorities (priority.go) are
// shared the same way.
package enforce

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enum"
	"github.com/sluicehq/sluice/internal/line"
)

// Strategy is what a rule does with a request over its limit.
type Strategy uint8

const (
	// Reject answers at once with "too many requests". The zero value.
	Reject Strategy = iota
	// Delay waits for quota up to the rule's MaxDelay, or the context's
	// deadline if that comes first, then serves; a request expected to
	// need longer than either, less a store round trip and line.Wake (of
	// MaxDelay, at most half), is rejected at once, its RetryAfter the
	// wait it would have needed. The waiters of one process on one
	// set of counters form a line (internal/line): only its head asks the
	// store, a newcomer that finds a line joins it without taking, and its
	// wait counts the units ahead of it (and, on a bucket with no burst to
	// spare, the heads' lateness: see lineDrift). Takes
	// from other processes are not in the line: with them a waiter may
	// still be rejected at MaxDelay.
	Delay
	// Shadow decides and records but never blocks: a dry run. Shadow rules
	// take their own units, apart from the enforcing rules and only when the
	// request is admitted, so they count what enforcing would let through.
	Shadow
	// Penalty rejects, and on a violation blocks the key for the rule's
	// Penalty duration. The block is a key in the store, so it holds across
	// a fleet. A denial made up by a failure policy (Decision.Source
	// SourceFailClosed) is no violation and starts no block. The block
	// check is a store call of its own before the take, each bounded by a
	// failure policy's Timeout: that Timeout is the store's, unknown here,
	// so the two cannot share one deadline.
	Penalty
)

var strategyNames = []string{"reject", "delay", "shadow", "penalty"}

// String returns the strategy's config name.
func (s Strategy) String() string { return enum.String(strategyNames, s, "Strategy") }

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

// MaxNameLen bounds rule names. Envoy-format policies are named by their
// descriptor path, which can be long; store keys hash what does not fit.
const MaxNameLen = 1024

// NameRule says what ValidateName accepts, for error messages.
const NameRule = "want 1 to 1024 bytes of UTF-8 text without control characters"

// DefaultMaxWaiting is a Delay rule's MaxWaiting when none is set.
const DefaultMaxWaiting = 1024

// Validate checks r's name (ValidateName), limit and strategy settings.
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
	// A setting the strategy ignores is a mistake (a Penalty without
	// Strategy: Penalty blocks nobody). Shadow stands in for any strategy.
	if r.MaxDelay != 0 && r.Strategy != Delay && r.Strategy != Shadow {
		return fmt.Errorf("%w: %q: MaxDelay applies only to strategy Delay, not %v", ErrInvalidRule, r.Name, r.Strategy)
	}
	if r.MaxWaiting != 0 && r.Strategy != Delay && r.Strategy != Shadow {
		return fmt.Errorf("%w: %q: MaxWaiting applies only to strategy Delay, not %v", ErrInvalidRule, r.Name, r.Strategy)
	}
	if r.Penalty != 0 && r.Strategy != Penalty && r.Strategy != Shadow {
		return fmt.Errorf("%w: %q: Penalty applies only to strategy Penalty, not %v", ErrInvalidRule, r.Name, r.Strategy)
	}
	return nil
}

// ValidateName checks a rule name: 1 to MaxNameLen bytes of UTF-8 text
// without control characters. Names reach store keys only escaped (see
// Keyer), and header fields only quoted, so no other character needs
// refusing: every name the Envoy format generates from a descriptor path
// is one.
func ValidateName(name string) error {
	if name == "" || len(name) > MaxNameLen || !utf8.ValidString(name) {
		return fmt.Errorf("%w: name %q: %s", ErrInvalidRule, name, NameRule)
	}
	for _, c := range name {
		if unicode.IsControl(c) {
			return fmt.Errorf("%w: name %q: %s", ErrInvalidRule, name, NameRule)
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
	// Key is the store key for the rule's limit. Checks with the same Key
	// in one request are one counter: their costs add up, and each gets
	// the counter's decision.
	Key string
	// PenaltyKey is the store key of the rule's block (Penalty rules only).
	// It must never equal any rule's Key.
	PenaltyKey string
	// Cost is the units the request takes. 0 only looks: the check is
	// peeked at one unit, is never over its limit and is not observed.
	Cost int64
	// Over marks a check the front end has decided over its limit already
	// (an Envoy limit of 0): unless its rule is Shadow it denies the
	// request, with no store call and nothing taken. Key may be empty.
	Over bool
	// Tag is the front end's own reference to the rule (an index); the
	// engine does not read it.
	Tag int

	// Decision is the engine's answer for this check, written by Enforce
	// for the checks it took or found over their limit, and by EnforceAll
	// for every check with a Key (peeking those the request did not
	// take). An Over check's is a denial with no other field set.
	Decision sluice.Decision
	// Err is the store's error for a Shadow check whose take (or peek,
	// when it could never be admitted, or for EnforceAll when the request
	// was denied) failed, which was observed as sluice.OutcomeError: the
	// request goes on, since a dry run never blocks, and the front end can
	// tell its operator why.
	Err error

	decided bool
	counter int // the index of the check's counter among the store requests
}

// Verdict is the engine's answer for one request.
type Verdict struct {
	// Allowed reports whether the request may be served.
	Allowed bool
	// Report indexes the check whose Decision the response should describe
	// under the middleware's rule: when denied, the violated rule needing
	// the longest wait; when allowed, the enforcing rule closest to
	// exhaustion. -1 when no enforcing rule applied. Front ends with another
	// rule (Envoy's first over the limit) read the checks' Decisions.
	Report int
	// Decision is the reported check's decision. For a Penalty rule that
	// blocks, RetryAfter is the time left in the block.
	Decision sluice.Decision
	// Waited is how long Delay rules held the request.
	Waited time.Duration
	// Blind reports that the store failed to give the reported check's
	// figures (Remaining, ResetAfter): a request that can never be
	// admitted (Never) is denied without them, and the response must not
	// state them.
	Blind bool
	// Abandoned reports a denial of a request whose context ended while a
	// Delay rule held it: no client hears it, so it was not observed (as a
	// store failure of an ended context is not), and the front end
	// answers the context's error, not a denial.
	Abandoned bool
}

// Engine checks rules against a store. It is safe for concurrent use.
type Engine struct {
	store    sluice.Store
	multi    sluice.MultiStore // nil if store is not one
	observer sluice.Observer
	// turnLate is how long after its denial's RetryAfter a line's head
	// was admitted, averaged: a timer's lateness and the take's round
	// trip. See lineDrift.
	turnLate atomic.Int64
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

// Enforce decides one request, all-or-nothing: the enforcing checks'
// counters are taken together or not at all (through the store's TakeAll
// when there are several), and Shadow checks take their units only when
// the request is admitted, so a dry run counts what enforcing would have
// let through. Errors are store failures, a *ConfigError when the store
// refused what a rule asks of it, or ErrNeedMultiStore; the checks'
// Decision fields are written, nothing else.
func (e *Engine) Enforce(ctx context.Context, checks []Check) (Verdict, error) {
	return e.enforce(ctx, checks, false)
}

// EnforceAll is Enforce that gives every check a Decision, peeking the
// checks the request did not take, for front ends that answer one status
// per check (Envoy's rate limit service).
func (e *Engine) EnforceAll(ctx context.Context, checks []Check) (Verdict, error) {
	return e.enforce(ctx, checks, true)
}

// Peek reports what checking c would decide, taking nothing.
func (e *Engine) Peek(ctx context.Context, c *Check) (sluice.Decision, error) {
	if b, blocked, err := e.blockOf(ctx, c); err != nil || blocked {
		return b, err
	}
	return e.store.Peek(ctx, c.Key, c.Rule.Limit, max(c.Cost, 1))
}

// blockOf reports whether c's key is blocked by its Penalty rule, and the
// decision the block gives: denied until it ends.
func (e *Engine) blockOf(ctx context.Context, c *Check) (sluice.Decision, bool, error) {
	if c.Rule.Strategy != Penalty || c.PenaltyKey == "" {
		return sluice.Decision{}, false, nil
	}
	d, err := e.store.Peek(ctx, c.PenaltyKey, c.Rule.PenaltyLimit(), 1)
	if err != nil || d.Allowed {
		return sluice.Decision{}, false, err
	}
	// The wait is the block's, or the limit's own when that is longer: a
	// client told only the block's rest would come back to a full limit,
	// be refused and blocked again.
	l, err := e.store.Peek(ctx, c.Key, c.Rule.Limit, min(max(c.Cost, 1), c.Rule.Limit.Capacity()))
	if err != nil {
		return sluice.Decision{}, false, err
	}
	wait := d.RetryAfter
	if !l.Allowed {
		wait = max(wait, l.RetryAfter)
	}
	return sluice.Decision{Limit: c.Rule.Limit, RetryAfter: wait, ResetAfter: max(wait, l.ResetAfter), Source: d.Source}, true, nil
}

// Reset returns c's key, and its block if it has one, to the fresh state.
func (e *Engine) Reset(ctx context.Context, c *Check) error {
	if c.PenaltyKey != "" {
		if err := e.store.Reset(ctx, c.PenaltyKey, c.Rule.PenaltyLimit()); err != nil {
			return err
		}
	}
	return e.store.Reset(ctx, c.Key, c.Rule.Limit)
}

func (e *Engine) enforce(ctx context.Context, checks []Check, all bool) (Verdict, error) {
	var (
		oneReq [1]sluice.Request
		oneIdx [1]int
		reqs   = oneReq[:0] // one per counter of the enforcing checks
		idx    = oneIdx[:0] // idx[j] is the first check of reqs[j]
		// many is reqs's array when more than one check enforces: only
		// it is passed to TakeAll, which an interface call makes escape,
		// so that oneReq stays on the stack (one allocation a request).
		many []sluice.Request
	)
	enforcing, over := 0, -1
	delaying := false // a Delay rule enforces: time the take, for its deadline
	for i := range checks {
		c := &checks[i]
		c.Decision, c.Err, c.decided, c.counter = sluice.Decision{}, nil, false, -1
		switch {
		case c.Rule.Strategy == Shadow, c.Cost == 0 && !c.Over:
		case c.Over:
			c.Decision, c.decided = sluice.Decision{}, true
			if over < 0 {
				over = i
			}
		default:
			enforcing++
			delaying = delaying || c.Rule.Strategy == Delay
		}
	}
	if enforcing > 1 {
		many = make([]sluice.Request, 0, enforcing)
		reqs = many
		idx = make([]int, 0, enforcing)
	}
	for i := range checks {
		c := &checks[i]
		if c.Rule.Strategy == Shadow || c.Cost == 0 || c.Over {
			continue
		}
		c.counter = len(reqs)
		for j := range reqs {
			if reqs[j].Key == c.Key {
				c.counter = j
				break
			}
		}
		if c.counter == len(reqs) {
			reqs = append(reqs, sluice.Request{Key: c.Key, Limit: c.Rule.Limit})
			idx = append(idx, i)
		}
		// Saturating: checks naming one counter with huge costs (Envoy's
		// hits_addend is a uint64) must add up to "over", not wrap.
		if reqs[c.counter].Cost > math.MaxInt64-c.Cost {
			reqs[c.counter].Cost = math.MaxInt64
		} else {
			reqs[c.counter].Cost += c.Cost
		}
		if reqs[c.counter].Cost > c.Rule.Limit.Capacity() && over < 0 {
			over = idx[c.counter] // could never be admitted: take nothing
		}
	}
	if over >= 0 {
		return e.refuse(ctx, checks, reqs, idx, over, all)
	}
	if len(reqs) > 1 && e.multi == nil {
		return Verdict{Report: -1}, ErrNeedMultiStore
	}
	if enforcing == 0 {
		return e.admit(ctx, checks, nil, Verdict{Allowed: true, Report: -1}, all)
	}
	failed := Verdict{Report: -1} // returned with every error: never Allowed
	blocked := Verdict{Report: -1}
	for i := range checks {
		c := &checks[i]
		if c.Rule.Strategy != Penalty || c.counter < 0 {
			continue
		}
		b, isBlocked, err := e.blockOf(ctx, c)
		if err != nil {
			return failed, e.failed(ctx, checks, err, c.Rule.Name)
		}
		if isBlocked {
			c.Decision, c.decided = b, true
			e.observe(c.Rule.Name, sluice.OutcomeDenied, b)
			// Report the block needing the longest wait.
			if blocked.Report < 0 || b.RetryAfter > blocked.Decision.RetryAfter {
				blocked = Verdict{Report: i, Decision: b}
			}
		}
	}
	if blocked.Report >= 0 {
		return e.deny(ctx, checks, blocked, all)
	}
	var (
		waited time.Duration
		timer  *time.Timer
		held   bool
		w      *line.Waiter // this request's place in its line, once denied
		start  time.Time
		due    time.Time // when the head's last pause ended, as the store said
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
		if w != nil {
			w.Leave()
		}
		if held {
			release(checks, idx)
		}
	}()
	// sleep waits d, or less if turn closes (it reports that) or ctx ends.
	sleep := func(d time.Duration, turn <-chan struct{}) bool {
		if timer == nil {
			timer = time.NewTimer(d)
		} else {
			timer.Reset(d)
		}
		select {
		case <-timer.C:
			return false
		case <-turn:
			timer.Stop()
			return true
		case <-ctx.Done():
			timer.Stop()
			return false
		}
	}
	if line.Busy() {
		start = time.Now()
		q, err := e.queue(ctx, checks, reqs, idx)
		if err != nil {
			return failed, err
		}
		switch {
		case q.w != nil:
			w, held = q.w, true
			// Ask the store once those ahead are served, unless that
			// comes after MaxDelay.
			sleep(q.maxWait-time.Since(start), w.Turn())
			if !w.Head() || ctx.Err() != nil {
				waited = time.Since(start) // held to MaxDelay
				q.ds[q.deny].RetryAfter = max(q.ds[q.deny].RetryAfter-waited, time.Millisecond)
				return e.denied(ctx, checks, idx, q.ds, q.deny, waited, all, nil, held)
			}
		case q.deny >= 0:
			// Refused at once with the wait it would have needed.
			return e.denied(ctx, checks, idx, q.ds, q.deny, 0, all, q.excused, false)
		}
	}
	for {
		ds := oneDecision(len(reqs))
		var (
			err   error
			asked time.Time
		)
		if delaying {
			asked = time.Now()
		}
		if len(reqs) == 1 {
			ds[0], err = e.store.Take(ctx, reqs[0].Key, reqs[0].Limit, reqs[0].Cost)
		} else {
			// Two counters or more come from as many enforcing checks, so
			// reqs is many's array, never reallocated (enforcing is its
			// capacity).
			ds, err = e.multi.TakeAll(ctx, many[:len(reqs)])
			if err == nil && len(ds) != len(reqs) {
				err = fmt.Errorf("enforce: store returned %d decisions for %d limits", len(ds), len(reqs))
			}
		}
		if err != nil {
			return failed, e.failed(ctx, checks, err, names(checks, idx)...)
		}
		deny, wait := -1, true
		var excused []bool
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
		var rtt time.Duration
		if delaying {
			rtt = time.Since(asked)
		}
		if w != nil {
			waited = time.Since(start)
		}
		if deny < 0 {
			if w != nil {
				w.Leave() // the next in line may ask now
				if !due.IsZero() {
					e.late(time.Since(due))
				}
			}
			for j, d := range ds {
				e.observe(checks[idx[j]].Rule.Name, sluice.OutcomeAllowed, d)
			}
			j := closest(ds)
			return e.admit(ctx, checks, ds, Verdict{Allowed: true, Report: idx[j], Decision: ds[j], Waited: waited}, all)
		}
		// A denial with no wait would make this loop spin on the store.
		pause := max(longest, time.Millisecond)
		if wait && ctx.Err() == nil {
			switch {
			case w != nil:
				// The head of the line, asking again. Its wait is the
				// store's answer, not an estimate: it goes on while that
				// ends by MaxDelay (and in time for the deadline).
				if pause <= min(maxWait-waited, deadlineLimit(ctx, rtt)) {
					due = time.Now().Add(pause)
					sleep(pause, nil)
					if ctx.Err() == nil {
						continue
					}
				}
			case held || hold(checks, idx):
				held = true
				start = time.Now()
				limit := waitLimit(ctx, maxWait, 0, rtt)
				var waits []time.Duration
				w, waits = e.join(reqs, ds, limit)
				if w == nil {
					// Refused at once with the wait it would have needed,
					// blaming the counters whose wait cannot be had.
					deny, excused = blame(checks, idx, ds, waits, limit)
					break
				}
				if w.Head() {
					due = time.Now().Add(pause)
					sleep(pause, nil) // the denial in hand says how long
				} else {
					// Ask the store once those ahead are served, unless
					// that comes after MaxDelay.
					sleep(maxWait-time.Since(start), w.Turn())
				}
				if ctx.Err() == nil {
					if w.Head() {
						continue
					}
					waited = time.Since(start) // held to MaxDelay
				}
			}
		}
		if !wait && excused == nil {
			// A rule that does not wait refused it: a Delay rule whose
			// wait would have fit did not.
			deny, excused = excuse(ctx, checks, idx, ds, waited, rtt)
		}
		return e.denied(ctx, checks, idx, ds, deny, waited, all, excused, held)
	}
}

// excuse picks, for a request that a rule which does not wait refused,
// the counters that refuse it: all but the Delay rules whose wait would
// have fit their MaxDelay (less what the request waited already, and
// within the context's deadline). See refusers.
func excuse(ctx context.Context, checks []Check, idx []int, ds []sluice.Decision, waited, rtt time.Duration) (deny int, excused []bool) {
	return refusers(checks, idx, ds, func(j int) bool {
		return ds[j].RetryAfter <= waitLimit(ctx, checks[idx[j]].Rule.MaxDelay, waited, rtt)
	})
}

// blame picks, for a request refused at once because its counters' waits
// (waits[j] for ds[j], behind the line) cannot be had within limit, the
// counters that refuse it: a rule that does not wait needing any wait, or
// one needing more than limit. Each is marked denied with its wait (a
// counter the store allowed may need the line's units). See refusers.
func blame(checks []Check, idx []int, ds []sluice.Decision, waits []time.Duration, limit time.Duration) (deny int, excused []bool) {
	for j, wait := range waits {
		if wait <= 0 && ds[j].Allowed || checks[idx[j]].Rule.Strategy == Delay && wait <= limit {
			continue
		}
		d := &ds[j]
		d.Allowed = false
		if wait > 0 {
			d.Remaining = 0 // what remains is the line's
		}
		d.RetryAfter = max(d.RetryAfter, wait)
		d.ResetAfter = max(d.ResetAfter, d.RetryAfter)
	}
	return refusers(checks, idx, ds, func(j int) bool { return waits[j] <= limit })
}

// refusers returns, of the counters ds denies, the one needing the
// longest wait among those that refuse the request: all but the Delay
// rules whose wait fits (fits(j)), which did not deny it: excused[j] says
// so, for the observer. With none refusing (which the callers rule out),
// the longest denial, none excused.
func refusers(checks []Check, idx []int, ds []sluice.Decision, fits func(j int) bool) (deny int, excused []bool) {
	deny, longest := -1, -1
	excused = make([]bool, len(ds))
	for j, d := range ds {
		if d.Allowed {
			continue
		}
		if longest < 0 || d.RetryAfter > ds[longest].RetryAfter {
			longest = j
		}
		if checks[idx[j]].Rule.Strategy == Delay && fits(j) {
			excused[j] = true
			continue
		}
		if deny < 0 || d.RetryAfter > ds[deny].RetryAfter {
			deny = j
		}
	}
	if deny < 0 {
		return longest, nil
	}
	return deny, excused
}

// denied answers a request denied by ds[deny] (ds[j] for the counter
// reqs[j] of the check idx[j]) after waiting waited. A counter excused
// (nil: none) did not deny it and is not observed; nor is any when the
// request was held (by a Delay rule) and its context has ended: it is
// Abandoned. A Penalty rule's block starts all the same.
func (e *Engine) denied(ctx context.Context, checks []Check, idx []int, ds []sluice.Decision, deny int, waited time.Duration, all bool, excused []bool, held bool) (Verdict, error) {
	out := Verdict{Report: idx[deny], Decision: ds[deny], Waited: waited, Abandoned: held && ctx.Err() != nil}
	for j, d := range ds {
		if d.Allowed || excused != nil && excused[j] {
			continue
		}
		c := &checks[idx[j]]
		if c.Rule.Strategy == Penalty && !madeUp(d) {
			if block, ok := e.block(ctx, c); ok {
				d.RetryAfter = max(d.RetryAfter, block)
				d.ResetAfter = max(d.ResetAfter, d.RetryAfter)
				ds[j] = d
				if d.RetryAfter > out.Decision.RetryAfter {
					out.Report, out.Decision = idx[j], d
				}
			}
		}
		if !out.Abandoned {
			e.observe(c.Rule.Name, sluice.OutcomeDenied, d)
		}
	}
	setCounters(checks, ds)
	return e.deny(ctx, checks, out, all)
}

// queued is what queue did with a request.
type queued struct {
	w       *line.Waiter      // joined: wait for the turn, then ask the store
	deny    int               // refused at once (or at the turn's timeout) by ds[deny]; -1 if not
	ds      []sluice.Decision // the store's answers without taking
	maxWait time.Duration     // the Delay rules' shortest MaxDelay
	excused []bool            // refused at once: the counters that did not deny it
}

// queue puts a request whose counters already have a line in this process
// at its end, without taking: a newcomer that took first would take the
// unit the head waits for, so that the head is held to its MaxDelay and
// refused. It asks the store what its units need (Peek) and adds what the
// line ahead needs; past the MaxDelay of a Delay rule or the context's
// deadline (see waitLimit), or when a rule that
// does not wait would have to, or with no waiting slot left, the request
// is refused at once. With no line, or room for all of it and this
// request, q is empty (deny -1) and the request takes as usual. Its error
// is failed's.
func (e *Engine) queue(ctx context.Context, checks []Check, reqs []sluice.Request, idx []int) (q queued, err error) {
	q.deny = -1
	owner := line.Owner(e.store, e)
	if !line.Waiting(owner, reqs[0].Key) {
		return q, nil
	}
	snap := line.Look(owner, reqs[0].Key, lineName(reqs))
	if snap == nil {
		return q, nil
	}
	start := time.Now()
	q.ds = make([]sluice.Decision, len(reqs))
	// On a sliding window, asking for the line's units and this request's
	// at once makes the estimate exact (see line.Shape.Estimate).
	peeked := make([]int64, len(reqs))
	for j, r := range reqs {
		peeked[j] = Shape(r.Limit).PeekCost(snap.Ahead()[j], r.Cost)
		if q.ds[j], err = e.store.Peek(ctx, r.Key, r.Limit, peeked[j]); err != nil {
			return q, e.failed(ctx, checks, err, checks[idx[j]].Rule.Name)
		}
	}
	rtt := time.Since(start)
	var est, limit time.Duration
	waits := make([]time.Duration, len(reqs))
	fits := func(ahead []int64) bool {
		q.deny, est, q.maxWait = -1, 0, -1
		wait := true
		for j, r := range reqs {
			d := e.counterWait(r, q.ds[j], peeked[j], ahead[j])
			waits[j] = d
			if d == 0 {
				continue
			}
			if q.deny < 0 || d > est {
				q.deny, est = j, d
			}
			if rule := checks[idx[j]].Rule; rule.Strategy != Delay {
				wait = false
			} else if q.maxWait < 0 || rule.MaxDelay < q.maxWait {
				q.maxWait = rule.MaxDelay
			}
		}
		limit = waitLimit(ctx, q.maxWait, time.Since(start), rtt)
		return q.deny >= 0 && wait && est <= limit
	}
	var there bool
	q.w, there = snap.Join(costs(reqs), func(ahead []int64) bool {
		// The waiting slots are taken with the place, or neither.
		return fits(ahead) && hold(checks, idx)
	})
	if !there || q.w == nil && q.deny < 0 {
		return queued{deny: -1}, nil
	}
	if q.w == nil {
		q.deny, q.excused = blame(checks, idx, q.ds, waits, limit)
		return q, nil
	}
	d := &q.ds[q.deny]
	d.Allowed, d.Remaining = false, 0 // what remains is the line's
	d.RetryAfter = max(d.RetryAfter, est)
	d.ResetAfter = max(d.ResetAfter, d.RetryAfter)
	return q, nil
}

// waitLimit is how much longer a Delay request that has waited waited
// may expect to wait when it joins its line: what is left of its
// maxDelay, less a store round trip (rtt, as the last call took) and
// line.Wake, or less when ctx's deadline comes first (deadlineLimit). A
// wait past it is refused at once: a turn expected just before MaxDelay
// comes after it often enough (timers late, the line's takes each a
// little later than the last) that the request would be held to it and
// refused anyway. Of MaxDelay that margin takes at most half, so that a
// short one still holds the shortest waits.
func waitLimit(ctx context.Context, maxDelay, waited, rtt time.Duration) time.Duration {
	return min(maxDelay-waited-min(rtt+line.Wake, maxDelay/2), deadlineLimit(ctx, rtt))
}

// deadlineLimit is how much longer a request may wait for ctx's deadline:
// until it, less a store round trip and line.Wake to ask for the units in
// time.
func deadlineLimit(ctx context.Context, rtt time.Duration) time.Duration {
	if d, ok := ctx.Deadline(); ok {
		return time.Until(d) - rtt - line.Wake
	}
	return math.MaxInt64
}

// join puts a denied request in its line, or refuses it (nil) with the
// wait each counter would need. It copies reqs and ds, which the fast path
// keeps on the stack.
func (e *Engine) join(reqs []sluice.Request, ds []sluice.Decision, maxWait time.Duration) (*line.Waiter, []time.Duration) {
	rs := append([]sluice.Request(nil), reqs...)
	dd := append([]sluice.Decision(nil), ds...)
	waits := make([]time.Duration, len(rs))
	w, _ := line.Join(line.Owner(e.store, e), rs[0].Key, lineName(rs), costs(rs), func(ahead []int64) time.Duration {
		return e.estimate(rs, dd, ahead, waits)
	}, maxWait)
	return w, waits
}

// lineName names the line of a request's counters: their keys and limits.
func lineName(reqs []sluice.Request) string {
	if len(reqs) == 1 {
		return reqs[0].Key + "\x00" + reqs[0].Limit.String()
	}
	var b strings.Builder
	for _, r := range reqs {
		b.WriteString(r.Key)
		b.WriteByte(0)
		b.WriteString(r.Limit.String())
		b.WriteByte(0)
	}
	return b.String()
}

// costs returns each counter's units.
func costs(reqs []sluice.Request) []int64 {
	c := make([]int64, len(reqs))
	for j, r := range reqs {
		c[j] = r.Cost
	}
	return c
}

// estimate is how long a request denied with ds waits behind ahead units
// per counter: the longest of its counters' waits, each put in waits[j].
func (e *Engine) estimate(reqs []sluice.Request, ds []sluice.Decision, ahead []int64, waits []time.Duration) time.Duration {
	var most time.Duration
	for j, r := range reqs {
		waits[j] = e.counterWait(r, ds[j], r.Cost, ahead[j])
		most = max(most, waits[j])
	}
	return most
}

// counterWait is how long r's counter, which answered d about peeked
// units, makes a request wait behind ahead units.
func (e *Engine) counterWait(r sluice.Request, d sluice.Decision, peeked, ahead int64) time.Duration {
	wait := Shape(r.Limit).Wait(d.Allowed, d.Remaining, d.RetryAfter, peeked, ahead, r.Cost)
	if drift := lineDrift(r, ahead, time.Duration(e.turnLate.Load())); wait < math.MaxInt64-drift {
		return wait + drift
	}
	return math.MaxInt64
}

// lineDrift is how much later than the limit's shape says a request's
// units come behind ahead units, on a bucket whose burst cannot absorb
// the heads' lateness (late, each): a head admitted late there takes its
// unit late, and the next comes an Interval after that, so the lateness
// adds up along the line (Burst 1: 100/s, a line of 47 and heads 0.6ms
// late put the last 30ms behind the estimate). Waiters ahead are counted
// as asking r's cost each.
func lineDrift(r sluice.Request, ahead int64, late time.Duration) time.Duration {
	s := Shape(r.Limit)
	if s.Kind != line.Bucket || ahead <= 0 || late <= 0 {
		return 0
	}
	if s.Capacity-1 > int64(late/max(s.Interval, 1)) {
		return 0 // the burst's slack takes it
	}
	per := late - time.Duration(s.Capacity-1)*s.Interval
	if per <= 0 {
		return 0
	}
	turns := (ahead + r.Cost - 1) / max(r.Cost, 1)
	if turns > int64(math.MaxInt64/per) {
		return math.MaxInt64
	}
	return time.Duration(turns) * per
}

// late records how long after its pause a line's head was admitted, for
// lineDrift: a moving average, each sample at most line.Wake (a stall
// once, a GC pause, is no lateness to expect of every head).
func (e *Engine) late(d time.Duration) {
	d = min(max(d, 0), line.Wake)
	old := time.Duration(e.turnLate.Load())
	if old == 0 {
		e.turnLate.Store(int64(d))
		return
	}
	e.turnLate.Store(int64(old + (d-old)/8))
}

// Shape is what the line's estimate needs of l.
func Shape(l sluice.Limit) line.Shape {
	return line.ShapeOf(l.Algorithm.String(), l.Interval(), l.Period, l.Capacity())
}

// oneDecision returns a slice of n decisions, on the stack for one.
func oneDecision(n int) []sluice.Decision {
	if n == 1 {
		var one [1]sluice.Decision
		return one[:]
	}
	return nil
}

// decide marks the checks of counter j decided.
func decide(checks []Check, j int) {
	for i := range checks {
		if checks[i].counter == j {
			checks[i].decided = true
		}
	}
}

// setCounters gives each enforcing check its counter's decision.
func setCounters(checks []Check, ds []sluice.Decision) {
	for i := range checks {
		if c := &checks[i]; c.counter >= 0 {
			c.Decision, c.decided = ds[c.counter], true
		}
	}
}

// admit finishes an admitted request: the enforcing checks get their
// counters' decisions and the shadow checks take their units.
func (e *Engine) admit(ctx context.Context, checks []Check, ds []sluice.Decision, v Verdict, all bool) (Verdict, error) {
	setCounters(checks, ds)
	for i := range checks {
		if c := &checks[i]; c.Rule.Strategy == Shadow && c.Cost > 0 && !c.Over {
			e.shadow(ctx, c)
		}
	}
	return v, e.fill(ctx, checks, all)
}

// deny finishes a denied request: nothing more is taken. Shadow checks that
// could never be admitted are observed as shadow denials.
func (e *Engine) deny(ctx context.Context, checks []Check, v Verdict, all bool) (Verdict, error) {
	for i := range checks {
		if c := &checks[i]; c.Rule.Strategy == Shadow && !c.Over && c.Cost > c.Rule.Limit.Capacity() {
			e.shadowOver(ctx, c)
		}
	}
	return v, e.fill(ctx, checks, all)
}

// refuse denies a request without taking anything: a check is over its
// limit before any store call (decided so by the front end, or asking more
// than its counter's capacity). Counters over their capacity are peeked at
// their capacity for the figures the response reports; without all, a
// peek that fails leaves the denial without figures (Verdict.Blind), since
// no answer of the store would change it.
func (e *Engine) refuse(ctx context.Context, checks []Check, reqs []sluice.Request, idx []int, over int, all bool) (Verdict, error) {
	ds := make([]sluice.Decision, len(reqs))
	blind := false
	for j, r := range reqs {
		full := r.Cost > r.Limit.Capacity()
		if !full && !all {
			continue
		}
		d, err := e.store.Peek(ctx, r.Key, r.Limit, min(r.Cost, r.Limit.Capacity()))
		if err != nil && !all {
			d = sluice.Decision{Limit: r.Limit}
			blind = blind || j == checks[over].counter
		} else if err != nil {
			return Verdict{Report: -1}, e.failed(ctx, checks, err, checks[idx[j]].Rule.Name)
		}
		if full {
			d.Allowed = false
			e.observe(checks[idx[j]].Rule.Name, sluice.OutcomeDenied, d)
			decide(checks, j) // observed: a later peek's failure must not observe it again
		}
		ds[j] = d
	}
	for i := range checks {
		if c := &checks[i]; c.counter >= 0 && (all || !ds[c.counter].Allowed) {
			c.Decision, c.decided = ds[c.counter], true
		}
	}
	return e.deny(ctx, checks, Verdict{Report: over, Decision: checks[over].Decision, Blind: blind}, all)
}

// fill peeks, when all, every check with a Key that has no decision yet.
// A look-only check is never over its limit.
func (e *Engine) fill(ctx context.Context, checks []Check, all bool) error {
	if !all {
		return nil
	}
	for i := range checks {
		c := &checks[i]
		if c.decided || c.Key == "" {
			continue
		}
		d, err := e.store.Peek(ctx, c.Key, c.Rule.Limit, min(max(c.Cost, 1), c.Rule.Limit.Capacity()))
		if err != nil {
			if c.Rule.Strategy == Shadow { // a dry run never fails a request
				// A shadow check of a denied request fails as one of an
				// admitted request does (shadow): observed as an error,
				// for the front end to tell. A look, or an Over check, is
				// not observed; nor is a failure shadowOver observed.
				if c.Cost > 0 && !c.Over && c.Err == nil && ctx.Err() == nil {
					e.observe(c.Rule.Name, sluice.OutcomeError, sluice.Decision{})
					c.Err = err
				}
				c.Decision, c.decided = sluice.Decision{Allowed: true, Limit: c.Rule.Limit}, true
				continue
			}
			return err
		}
		if c.Cost == 0 {
			// A look is never denied, but a blocked key has nothing to
			// take until its block ends.
			b, blocked, err := e.blockOf(ctx, c)
			if err != nil && c.Rule.Strategy != Shadow {
				return err
			}
			if blocked {
				d.Remaining, d.ResetAfter = 0, max(d.ResetAfter, b.ResetAfter)
			}
			d.Allowed, d.RetryAfter = true, 0
		}
		c.Decision, c.decided = d, true
	}
	return nil
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
	if c.Cost > c.Rule.Limit.Capacity() {
		e.shadowOver(ctx, c)
		return
	}
	d, err := e.store.Take(ctx, c.Key, c.Rule.Limit, c.Cost)
	switch {
	case err != nil:
		c.Decision, c.decided = sluice.Decision{Allowed: true, Limit: c.Rule.Limit}, true
		if ctx.Err() == nil { // a client gone is no failure of the store's
			e.observe(c.Rule.Name, sluice.OutcomeError, sluice.Decision{})
			c.Err = err
		}
		return
	case d.Allowed:
		e.observe(c.Rule.Name, sluice.OutcomeAllowed, d)
	default:
		e.observe(c.Rule.Name, sluice.OutcomeShadowDenied, d)
	}
	c.Decision, c.decided = d, true
}

// shadowOver records a shadow check that could never be admitted (its cost
// exceeds its capacity), peeking its counter for the figures.
func (e *Engine) shadowOver(ctx context.Context, c *Check) {
	d, err := e.store.Peek(ctx, c.Key, c.Rule.Limit, c.Rule.Limit.Capacity())
	if err != nil {
		if ctx.Err() == nil { // a client gone is no failure of the store's
			e.observe(c.Rule.Name, sluice.OutcomeError, sluice.Decision{})
			c.Err = err
		}
		return
	}
	d.Allowed = false
	c.Decision, c.decided = d, true
	e.observe(c.Rule.Name, sluice.OutcomeShadowDenied, d)
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

// failed returns the error of a request whose store call for the rules
// named policies failed with err, observed as each enforcing check's error
// (but those already decided): a *ConfigError when the store refused what the rules
// ask of it (Misconfigured), which is no store failure, else err.
func (e *Engine) failed(ctx context.Context, checks []Check, err error, policies ...string) error {
	e.observeErrors(ctx, checks)
	if Misconfigured(err) {
		return &ConfigError{Policies: policies, Err: err}
	}
	return err
}

// names returns the rule names of the checks at idx.
func names(checks []Check, idx []int) []string {
	ns := make([]string, len(idx))
	for j, i := range idx {
		ns[j] = checks[i].Rule.Name
	}
	return ns
}

// observeErrors observes each enforcing check's error: a store failure or
// a store refusing what a rule asks. A call
// whose own context ended was not failed by the store: it is not observed
// (the client went away, or its deadline passed). A check decided before
// the failure (a Penalty rule's block, a counter over its capacity) was
// observed then, and is not again: one event per policy per request.
func (e *Engine) observeErrors(ctx context.Context, checks []Check) {
	if ctx.Err() != nil {
		return
	}
	for i := range checks {
		if c := &checks[i]; c.Rule.Strategy != Shadow && c.Cost > 0 && !c.Over && !c.decided {
			e.observe(checks[i].Rule.Name, sluice.OutcomeError, sluice.Decision{})
		}
	}
}

// Setup validates what the HTTP and gRPC constructors share — a store
// that was built (sluice.CheckBuilt), at least one rule, a key prefix of
// at most 128 bytes, rules that are valid, keyed (keyed(i) reports
// whether rule i has a key function) and uniquely
// named, and a MultiStore when more than one rule enforces — and returns the
// engine and keyer. A store that is a sluice.LimitChecker checks every limit
// a rule uses (see CheckLimits). Errors are plain: callers wrap them with
// their own ErrInvalidConfig.
func Setup(store sluice.Store, rules []Rule, keyed func(i int) bool, prefix string, hashKey []byte, observer sluice.Observer) (*Engine, *Keyer, error) {
	if store == nil {
		return nil, nil, errors.New("nil store")
	}
	if err := sluice.CheckBuilt(store); err != nil {
		return nil, nil, err // a zero or nil-pointer store would fail every request
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
	for i := range rules {
		if err := rules[i].CheckLimits(store); err != nil {
			return nil, nil, err
		}
	}
	return eng, NewKeyer(prefix, hashKey), nil
}

// CheckLimits asks store, when it is a sluice.LimitChecker, about every
// limit r's checks use: its Limit and, for a Penalty rule, its block key's
// PenaltyLimit, which is shorter than the Limit's period when Penalty is.
// A limit refused here would fail every request under the rule.
func (r *Rule) CheckLimits(store sluice.Store) error {
	c, ok := store.(sluice.LimitChecker)
	if !ok {
		return nil
	}
	if err := c.CheckLimit(r.Limit); err != nil {
		return fmt.Errorf("rule %q: %w", r.Name, err)
	}
	if r.Strategy == Penalty {
		if err := c.CheckLimit(r.PenaltyLimit()); err != nil {
			return fmt.Errorf("rule %q: penalty %v: %w", r.Name, r.Penalty, err)
		}
	}
	return nil
}
