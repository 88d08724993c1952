package enforce

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logpace"
)

// In-flight rules, written once for every front end as rules.go writes
// rate rules: which rules apply to a request, its key and weight under
// each, the acquire of every slot (all or none: a refusal releases those
// already taken), extends of the store-backed slots while the request
// runs (so that a stream or a slow request keeps its slots past their
// hold), and one release for all of them, detached from the request so
// that a client going away cannot make it fail.

// SlotKind is what an in-flight rule bounds, and so how its refusals read.
type SlotKind uint8

const (
	// PerKey bounds one key's requests in progress at once. A refusal is
	// the client's own doing: "too many requests" (429,
	// RESOURCE_EXHAUSTED). The zero value.
	PerKey SlotKind = iota
	// Shed bounds the requests in progress across the fleet sharing the
	// store (one key), a request of priority p acquiring under
	// Limit.For(p, Reserve). A refusal is load shedding: the client did
	// nothing wrong ("unavailable": 503, UNAVAILABLE).
	Shed
	// Worker is Shed over this process's own in-flight count: a lock-free
	// counter against Limit.Max, no store call. Limit.Hold is unused.
	Worker
)

// WorkerRetryAfter is the Retry-After of a Worker rule's refusal: a
// process's own slots have no hold deadlines to estimate from, and one of
// them may free at any instant.
const WorkerRetryAfter = time.Second

// releaseTimeout bounds the release of a request's slots, and each round
// of extends. It runs on a context detached from the request's: a slot
// whose release fails is released again in the background
// (sluice.RetryRelease), or freed by the store at its hold timeout.
const releaseTimeout = time.Second

// minKeep is the shortest wait between two rounds of extends, however
// short a hold: a hold that short is lost between two rounds.
const minKeep = time.Millisecond

// SlotSpec is a front end's in-flight rule over requests of type R.
type SlotSpec[R any] struct {
	// Name identifies the rule in responses and metrics (see
	// ValidateName), unique among a front end's rules of every kind.
	Name string
	// Kind says what the rule bounds. Default: PerKey.
	Kind SlotKind
	// Limit is a PerKey rule's bound per key, a Shed rule's fleet
	// capacity, a Worker rule's process capacity (Max; Hold unused).
	Limit sluice.InFlightLimit
	// Workers, set on a Shed rule with no Limit, makes it a Worker rule
	// of capacity Workers: how front ends offer both kinds as one.
	Workers int64
	// Reserve holds shares of a Shed or Worker rule's capacity back for
	// the more important priorities. Must be zero for PerKey rules.
	Reserve sluice.Reserve
	// Key finds the request's key: required for PerKey rules, nil for the
	// others (they have one key, or none).
	Key KeyFunc[R]
	// Weight weighs the request in slots, 1 to Limit.Max; nil means 1.
	Weight func(R) int64
	// Match selects the requests the rule applies to; nil means all.
	Match func(R) bool
}

// SlotRules are the in-flight rules of one middleware over requests of
// type R. The zero value (or nil) has no rules: every request passes,
// holding nothing. It is safe for concurrent use.
type SlotRules[R any] struct {
	store  sluice.Slots
	specs  []SlotSpec[R]
	keys   []string        // PerKey: the key stem; Shed: the one key
	counts []*atomic.Int64 // Worker: the weight this process holds
	keyer  *Keyer
	noKey  error
	env    *holdEnv
}

// holdEnv is what the slots of every request of one SlotRules share.
type holdEnv struct {
	store    sluice.Slots
	observer sluice.SlotObserver
	logger   *slog.Logger // nil: slog.Default()
	pace     logpace.Pacer
	keep     keeper
	// clock and epoch are the keeper's clock (now): time.Now, and when
	// the rules were built.
	clock func() time.Time
	epoch time.Time
}

