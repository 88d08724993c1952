package sluice

import "time"

// Observer receives what the middleware (packages httplimit and grpclimit)
// and the failure-policy wrapper (package resilient) see, so that metrics
// can be kept without the core depending on a metrics library. Package
// promsluice implements it for Prometheus.
//
// Methods are called on the request path, from many goroutines at once:
// implementations must be safe for concurrent use, fast, and must not
// block. A nil Observer is valid wherever one is accepted and observes
// nothing. One that also implements SlotObserver receives the
// middleware's in-flight events too.
type Observer interface {
	// ObserveDecision is called at most once per policy per request, for
	// the policies that decided it: on an admitted request every policy
	// that took units (shadow ones included); on a denied request only the
	// policies that denied it (and shadow ones that could never admit it),
	// since layered limits are all or nothing and the others took nothing;
	// on a store failure each enforcing policy not yet decided, as
	// OutcomeError, and so a shadow policy whose take or peek failed (a
	// denied request's shadow checks are peeked where every check gets a
	// decision: the service's Envoy RLS and JSON API); on a key or cost
	// failure, the policy that failed, as OutcomeError. A request whose
	// context ended while a Delay rule held it is not observed, as a store
	// failure of an ended context is not: no client hears its answer. A
	// policy's OutcomeAllowed count is thus the requests it charged. Checks
	// that only look (cost 0) are not observed.
	ObserveDecision(DecisionEvent)
	// ObserveStore is called once per call of a wrapped store.
	ObserveStore(StoreEvent)
	// ObserveBreaker is called when a circuit breaker changes state, and
	// once when it is built (resilient.New), with From and To both
	// BreakerClosed: its initial state, which no change reports.
	ObserveBreaker(BreakerEvent)
}

// Outcome is what a policy did to a request.
type Outcome uint8

const (
	// OutcomeAllowed: the policy admitted the request.
	OutcomeAllowed Outcome = iota
	// OutcomeDenied: the policy refused the request (or delayed it past
	// its maximum).
	OutcomeDenied
	// OutcomeShadowDenied: a shadow (dry-run) policy would have refused the
	// request, but let it through.
	OutcomeShadowDenied
	// OutcomeError: the policy could not decide: a store failure that no
	// failure policy absorbed, a store refusing what the rule asks of it
	// (a misconfiguration, answered 500 by httplimit), or a request the
	// rule could not key or weigh (its key function failed, its Cost was
	// below 1: also a 500).
	OutcomeError
	// OutcomeShed: an in-flight acquire refused by priority load shedding
	// (the request's share of the capacity was full): the client did
	// nothing wrong. Rate decisions never have it.
	OutcomeShed
)

var outcomeNames = [...]string{"allowed", "denied", "shadow_denied", "error", "shed"}

// String returns the outcome's metric label: "allowed", "denied",
// "shadow_denied", "error" or "shed".
func (o Outcome) String() string { return label(outcomeNames[:], int(o)) }

// label returns names[i], the metric label of value i of an enum, or
// "unknown" for a value it does not know.
func label(names []string, i int) string {
	if i < len(names) {
		return names[i]
	}
	return "unknown"
}

// DecisionEvent reports one policy's verdict on one request.
type DecisionEvent struct {
	// Policy is the rule's name, as in the RateLimit-Policy header.
	Policy string
	// Outcome is what the policy did.
	Outcome Outcome
	// Decision is the store's verdict; zero when Outcome is OutcomeError.
	Decision Decision
}

// Source says who answered a store call: in a StoreEvent for observers,
// and in Decision.Source for the caller.
type Source uint8

const (
	// SourceBackend: the store itself (for package resilient, the wrapped
	// backend) answered. The zero value: every store's own decisions.
	SourceBackend Source = iota
	// SourceDenyCache: a cached denial answered; the backend was not called.
	SourceDenyCache
	// SourceFallback: the backend failed (or its breaker is open) and the
	// local fallback store answered.
	SourceFallback
	// SourceFailOpen: the backend failed (or its breaker is open) and the
	// request was allowed. The decision is made up: nothing was counted.
	SourceFailOpen
	// SourceFailClosed: the backend failed (or its breaker is open) and the
	// request was denied. The decision is made up: no limit was exceeded.
	SourceFailClosed
	// SourceLease: a lease (package sluice/lease) answered in memory from
	// units already taken from the store; the store was not called.
	SourceLease
)

var sourceNames = [...]string{"backend", "deny_cache", "fallback", "fail_open", "fail_closed", "lease"}

// String returns the source's metric label, such as "deny_cache".
func (s Source) String() string { return label(sourceNames[:], int(s)) }

// StoreEvent reports one call of a wrapped store.
type StoreEvent struct {
	// Store names the wrapped store, for metric labels.
	Store string
	// Op is "take", "take_all", "peek", "reset", "grant", "return" or
	// "regrant" (and for in-flight slots "acquire", "extend", "release").
	Op string
	// Key is the call's key; empty for a take_all, which has several. It
	// tells whose call it was (a service maps it to its policy); keys can
	// carry client data and are unbounded: never a metric label.
	Key string
	// Source says who answered.
	Source Source
	// Latency is how long the backend call took, including a timed-out
	// wait; zero when the backend was not called.
	Latency time.Duration
	// Err is the backend's error, nil when it answered or was not called.
	// The caller may still have received a decision (from the failure
	// policy). With Reported, it is the error of another call, the one the
	// failure policy answers this decision for.
	Err error
	// Reported: Err is the error of an earlier call for the same key,
	// which its own event reported: a decision the failure policy answered
	// without calling the backend because the key's lease call (a grant,
	// regrant or return) just failed (resilient.Store.TakeByPolicy). Count
	// it as a decision answered for a failed call, not as another failure.
	Reported bool
}

// BreakerState is a circuit breaker's state.
type BreakerState uint8

const (
	// BreakerClosed: calls go to the backend.
	BreakerClosed BreakerState = iota
	// BreakerHalfOpen: one probe call is testing whether the backend is back.
	BreakerHalfOpen
	// BreakerOpen: the backend is considered down; the failure policy
	// answers without calling it.
	BreakerOpen
)

var breakerNames = [...]string{"closed", "half_open", "open"}

// String returns "closed", "half_open" or "open".
func (s BreakerState) String() string { return label(breakerNames[:], int(s)) }

// BreakerEvent reports a circuit breaker's change of state, or with From
// equal to To its initial state, or with Forgotten set its end.
type BreakerEvent struct {
	// Store names the wrapped store.
	Store string
	// Partition names the partition of the store whose breaker this is
	// (see Partitioner: a Redis Cluster master's address), "" for a
	// breaker of the whole store.
	Partition string
	// From and To are the states before and after the change.
	From, To BreakerState
	// Err is, when To is BreakerOpen, the error of the call that opened
	// the breaker; nil otherwise.
	Err error
	// Forgotten reports that a partition's breaker is gone, closed (From
	// and To BreakerClosed): no key maps to its partition any more (a
	// Redis Cluster master failed over or lost its slots), so whatever an
	// observer keeps for it, a metric's series, may go.
	Forgotten bool
}
