package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/header"
	"github.com/sluicehq/sluice/internal/problem"
)

// Strategy is what a rule does with a request over its limit.
type Strategy = enforce.Strategy

// Strategies.
const (
	// Reject answers 429 at once. The zero value.
	Reject = enforce.Reject
	// Delay holds the request until quota is available, up to the rule's
	// MaxDelay or, if that comes first, its context's deadline, then serves
	// it; a request expected to need longer than either less a store round
	// trip and 25ms to ask for the units in time (of MaxDelay, at most
	// half), or that finds MaxWaiting requests already held, is rejected
	// at once, with the Retry-After it would have needed. The held requests of one
	// process on one key form a line (first come, first served) whose
	// length counts in that estimate; requests of other processes on the
	// key do not, so with them a held request may still be rejected at
	// MaxDelay. A request whose context ends while held (its client gave
	// up) is no denial: nothing is written, or a 503 when a deadline set
	// on the server's side passed, and the Observer counts nothing.
	Delay = enforce.Delay
	// Shadow decides and records (see Options.Observer) but never blocks
	// and sets no headers: a dry run before enforcing a new limit. It
	// takes its units only when the request is admitted.
	Shadow = enforce.Shadow
	// Penalty rejects, and after a violation blocks the key for the rule's
	// Penalty duration, whatever its limit says: the defence for abused
	// endpoints such as one-time-password requests. The block lives in the
	// store, so it holds across a fleet sharing a Redis store. Checking it
	// is a store call before the take (and starting it one after a
	// violation): a resilient store's Timeout bounds each call, so with
	// Redis stalled a Penalty rule's request waits two Timeouts where a
	// Reject rule's waits one.
	Penalty = enforce.Penalty
)