// now is the time on the keeper's clock, in nanoseconds since epoch, read
// on the monotonic clock: a step of the wall clock (NTP, an operator)
// must neither hold back the extends of running requests, whose slots the
// store would free while they run (it counts on its own clock), nor make
// their expiries due at once.
func (e *holdEnv) now() int64 { return int64(e.clock().Sub(e.epoch)) }

// at is the time of t, a time on the keeper's clock.
func (e *holdEnv) at(t int64) time.Time { return e.epoch.Add(time.Duration(t)) }

// SetLogger sets where a slot lost while its request runs, and a release
// that failed, are logged: default slog.Default(). Call it before use.
func (rs *SlotRules[R]) SetLogger(l *slog.Logger) {
	if rs != nil {
		rs.env.logger = l
	}
}

// log writes a line, paced per rule and message (logpace).
func (e *holdEnv) log(msg, rule string, attrs ...any) {
	e.pace.Log(msg+"\x00"+rule, func(notLogged int64) {
		l := e.logger
		if l == nil {
			l = slog.Default()
		}
		l.Warn(msg, append([]any{"rule", rule, "not_logged", notLogged}, attrs...)...)
	})
}

// logDropped writes the line of a failed release not sent again, paced
// per rule, with the count of those dropped since the last line.
func (e *holdEnv) logDropped(rule string, attrs ...any) {
	const msg = "sluice: " + DroppedReleaseMsg
	e.pace.Log(msg+"\x00"+rule, func(notLogged int64) {
		l := e.logger
		if l == nil {
			l = slog.Default()
		}
		l.Warn(msg, append([]any{"rule", rule, "dropped", notLogged + 1, "max_background", sluice.MaxBackgroundReleases}, attrs...)...)
	})
}

// DroppedReleaseMsg is the line of failed releases not sent again
// (sluice.ErrRetriesFull): the service's; the middleware's has "sluice: "
// before it.
const DroppedReleaseMsg = "in-flight release failed and not sent again: too many being sent again in the background; its slot frees at its hold timeout"

func (e *holdEnv) observe(name string, op sluice.SlotOp, o sluice.Outcome, p sluice.Priority, weight int64) {
	if e.observer != nil {
		e.observer.ObserveSlot(sluice.SlotEvent{Policy: name, Op: op, Outcome: o, Priority: p, Weight: weight})
	}
}

// NewSlotRules checks specs and returns them ready to acquire: valid
// names, unique among themselves and the names taken (the front end's
// rate rules), valid limits and reserves, a Key exactly for PerKey rules,
// and a store implementing sluice.Slots unless every rule is a Worker
// rule. Keys are built as NewRules builds them (prefix, hashKey). Errors
// wrap ErrInvalidRule (and sluice.ErrInvalidPriority for a bad Reserve);
// callers wrap them with their own ErrInvalidConfig. noKey is the front
// end's ErrNoKey: a Key returning it means the rule does not apply.
// taken(i) is the name of rate rule i of n.
func NewSlotRules[R any](store sluice.Store, specs []SlotSpec[R], prefix string, hashKey []byte, observer sluice.Observer, noKey error, n int, taken func(i int) string) (*SlotRules[R], error) {
	if len(specs) == 0 {
		return nil, nil
	}
	rs := &SlotRules[R]{specs: append([]SlotSpec[R](nil), specs...), noKey: noKey, env: &holdEnv{clock: time.Now, epoch: time.Now()}}
	rs.env.keep.now = rs.env.now
	rs.env.observer, _ = observer.(sluice.SlotObserver)
	seen := make(map[string]bool, len(specs)+n)
	for i := range n {
		seen[taken(i)] = true
	}
	keyer := NewKeyer(prefix, hashKey)
	rs.keyer = keyer
	needStore := false
	inFlight, shed := 0, 0 // rules of each kind so far
	for i := range rs.specs {
		s := &rs.specs[i]
		// Errors name a rule by its index among the rules of its kind: a
		// front end lists its in-flight rules, then its shedding rules,
		// so that is its index in the Options slice it came from.
		var what string
		if s.Kind == PerKey {
			what, inFlight = fmt.Sprintf("in-flight rule %d", inFlight), inFlight+1
		} else {
			what, shed = fmt.Sprintf("shed rule %d", shed), shed+1
		}
		if s.Kind == Shed {
			switch {
			case s.Workers != 0 && s.Limit != (sluice.InFlightLimit{}):
				return nil, fmt.Errorf("%s: %w: %q: set Capacity or Workers, not both", what, ErrInvalidRule, s.Name)
			case s.Workers != 0:
				s.Kind, s.Limit = Worker, sluice.InFlightLimit{Max: s.Workers}
			case s.Limit == (sluice.InFlightLimit{}):
				// Else reported as a capacity of 0: the rule would say
				// nothing of what it lacks.
				return nil, fmt.Errorf("%s: %w: %q: neither Capacity (the fleet's) nor Workers (this process's) is set: a shedding rule needs one (%w)",
					what, ErrInvalidRule, s.Name, sluice.ErrInvalidLimit)
			}
		}
		if err := s.validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", what, err)
		}
		if seen[s.Name] {
			return nil, fmt.Errorf("two rules named %q", s.Name)
		}
		seen[s.Name] = true
		var key string
		var count *atomic.Int64
		// No limit fingerprint (LimitStem): the store's slots hold no state
		// read under Max, and a Max changed on reload (or differing across
		// a fleet) must still count the slots already held.
		switch s.Kind {
		case PerKey:
			key, needStore = keyer.Base(s.Name), true
		case Shed:
			key, _ = keyer.Keys(keyer.Base(s.Name), "*", false)
			needStore = true
		case Worker:
			count = new(atomic.Int64)
		}
		rs.keys = append(rs.keys, key)
		rs.counts = append(rs.counts, count)
	}
	if needStore {
		if err := sluice.CheckBuilt(store); err != nil {
			return nil, err // a zero or nil-pointer store would fail every request
		}
		slots, ok := store.(sluice.Slots)
		if !ok {
			return nil, fmt.Errorf("in-flight rules on %T, which does not implement sluice.Slots", store)
		}
		rs.store, rs.env.store = slots, slots
	}
	addPolicies(observer, true, len(rs.specs), func(i int) string { return rs.specs[i].Name })
	return rs, nil
}

func (s *SlotSpec[R]) validate() error {
	if err := ValidateName(s.Name); err != nil {
		return err
	}
	var err error
	switch s.Kind {
	case PerKey:
		err = s.Limit.Validate()
		if err == nil && s.Reserve != (sluice.Reserve{}) {
			err = errors.New("a reserve needs a shedding rule")
		}
		if err == nil && s.Key == nil {
			err = errors.New("no Key")
		}
	case Shed, Worker:
		if s.Kind == Shed {
			err = s.Limit.Validate()
		} else if s.Limit.Max <= 0 || s.Limit.Max > sluice.MaxInFlight {
			err = fmt.Errorf("%w: Workers %d outside 1..%d", sluice.ErrInvalidLimit, s.Limit.Max, sluice.MaxInFlight)
		}
		if err == nil {
			err = s.Reserve.Validate()
		}
		if err == nil && s.Key != nil {
			err = errors.New("a shedding rule has no Key: its capacity is one for all requests")
		}
	default:
		err = fmt.Errorf("unknown kind %d", s.Kind)
	}
	if err != nil {
		return fmt.Errorf("%w: %q: %w", ErrInvalidRule, s.Name, err)
	}
	return nil
}

// Len returns the number of rules.
func (rs *SlotRules[R]) Len() int {
	if rs == nil {
		return 0
	}
	return len(rs.specs)
}