// ParseStrategy parses a strategy's config name: "reject", "delay",
// "shadow" (or "dry_run") or "penalty".
func ParseStrategy(s string) (Strategy, error) {
	st, err := enforce.ParseStrategy(s)
	if err != nil {
		return st, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return st, nil
}

// Errors. Construction errors wrap ErrInvalidConfig; the errors passed to
// Options.ErrorHandler wrap ErrKey, ErrStore, or ErrInvalidConfig when the
// store refuses at a request what a rule asks of it (a lease store's
// Options.For leasing a sliding window log): such an error also wraps the
// store's own (sluice.ErrInvalidLimit, sluice.ErrGrantUnsupported, ...).
var (
	ErrInvalidConfig = errors.New("httplimit: invalid configuration")
	// ErrKey: a rule's KeyFunc or Cost failed for a request.
	ErrKey = errors.New("httplimit: cannot key request")
	// ErrStore: the store failed (and no failure policy absorbed it). A
	// store's refusal of bad input is ErrInvalidConfig instead: no retry
	// mends it.
	ErrStore = errors.New("httplimit: store failed")
)

// Rule is one rate-limit policy for the requests it matches.
type Rule struct {
	// Name identifies the policy in headers, the 429 body and metrics:
	// 1 to 1024 bytes of UTF-8 text without control characters. Names are
	// unique within a Middleware. Required.
	Name string

	// Limit is the policy's limit. Required.
	Limit sluice.Limit

	// Key says whom the request is counted against. Required.
	Key KeyFunc

	// Cost weighs a request in units of Limit, so that expensive endpoints
	// use more quota. Below 1 it fails the request (ErrKey); above
	// Limit.Capacity() the request can never be admitted and is denied
	// without a Retry-After, taking nothing (see the package doc).
	// Default: 1 per request.
	Cost func(*http.Request) int64

	// Match selects the requests the rule applies to. Default: all.
	Match func(*http.Request) bool

	// Strategy applies over the limit. Default: Reject.
	Strategy Strategy

	// MaxDelay is the longest a Delay rule holds a request. Set under
	// Reject or Penalty it is refused (New fails), not ignored.
	MaxDelay time.Duration

	// MaxWaiting is the most requests a Delay rule holds at once in this
	// process; past it, requests over the limit are rejected at once.
	// Default: 1024. Under Reject or Penalty it is refused (New fails),
	// not ignored.
	MaxWaiting int

	// Penalty is how long a Penalty rule blocks a key after a violation
	// (1ms to sluice.MaxPeriod). Set under Reject or Delay it is refused.
	Penalty time.Duration
}

// Denial describes a rejected request to a DenyHandler.
type Denial struct {
	// Policy is the name of the violated rule.
	Policy string
	// Decision is its decision; RetryAfter is how long to wait.
	Decision sluice.Decision
	// Cost is the request's cost under the rule, and Capacity the rule's
	// Limit.Capacity(). A Cost above Capacity can never be admitted:
	// Decision.RetryAfter is then zero and no Retry-After is set (see
	// Never).
	Cost, Capacity int64
}

// Never reports whether the denied request can never be admitted: its
// cost exceeds the rule's capacity, so no wait would help.
func (d Denial) Never() bool { return d.Cost > d.Capacity }

// Options configures a Middleware. A nil *Options is valid.
type Options struct {
	// Prefix starts every store key, so several middlewares or services can
	// share a store. Keys are Prefix + "v3:" + the rule name (percent-
	// escaped) + "@" + a fingerprint of its limit + ":" + the key, which
	// the store wraps in its own prefix and suffix (sluice:{…}:gcra); see
	// "Keys in the store" in docs/middleware.md.
	// At most 128 bytes: New fails with ErrInvalidConfig for a longer one.
	// Default: "httplimit:".
	Prefix string

	// HashKey, when set, replaces every key with its HMAC-SHA-256 under
	// this secret, so raw IPs and API keys never sit in the store. Keys
	// longer than the store allows are hashed (SHA-256) in any case.
	// Default: none.
	HashKey []byte

	// Exempt exempts requests from every rule: health checks, allow-listed
	// clients. Default: none.
	Exempt func(*http.Request) bool

	// AllowedHeaders selects the rate-limit header fields of allowed
	// responses; denied responses always carry every field. Default:
	// StandardHeaders (RateLimit and RateLimit-Policy).
	AllowedHeaders HeaderSet

	// DenyHandler writes the response to a denied request. The rate-limit
	// headers are already set. Default: DefaultDenyHandler (429 with an
	// application/problem+json body).
	DenyHandler func(w http.ResponseWriter, r *http.Request, d Denial)

	// ErrorHandler writes the response when a request cannot be decided:
	// err wraps ErrKey (a KeyFunc or Cost failed), ErrStore, or
	// ErrInvalidConfig (the store refused a rule's limit or cost). To choose
	// between failing open and closed when Redis is down, wrap the store
	// with package resilient rather than here. Default: DefaultErrorHandler.
	ErrorHandler func(w http.ResponseWriter, r *http.Request, err error)

	// Observer receives every rule's decisions. Default: none.
	Observer sluice.Observer

	// Clock anchors X-RateLimit-Reset. Default: time.Now.
	Clock func() time.Time

	// InFlight bounds requests in progress per key (see InFlightRule).
	// They need a store implementing sluice.Slots. Default: none.
	InFlight []InFlightRule

	// Shed sheds load by priority (see ShedRule). Default: none.
	Shed []ShedRule

	// Priority says how important a request is, for Shed rules. Default:
	// nil, every request critical (a ShedRule is then a plain capacity).
	Priority PriorityFunc
}

// Middleware enforces Rules on HTTP requests. Build one with New and wrap
// handlers with Handler. It is safe for concurrent use.
//
// For each request it keeps the rules whose Match accepts it and whose Key
// finds a key, then checks the enforcing ones (Reject, Delay, Penalty)
// all-or-nothing through sluice.MultiStore.TakeAll: a request denied by
// one rule takes nothing from the others. Shadow rules never block, and
// take their units only from admitted requests. Headers describe the violated rule with the longest
// wait, or, when allowed, the rule closest to exhaustion.
//
// In-flight and shedding rules (Options.InFlight, Options.Shed) are
// checked first: a request acquires their slots, in order, before its rate
// rules take any units, and a rate denial releases them. A request holds
// its slots until its handler returns (or panics, or, having hijacked the
// connection, closes it).
//
// The zero value has no rules: its Handler passes every request through.
// A nil *Middleware (New's error ignored) answers every request 500 with a
// problem+json body naming the cause, never passing it through unlimited.
type Middleware struct {
	rules    *enforce.Rules[*http.Request]
	slots    *enforce.SlotRules[*http.Request]
	priority PriorityFunc
	fields   []header.Fields   // the header fields of each rule, by index
	denials  []*problem.Denial // each rule's default 429 body, pre-encoded
	exempt   func(*http.Request) bool
	allowed  HeaderSet
	deny     func(http.ResponseWriter, *http.Request, Denial)
	onError  func(http.ResponseWriter, *http.Request, error)
	clock    func() time.Time
}

// New returns a Middleware enforcing rules on store. Layered limits (more
// than one enforcing rule) need a store that implements sluice.MultiStore,
// as the memory and Redis stores do. For a fleet, wrap the Redis store
// with package resilient to choose the failure policy. A store that is a
// sluice.LimitChecker (a lease store) checks here every limit a rule
// uses, a Penalty rule's block included, so that a limit it refuses for
// every key fails New rather than every request. So does a store never
// built (a zero or nil-pointer store: see sluice.CheckBuilt).
func New(store sluice.Store, rules []Rule, opts *Options) (*Middleware, error) {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Prefix == "" {
		o.Prefix = "httplimit:"
	}
	if o.AllowedHeaders > NoHeaders {
		return nil, fmt.Errorf("%w: unknown AllowedHeaders %v", ErrInvalidConfig, o.AllowedHeaders)
	}
	specs := make([]enforce.Spec[*http.Request], len(rules))
	for i, r := range rules {
		specs[i] = enforce.Spec[*http.Request]{
			Rule: enforce.Rule{Name: r.Name, Limit: r.Limit, Strategy: r.Strategy, MaxDelay: r.MaxDelay, MaxWaiting: r.MaxWaiting, Penalty: r.Penalty},
			Key:  r.Key, Cost: r.Cost, Match: r.Match,
		}
	}
	var rs *enforce.Rules[*http.Request]
	if len(rules) > 0 || len(o.InFlight)+len(o.Shed) == 0 {
		var err error
		if rs, err = enforce.NewRules(store, specs, o.Prefix, o.HashKey, o.Observer, ErrNoKey); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	m := &Middleware{
		rules:   rs,
		exempt:  o.Exempt,
		allowed: o.AllowedHeaders,
		deny:    o.DenyHandler,
		onError: o.ErrorHandler,
		clock:   o.Clock,
	}
	if m.onError == nil {
		m.onError = DefaultErrorHandler
	}
	if m.clock == nil {
		m.clock = time.Now
	}
	if err := m.setupSlots(store, rules, &o); err != nil {
		return nil, err
	}
	for _, r := range rules {
		m.fields = append(m.fields, header.NewFields(r.Name, r.Limit))
		m.denials = append(m.denials, problem.NewDenial(r.Name))
	}
	return m, nil
}

// Handler returns next behind the middleware's rules. A nil next is
// http.DefaultServeMux, as for http.Server's Handler. On a nil m, it
// answers every request 500 (see Middleware).
func (m *Middleware) Handler(next http.Handler) http.Handler {
	if m == nil {
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			problem.Write(w, problem.New(http.StatusInternalServerError, "rate limiter misconfigured: nil *httplimit.Middleware (New failed?)"))
		})
	}
	if next == nil {
		next = http.DefaultServeMux
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	if m.exempt != nil && m.exempt(r) {
		next.ServeHTTP(w, r)
		return
	}
	held, ok := m.acquire(w, r)
	if !ok {
		return
	}
	if held != nil {
		serveHolding(w, r, held, func(w http.ResponseWriter, r *http.Request) { m.limit(w, r, next) })
		return
	}
	m.limit(w, r, next)
}

// abandoned answers a request whose context ended while a Delay rule held
// it: no 429, and no denial counted. A client gone hears nothing, so
// nothing is written; a deadline passed (set on the server's side: the
// client may still wait) is a 503, as http.TimeoutHandler's.
func abandoned(w http.ResponseWriter, r *http.Request) {
	if errors.Is(r.Context().Err(), context.DeadlineExceeded) {
		problem.Write(w, problem.New(http.StatusServiceUnavailable, "the request's deadline passed while it waited for quota"))
	}
}

// storeError wraps an error of the store for Options.ErrorHandler: a
// refusal of what a rule asks is ErrInvalidConfig, else ErrStore.
func storeError(err error) error {
	if cfg := (*enforce.ConfigError)(nil); errors.As(err, &cfg) {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return fmt.Errorf("%w: %w", ErrStore, err)
}

// limit serves r under the rate rules.
func (m *Middleware) limit(w http.ResponseWriter, r *http.Request, next http.Handler) {
	var buf [4]enforce.Check
	checks, err := m.rules.Collect(r, buf[:0])
	if err != nil {
		m.onError(w, r, fmt.Errorf("%w: %w", ErrKey, err))
		return
	}
	if len(checks) == 0 {
		next.ServeHTTP(w, r)
		return
	}
	v, err := m.rules.Enforce(r.Context(), checks)
	if err != nil {
		m.onError(w, r, storeError(err))
		return
	}
	if v.Abandoned {
		abandoned(w, r)
		return
	}
	never := !v.Allowed && enforce.Never(&checks[v.Report])
	if never {
		v.Decision.RetryAfter = 0
	}
	if v.Report >= 0 && (!v.Allowed || m.allowed != NoHeaders) {
		header.Write(w.Header(), m.allowed, m.fields[checks[v.Report].Tag], v.Decision, m.clock)
	}
	if v.Allowed {
		next.ServeHTTP(w, r)
		return
	}
	if never { // as the service's Envoy answer
		header.OmitNever(w.Header(), v.Blind)
	}
	c := &checks[v.Report]
	if m.deny == nil { // DefaultDenyHandler, without encoding anything
		if never {
			problem.Write(w, problem.Never(c.Rule.Name, c.Cost, c.Rule.Limit.Capacity()))
			return
		}
		m.denials[c.Tag].Write(w, max(header.CeilSeconds(v.Decision.RetryAfter), 1))
		return
	}
	m.deny(w, r, Denial{Policy: c.Rule.Name, Decision: v.Decision, Cost: c.Cost, Capacity: c.Rule.Limit.Capacity()})
}