// SlotVerdict is the answer for one request's in-flight rules.
type SlotVerdict struct {
	// Allowed reports whether every rule that applies granted its slot.
	Allowed bool
	// Rule indexes the refusing rule; -1 when allowed.
	Rule int
	// Policy is the refusing rule's name.
	Policy string
	// Shed reports a refusal by a Shed or Worker rule: the service is
	// busy, the client is not over its limit.
	Shed bool
	// Decision is the refusing rule's decision; RetryAfter is its
	// estimate (WorkerRetryAfter for a Worker rule).
	Decision sluice.SlotDecision
}

// Held is the slots one request holds. Until Release, its store-backed
// slots are extended every third of their hold or so (the first time only
// once a request has run that long, so a short one costs no extend).
// Release frees them all, once; it is safe from any goroutine and a nil
// *Held holds nothing.
type Held struct {
	ctx      context.Context // the request's values, never its end
	holds    []*slotHold
	env      *holdEnv
	priority sluice.Priority
	done     atomic.Bool
	// every is about how often the store-backed slots are extended; 0
	// with none.
	every time.Duration
	// Under env.keep.mu: when the next round of extends is due and when
	// the keeper looks at h next (on its clock, holdEnv.now), h's place in
	// its heap (+1; 0: not in it), and whether a round runs.
	next, at  int64
	index     int
	extending bool
}

type slotHold struct {
	name   string
	slot   *sluice.Slot  // store-backed rules
	count  *atomic.Int64 // Worker rules
	weight int64
	// until is when the store frees the slot unless extended (on the
	// keeper's clock, holdEnv.now; from the answer of its acquire or last
	// extend): how long a failed release is worth sending again.
	until atomic.Int64
	// sure is the hold counted from when its acquire or last extend was
	// sent (holdEnv.now): before then the store cannot have freed the
	// slot at its hold timeout, so a release answered "not held" before
	// then was freed by an earlier try whose answer was lost, and is no
	// expiry.
	sure atomic.Int64
	// lost: an extend found the slot no longer held (keep's alone).
	lost bool
	// With an observer, a store-backed hold reports a sluice.SlotExpire
	// when its hold passes unreleased (the store has freed it), from the
	// keeper: state goes from 0 to 1 (released) or 2 (expired), once.
	state *atomic.Int32
}

// Acquire acquires the slot of every rule that applies to req (its Match
// accepts req and, for PerKey rules, its Key finds a key), in the order
// of the rules, for a request of priority p. All or none: on a refusal or
// an error the slots taken so far are released. A nil Held with an
// allowed verdict means no rule applied. Errors are a Key or Weight
// failing (naming the rule; wrap it as a key error), the store refusing
// what the rule asks (a *ConfigError, not observed as a store failure) or
// the store failing (a *StoreError). A rule's Match, Key or Weight that panics releases the
// slots taken so far, and the panic goes on.
func (rs *SlotRules[R]) Acquire(ctx context.Context, req R, p sluice.Priority) (*Held, SlotVerdict, error) {
	ok := SlotVerdict{Allowed: true, Rule: -1}
	if rs == nil {
		return nil, ok, nil
	}
	var h *Held
	obs := rs.env.observer
	defer func() {
		if r := recover(); r != nil {
			h.Release() // else a Worker rule's count is lost for good
			panic(r)
		}
	}()
	for i := range rs.specs {
		s := &rs.specs[i]
		if s.Match != nil && !s.Match(req) {
			continue
		}
		key := rs.keys[i]
		if s.Kind == PerKey {
			id, err := s.Key(req)
			if err != nil {
				if errors.Is(err, rs.noKey) {
					continue
				}
				h.Release()
				return nil, SlotVerdict{Rule: i}, fmt.Errorf("rule %q: %w", s.Name, err)
			}
			key, _ = rs.keyer.Keys(key, id, false)
		}
		weight := int64(1)
		if s.Weight != nil {
			if weight = s.Weight(req); weight < 1 || weight > s.Limit.Max {
				h.Release()
				return nil, SlotVerdict{Rule: i}, fmt.Errorf("rule %q: %w: weight %d outside 1..%d", s.Name, sluice.ErrInvalidWeight, weight, s.Limit.Max)
			}
		}
		if h == nil {
			h = &Held{ctx: context.WithoutCancel(ctx), env: rs.env, priority: p}
		}
		sent := rs.env.now()
		sh, d, err := rs.acquire(ctx, i, key, weight, p)
		if d.ReleaseDropped {
			rs.abandonDropped(s.Name, p)
		}
		if err != nil && Misconfigured(err) {
			h.Release()
			return nil, SlotVerdict{Rule: i}, &ConfigError{Policies: []string{s.Name}, Err: err}
		}
		if err != nil {
			if ctx.Err() == nil { // else the caller went away: no store failure
				rs.observe(s.Name, sluice.SlotAcquire, sluice.OutcomeError, p, weight, sluice.SlotDecision{})
			}
			h.Release()
			return nil, SlotVerdict{Rule: i}, &StoreError{Err: err}
		}
		if !d.Allowed {
			o := sluice.OutcomeDenied
			if s.Kind != PerKey {
				o = sluice.OutcomeShed
			}
			rs.observe(s.Name, sluice.SlotAcquire, o, p, weight, d)
			h.Release()
			return nil, SlotVerdict{Rule: i, Policy: s.Name, Shed: s.Kind != PerKey, Decision: d}, nil
		}
		rs.observe(s.Name, sluice.SlotAcquire, sluice.OutcomeAllowed, p, weight, d)
		if sh.slot != nil {
			hold := s.Limit.Hold
			sh.until.Store(rs.env.now() + int64(hold))
			sh.sure.Store(sent + int64(hold))
			if h.every == 0 || hold/3 < h.every {
				h.every = max(hold/3, minKeep)
			}
			if obs != nil {
				sh.state = new(atomic.Int32)
			}
		}
		h.holds = append(h.holds, sh)
	}
	if h != nil && h.every > 0 {
		k := &rs.env.keep
		k.mu.Lock()
		h.next = rs.env.now() + int64(h.wait())
		k.schedule(h)
		k.mu.Unlock()
	}
	return h, ok, nil
}

// wait is the time to the next round of extends: a third of the shortest
// hold, less up to a quarter of that at random, so that the requests that
// started together do not extend together.
func (h *Held) wait() time.Duration {
	return h.every - rand.N(h.every/4+1)
}

// extend extends every store-backed slot of h that is held, and schedules
// the next round (the keeper starts one at a time). A slot found no longer
// held (the store lost it, or it expired while the store was unreachable)
// is reported and logged, and extended no more: the request goes on. A
// failure is reported, and tried again at the next round.
func (h *Held) extend() {
	start := h.env.now()
	ctx, cancel := context.WithTimeout(h.ctx, releaseTimeout)
	for _, sh := range h.holds {
		if h.done.Load() {
			break
		}
		if sh.slot == nil || sh.lost {
			continue
		}
		sent := h.env.now()
		err := sh.slot.Extend(ctx)
		if h.done.Load() {
			break // released meanwhile: a "not held" is the release's doing
		}
		h.extended(sh, sent, err)
	}
	cancel()
	k := &h.env.keep
	k.mu.Lock()
	defer k.mu.Unlock()
	h.extending = false
	now := h.env.now()
	h.next = now + int64(max(h.wait()-time.Duration(now-start), minKeep))
	k.schedule(h) // its slots' expiries too, moved by the extends
}

// extended reports the outcome of sh's extend, sent at sent.
func (h *Held) extended(sh *slotHold, sent int64, err error) {
	switch {
	case err == nil:
		hold := sh.slot.Limit().Hold
		sh.until.Store(h.env.now() + int64(hold))
		sh.sure.Store(sent + int64(hold))
		h.env.observe(sh.name, sluice.SlotExtend, sluice.OutcomeAllowed, h.priority, sh.weight)
	case errors.Is(err, sluice.ErrSlotLost):
		sh.lost = true
		h.env.observe(sh.name, sluice.SlotExtend, sluice.OutcomeDenied, h.priority, sh.weight)
		if sh.state != nil && sh.state.CompareAndSwap(0, 2) {
			h.env.observe(sh.name, sluice.SlotExpire, sluice.OutcomeAllowed, h.priority, sh.weight)
		}
		h.env.log("sluice: in-flight slot lost while its request runs; it may be taken by another", sh.name,
			"weight", sh.weight)
	default:
		h.env.observe(sh.name, sluice.SlotExtend, sluice.OutcomeError, h.priority, sh.weight)
	}
}

// acquire takes rule i's slot of weight under key for priority p.
func (rs *SlotRules[R]) acquire(ctx context.Context, i int, key string, weight int64, p sluice.Priority) (*slotHold, sluice.SlotDecision, error) {
	s := &rs.specs[i]
	sh := &slotHold{name: s.Name, weight: weight}
	switch s.Kind {
	case Worker:
		max := s.Reserve.Threshold(s.Limit.Max, p)
		c := rs.counts[i]
		for {
			n := c.Load()
			if n+weight > max {
				d := sluice.SlotDecision{Limit: sluice.InFlightLimit{Max: max}, InUse: n, RetryAfter: WorkerRetryAfter}
				return sh, d, nil
			}
			if c.CompareAndSwap(n, n+weight) {
				sh.count = c
				d := sluice.SlotDecision{Allowed: true, Limit: sluice.InFlightLimit{Max: max}, InUse: n + weight, Remaining: max - n - weight}
				return sh, d, nil
			}
		}
	case Shed:
		if !s.Limit.Admits(p, s.Reserve, weight) {
			// Everything p may use is reserved: no wait helps, so say
			// the hold, the longest any slot stays held.
			return sh, sluice.SlotDecision{Limit: s.Limit.For(p, s.Reserve), RetryAfter: s.Limit.Hold}, nil
		}
		slot, d, err := sluice.AcquireSlot(ctx, rs.store, key, s.Limit.For(p, s.Reserve), weight)
		sh.slot = slot
		return sh, d, err
	default:
		slot, d, err := sluice.AcquireSlot(ctx, rs.store, key, s.Limit, weight)
		sh.slot = slot
		return sh, d, err
	}
}

// abandonDropped reports the release of an abandoned acquire (an error, a
// failure policy's denial) that was not sent: too many were being sent.
// It counts and logs as a failed release not sent again: the store may
// hold the slot to its hold timeout.
func (rs *SlotRules[R]) abandonDropped(name string, p sluice.Priority) {
	if rs.env.observer != nil {
		rs.env.observer.ObserveSlot(sluice.SlotEvent{Policy: name, Op: sluice.SlotRelease, Outcome: sluice.OutcomeError, Priority: p, NotRetried: true})
	}
	rs.env.logDropped(name, "abandoned", true, "not_retried", sluice.ErrRetriesFull.Error())
}

func (rs *SlotRules[R]) observe(name string, op sluice.SlotOp, o sluice.Outcome, p sluice.Priority, weight int64, d sluice.SlotDecision) {
	if rs.env.observer != nil {
		rs.env.observer.ObserveSlot(sluice.SlotEvent{Policy: name, Op: op, Outcome: o, Priority: p, Weight: weight, Decision: d})
	}
}

// Release frees every slot h holds. Only the first call does anything.
// It runs on a context detached from the request's (its values kept) and
// bounded by a second, so that it works after the client has gone away;
// a release that fails anyway is observed and logged, and sent again in
// the background (sluice.RetryRelease) until the store answers or the
// slot's hold has passed.
func (h *Held) Release() {
	if h == nil || !h.done.CompareAndSwap(false, true) {
		return
	}
	if h.every > 0 {
		// After the releases: a slot whose release failed still has its
		// expiry to report.
		defer func() {
			k := &h.env.keep
			k.mu.Lock()
			k.schedule(h)
			k.mu.Unlock()
		}()
	}
	var ctx context.Context
	for _, sh := range h.holds {
		outcome := sluice.OutcomeAllowed
		weight := sh.weight
		notRetried := false
		if sh.count != nil {
			sh.count.Add(-sh.weight)
		} else {
			if ctx == nil {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(h.ctx, releaseTimeout)
				defer cancel()
			}
			if err := sh.slot.Release(ctx); err != nil {
				// Until a retry frees it, the store holds the slot: it is
				// reported held (at most until the keeper's SlotExpire).
				outcome, weight = sluice.OutcomeError, 0
				notRetried = !h.retryRelease(sh, err)
			}
		}
		if sh.state != nil && outcome == sluice.OutcomeAllowed {
			if !sh.state.CompareAndSwap(0, 1) {
				weight = 0 // past its hold: reported held no more then
			}
		}
		if h.env.observer != nil {
			h.env.observer.ObserveSlot(sluice.SlotEvent{Policy: sh.name, Op: sluice.SlotRelease, Outcome: outcome, Priority: h.priority, Weight: weight, NotRetried: notRetried})
		}
	}
}

// retryRelease hands sh's failed release to sluice.RetryRelease, whose
// answer is reported as one more release: freed now; freed before (Again)
// when not held though its hold cannot have passed (sure), the failed try
// having run (or the store having lost it), and no expiry; else not held,
// and an expiry. It reports false when the release is not sent again:
// too many are.
func (h *Held) retryRelease(sh *slotHold, err error) bool {
	var done func(bool)
	if sh.state != nil {
		done = func(held bool) {
			before := !held && h.env.now() < sh.sure.Load()
			if held || before {
				weight := sh.weight
				if !sh.state.CompareAndSwap(0, 1) {
					weight = 0 // past its hold: reported held no more then
				}
				if h.env.observer != nil {
					h.env.observer.ObserveSlot(sluice.SlotEvent{Policy: sh.name, Op: sluice.SlotRelease, Outcome: sluice.OutcomeAllowed, Priority: h.priority, Weight: weight, Again: before})
				}
				return
			}
			h.env.observe(sh.name, sluice.SlotRelease, sluice.OutcomeDenied, h.priority, 0)
			if sh.state.CompareAndSwap(0, 2) {
				h.env.observe(sh.name, sluice.SlotExpire, sluice.OutcomeAllowed, h.priority, sh.weight)
			}
		}
	}
	until := h.env.at(sh.until.Load())
	attrs := []any{"error", err.Error(), "held_until", until.UTC().Format(time.RFC3339Nano)}
	if rerr := sluice.RetryRelease(h.env.store, sh.slot.Key(), sh.slot.Holder(), until, done); rerr != nil {
		// A line of its own: the failures' line is paced per rule, and one
		// written before the bound filled says they are sent again.
		h.env.logDropped(sh.name, append(attrs, "not_retried", rerr.Error())...)
		return false
	}
	h.env.log("sluice: in-flight release failed; sent again in the background until its hold ends", sh.name, attrs...)
	return true
}

// StoreError is a store failure met while acquiring a slot: front ends
// answer it as they answer a rate rule's store failure.
type StoreError struct{ Err error }

func (e *StoreError) Error() string { return e.Err.Error() }
func (e *StoreError) Unwrap() error { return e.Err }

// RetrySeconds is the refusal's Retry-After in whole seconds, rounded up,
// at least 1: a refusal always means "wait".
func (v SlotVerdict) RetrySeconds() int64 {
	return max(int64((v.Decision.RetryAfter+time.Second-1)/time.Second), 1)
}

// Message describes the refusal for a response body or status message,
// the same in every front end.
func (v SlotVerdict) Message() string {
	what := "in-flight limit %q reached"
	if v.Shed {
		what = "overloaded: %q sheds this request"
	}
	return fmt.Sprintf(what+"; retry in %ds (an estimate)", v.Policy, v.RetrySeconds())
}
