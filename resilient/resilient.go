// Package resilient wraps a sluice.Store (typically Redis) with a failure
// policy, so that what happens when the backend fails is a choice, not an
// accident:
//
//   - FallbackLocal (the default): a local memory store enforces the same
//     limits, each process a share of them (Options.Nodes, or the size a
//     Fleet discovers), until the backend answers again.
//   - FailOpen: requests are allowed, each decision reporting what a
//     fresh key's would (see FailOpen).
//   - FailClosed: requests are denied.
//
// Every backend call is bounded by a timeout (default 50ms), so a dead or
// stalled Redis cannot hold requests for seconds; a call that times out
// is answered by the policy alone. A circuit breaker stops calling a
// backend that is down, not merely slow: it opens when half the calls of
// the last 10s failed (at least 20 of them), or when every call has failed
// for 500ms; it lets one probe through every second, and three good probes
// in a row return decisions to the backend on their own. A good probe is a
// call the backend answered by writing (an admitted take or acquire, a
// release or extend of a held slot, a grant): a peek or a denial proves
// only that reads work, and the next call probes instead. Each transition
// is one log line (Options.Logger) and an Observer BreakerEvent; the
// failure policy starts answering every call when the breaker leaves
// closed and stops when it closes, which those two lines tell (policy).
// The outcome of a call sent before the breaker's last transition is
// ignored: calls sent before it opened that fail after probes closed it
// (still dialling a master that failed over) do not reopen it.
//
// With the breaker closed, the policy answers each call that failed on its
// own (one timeout on a starved host). No transition tells those, so they
// have a WARN line of their own, "resilient: failure policy answered
// failed calls (breaker still closed)": a second after the first such
// answer, with how many decisions the policy answered since the last such
// line (decisions), the policy, the store and the first of their errors
// (error); then at most one a minute while they go on, and at Close. One
// pending when the breaker opens is told on the opening line instead
// (answered_while_closed, and first_error if it differs from the
// opener's). A burst is thus one line, not one per decision. Every decision the policy answers, the
// breaker closed or not, is also an Observer StoreEvent whose Source is
// the policy's: promsluice counts them in
// sluice_store_calls_total{source="fallback"} (or fail_open, fail_closed).
//
// A backend that is a sluice.Partitioner (redisstore's on a Redis Cluster,
// whose partitions are its masters) has a breaker per partition, each with
// its own transitions, probes, lines (naming the partition) and
// BreakerEvents (BreakerEvent.Partition): one master down sends only its
// own keys to the failure policy (see partition.go for why breakers follow
// masters, not slot ranges). A TakeAll whose keys span partitions goes to
// the backend only while each of their breakers lets it, else the policy
// answers it whole; one that fails is charged to the partitions that have
// not answered a call sent since it. State is the worst of the breakers;
// Breakers lists each.
//
// A Store is a sluice.Regranter and sluice.GrantAller for package lease:
// grants, returns and regrants (and a GrantAll's, together) pass through to a backend that grants while the breaker lets
// calls through, and fail with ErrNoGrant otherwise; the failure policy
// never grants. After such a call failed, TakeByPolicy, PeekByPolicy and
// TakeAllByPolicy answer by the policy without another call, so that a
// request waits for a backend that does not answer once; TakeAllByPolicy
// all or nothing in one step (under FallbackLocal, the fallback's TakeAll),
// so that requests racing for the fallback's last units lose none.
//
// # Bounds when the backend fails
//
// Under FallbackLocal each process's fallback charges a take of cost c as
// n·c against the whole limit, n being the fleet size it assumes, in state
// kept across breaker cycles and fleet size changes. The backend and the
// fallbacks are then each an exact limiter, and the fleet admits at most
// their sum, key by key: over a partitioned backend, only the keys of a
// partition whose breaker opened (and of TakeAlls spanning it) have a
// fallback episode, the others staying exact. With B the capacity, r =
// Rate/Period, T an interval's length
// and D a fallback episode's length within it:
//
//   - GCRA, TokenBucket, LeakyBucket: an exact limiter admits B + r·T. With
//     one episode, D long for every process and S longer for some (their
//     breakers close one after another), the fleet admits at most
//     B + r·T + B + min(B, r·D) + r·S, an excess of at most 2·B + r·S
//     whatever D (the fallbacks' burst, the backend's refill while unused,
//     and the backend's whole rate to the processes back on it while the
//     others' fallbacks serve their shares: exactly r times the mean lag);
//     with any number of episodes, at most 2·(B + r·T).
//   - FixedWindow, SlidingWindowCounter (per window), SlidingWindowLog (per
//     Period-long span): at most 2·Rate where a switch falls or any
//     process is on its fallback (the backend admits Rate to the others
//     while the fallbacks take their shares), Rate elsewhere.
//
// Preconditions: n is at least the real number of processes taking a
// share at every moment (with a Fleet, a process the others may no longer
// count takes none: see Fleet.Counted); the backend loses no acknowledged write; n·c is at most the
// capacity (else each process admits one such request per refill of the
// whole capacity); the fallback store evicts no key (the default one
// tells when it does: see Store.FallbackEvictions); for the window
// algorithms, the process's and the backend's clocks agree. With n below
// the real count N, the fallbacks' share is multiplied by N/n. A Fleet
// whose size shrinks from N by k gives the remaining processes larger
// shares while the departed ones' takes may still count: the window,
// Period or burst holding the shrink may admit k·B/N more, once per
// shrink.
//
// A local deny cache remembers denials: a key denied until T for cost c is
// denied locally for cost c until T, without a backend call, so an abusive
// client costs the backend nothing while it is blocked. This is exact for
// all six algorithms: without new takes, what a key admits only grows with
// time, and takes by anyone only delay it further, so the backend itself
// would deny that request until T. Entries are per cost (a larger cost must
// wait longer than T), dropped when this Store takes from the key, and
// anchored at the time the request was sent, so they never outlast the
// backend's own deadline. Options.DenyCacheSize bounds them, and
// Options.DenyCacheFor how long a key's are kept.
//
// One limit on that exactness: a backend whose TakeAll is not atomic (the
// Redis store's cross-slot path on a Cluster takes, then refunds) can deny
// a key while another request briefly holds units it later gives back. The
// cached denial then outlasts reality, by at most its RetryAfter.
//
// # In-flight slots
//
// A Store whose backend implements sluice.Slots implements it too, under
// the same timeout, breaker, logs and Observer events (ops "acquire",
// "extend", "release"). In-flight denials are never cached: a slot can
// free at any instant. When the backend fails or the breaker is open,
// FailOpen admits (holding nothing), FailClosed denies, and FallbackLocal
// acquires in the fallback store against a 1/n share of Max, n the fleet
// size as above: a weight w is charged as w·n against Max, or all of Max
// when w·n is larger. Each process's fallback thus holds at most
// max(⌊Max/n⌋, 1) weight at once, or one heavier request alone. With n at
// least the real number of processes and requests of weight 1, the fleet
// holds at most what the backend holds plus n such shares: at most
// Max + n·max(⌊Max/n⌋, 1), which is 2·Max or less while n ≤ Max.
//
// A holder remembers where it was granted: Extend and Release of a holder
// the policy granted go to the fallback (or do nothing, under FailOpen),
// even after the backend is back; every other holder's go to the backend,
// and while it cannot be reached they fail with ErrSlotUnreachable. Such a
// lost Release, and an Acquire that timed out here but still ran on the
// backend, hold the backend's slot until its hold timeout: the backend's
// "never more than Max" then counts them until they expire.
package resilient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ctxutil"
	"github.com/sluicehq/sluice/internal/enum"
	"github.com/sluicehq/sluice/memory"
)

var (
	_ sluice.Store        = (*Store)(nil)
	_ sluice.MultiStore   = (*MultiStore)(nil)
	_ sluice.Regranter    = (*Store)(nil) // grant.go
	_ sluice.Regranter    = (*MultiStore)(nil)
	_ sluice.GrantAller   = (*Store)(nil) // grant.go
	_ sluice.GrantAller   = (*MultiStore)(nil)
	_ sluice.Slots        = (*Store)(nil) // inflight.go
	_ sluice.LimitChecker = (*Store)(nil)
)

// Errors returned by this package. Test with errors.Is.
var (
	// ErrInvalidOptions: New was given a nil backend (or fallback), a nil
	// pointer as one, a fallback never built, or an option out of range.
	ErrInvalidOptions = errors.New("resilient: invalid options")
	// ErrTimeout: the backend did not answer within Options.Timeout. It
	// reaches the Observer (StoreEvent.Err); callers get the failure
	// policy's decision instead.
	ErrTimeout = errors.New("resilient: backend timeout")
	// ErrUnknownPolicy: ParsePolicy was given an unknown name.
	ErrUnknownPolicy = errors.New("resilient: unknown failure policy")
	// ErrZeroStore: the Store or MultiStore is a zero value, not one made
	// by New or NewMulti. It wraps sluice.ErrStoreNotBuilt.
	ErrZeroStore = fmt.Errorf("resilient: zero Store: make one with New: %w", sluice.ErrStoreNotBuilt)
	// ErrNoSlots: the backend (or the fallback, under FallbackLocal) does
	// not implement sluice.Slots.
	ErrNoSlots = errors.New("resilient: store keeps no in-flight slots")
	// ErrSlotUnreachable: Extend or Release of a slot the backend granted
	// could not reach the backend (it failed, or the breaker is open). A
	// lost Release frees the slot at its hold timeout; a lost Extend does
	// not extend it.
	ErrSlotUnreachable = errors.New("resilient: backend unreachable for a slot it granted")
)

// Policy is what a Store does when its backend fails or its breaker is open.
type Policy uint8

const (
	// FallbackLocal enforces the same limits in a local store, each divided
	// by Options.Nodes, until the backend is back. The zero value.
	FallbackLocal Policy = iota
	// FailOpen allows every request, reporting what a fresh key would:
	// Remaining is the capacity less the cost, and ResetAfter the time
	// those units take to come back (cost × Interval for GCRA and the
	// buckets, Period for the sliding window log, to the end of the window
	// for the fixed window and to the end of the next for the sliding
	// window counter). A Peek reports the capacity and no ResetAfter.
	FailOpen
	// FailClosed denies every request, with RetryAfter set to
	// Options.ProbeInterval.
	FailClosed
)

var policyNames = []string{"local", "open", "closed"}

// String returns the policy's config name: "local", "open" or "closed".
func (p Policy) String() string { return enum.String(policyNames, p, "Policy") }

// ParsePolicy parses a config name: "local" (or "fallback"), "open" (or
// "fail-open"), "closed" (or "fail-closed").
func ParsePolicy(s string) (Policy, error) {
	switch strings.ReplaceAll(strings.ToLower(strings.TrimSpace(s)), "_", "-") {
	case "local", "fallback", "fallback-local":
		return FallbackLocal, nil
	case "open", "fail-open":
		return FailOpen, nil
	case "closed", "fail-closed":
		return FailClosed, nil
	}
	return 0, fmt.Errorf("%w: %q (want local, open or closed)", ErrUnknownPolicy, s)
}

// MarshalText implements encoding.TextMarshaler.
func (p Policy) MarshalText() ([]byte, error) { return []byte(p.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParsePolicy.
func (p *Policy) UnmarshalText(b []byte) error { return enum.Unmarshal(b, ParsePolicy, p) }

// DefaultTimeout is Options.Timeout when none is set: long enough for a
// Redis round trip under load, short enough that a dead Redis does not
// stall requests.
const DefaultTimeout = 50 * time.Millisecond

// Options configures a Store. A nil *Options gives every default.
type Options struct {
	// Name labels this store in Observer events. Default: "store".
	Name string

	// Policy applies when the backend fails or the breaker is open.
	// Default: FallbackLocal.
	Policy Policy

	// Timeout bounds each backend call. When it passes, the policy answers
	// at once; the abandoned call may still complete on the backend (a
	// Take may then count). Set the Redis client's ContextTimeoutEnabled so
	// that it stops too. Default: 50ms.
	Timeout time.Duration

	// TrustContext runs backend calls in the caller's goroutine, bounded
	// only by the context deadline. That saves a goroutine hand-off per
	// call, but the Timeout then holds only if the backend honours
	// contexts: for go-redis, set ContextTimeoutEnabled on the client.
	// Default: false, a separate goroutine bounds every call whatever the
	// backend does.
	TrustContext bool

	// Nodes is the expected number of processes sharing the limits: an
	// explicit setting, which wins over Fleet. Under FallbackLocal each
	// process admits a 1/Nodes share of every limit (see "Bounds when the
	// backend fails" in the package doc), so the fleet as a whole stays
	// within its stated bound. Default: Fleet's size, or 1 without a Fleet.
	Nodes int

	// Fleet, when set and Nodes is not, supplies the number of processes
	// sharing the limits, discovered through the backend (see NewFleet)
	// and read at every fallback decision. The Store does not own it:
	// Close it after the Store. Default: none.
	Fleet *Fleet

	// Fallback is the local store for FallbackLocal. For a MultiStore it
	// must implement sluice.MultiStore. Default: a memory.Store on Clock
	// of FallbackMaxKeys keys that the Store owns and closes in Close,
	// and whose evictions it reports (see FallbackEvictions).
	Fallback sluice.Store

	// FallbackMaxKeys bounds the keys of the default Fallback
	// (memory.Options.MaxKeys). Default: memory.DefaultMaxKeys.
	FallbackMaxKeys int

	// FailureRate opens the breaker when at least this share of the
	// backend calls in the last Window failed (timeouts included), once
	// there were at least MinCalls: a slow backend that times out now and
	// then is not a dead one, and its calls keep going to it. Default: 0.5.
	FailureRate float64

	// MinCalls is how many calls Window must hold before FailureRate
	// applies. Default: 20.
	MinCalls int

	// Window is the span FailureRate is measured over, kept in ten slices
	// of a tenth each. Default: 10s.
	Window time.Duration

	// DeadAfter opens the breaker at once, whatever the rate, when every
	// backend call sent over this long failed (at least FailureThreshold
	// of them in a row): a backend that refuses connections or stopped
	// answering. Calls are timed by when they were sent, so a process that
	// stalls does not mistake its own pause for a dead backend. Default:
	// 500ms, so that a dead backend under load opens the breaker within a
	// second (the Timeout included).
	DeadAfter time.Duration

	// FailureThreshold is the fewest consecutive failures DeadAfter needs.
	// Default: 3.
	FailureThreshold int

	// ProbeInterval is how long the breaker stays open before one call is
	// let through to probe the backend, lengthened by up to a quarter at
	// random so that probes do not fall in step with a backend that stalls
	// periodically. Default: 1s.
	ProbeInterval time.Duration

	// CloseAfter is how many probes in a row must succeed to close the
	// breaker (half-open lets one call through at a time, the next as soon
	// as the last one answers); a failed probe opens it for another
	// ProbeInterval. Closing also forgets the Window's failures, so
	// reopening needs new evidence. Default: 3.
	CloseAfter int

	// Logger receives one line per breaker transition (those that switch
	// the failure policy on and off name it), and one for the decisions the
	// policy answered while the breaker stayed closed, at most once a minute
	// (see the package doc). Default: slog.Default(); for none, pass
	// slog.New(slog.DiscardHandler).
	Logger *slog.Logger

	// Cause, if set, names the kind of a backend failure in the breaker's
	// transition lines: a cause attribute beside the error, such as
	// promsluice.Options.Cause gives sluice_store_errors_total, so that
	// the line names what the metrics do ("stalled", "unreachable").
	// Called once per line, not per call. Default: none.
	Cause func(error) string

	// DenyCacheSize bounds the deny cache's entries. Default: 100,000. A
	// negative value disables the cache. Cached denials are exact unless
	// the backend refunds units after the fact (a non-atomic TakeAll, as
	// redisstore's on a Cluster across hash slots); then a denial may be
	// repeated for up to its RetryAfter after the units are back.
	DenyCacheSize int

	// DenyCacheFor, when set, bounds how long a denial of key under limit
	// is remembered, when it returns a duration above zero: a Reset on
	// another process, which the cache cannot see, then reaches this one
	// within that time. A lease store over this Store passes its maximum
	// staleness D, so that a leased key's Reset takes effect within D
	// (package lease) on requests it sends here too. It is called once per
	// cached denial and must be safe for concurrent use. Default: nil, a
	// denial is remembered until its RetryAfter.
	DenyCacheFor func(key string, limit sluice.Limit) time.Duration

	// Observer receives store events and breaker changes. Default: none.
	Observer sluice.Observer

	// Clock returns the current time, for the deny cache, the breaker and
	// the default Fallback (a Fallback given here keeps its own clock).
	// Default: time.Now (the default Fallback's own clock, monotonic).
	Clock func() time.Time
}

// Store is a sluice.Store that applies a failure policy around a backend
// store. Build one with New (or NewMulti for layered limits) and Close it
// when done. It is safe for concurrent use.
//
// Each decision's Source says who answered: the backend's decisions pass
// through as they are, the others are marked SourceDenyCache,
// SourceFallback, SourceFailOpen or SourceFailClosed.
//
// Bad input (sluice.ValidateRequest fails, or the backend refuses the call
// with one of package sluice's bad-input errors: ErrInvalidLimit, ErrInvalidKey,
// ErrInvalidCost, ErrCostExceedsBurst, ErrGrantUnsupported, ErrInvalidReturn,
// ErrInvalidWeight, ErrInvalidHolder) is returned as the backend would
// return it and never counts as a backend failure. A lease store's
// lease.ErrInvalidStaleness is one: it wraps sluice.ErrInvalidLimit. So is a
// backend's refusal because it was built without what it needs
// (sluice.ErrStoreNotBuilt, as redisstore.ErrNoClient; memory.ErrZeroStore),
// or closed by its owner (sluice.ErrStoreClosed, as redisstore's error for
// a closed client): no policy answers for a backend that can never work. When the caller's
// context ends, the error wraps the context's error and no policy applies;
// a call whose context has ended before it is made gets that error from
// every method, whatever the breaker's state, and a deny-cache hit too
// (the caller is gone: one answer for all paths).
// Otherwise errors are the fallback store's own failures only.
//
// The zero value, a nil *Store and a zero or nil *MultiStore refuse every call
// with ErrZeroStore (AbandonSlot, Probe and ProbeNow do nothing); their
// State is closed and their Close does nothing.
type Store struct {
	backend  sluice.Store
	fallback sluice.Store
	owned    *memory.Store // the default fallback, closed by Close
	name     string
	policy   Policy
	timeout  time.Duration
	inline   bool
	nodes    int64  // Options.Nodes; 0: ask fleet
	fleet    *Fleet // nil: nodes, or 1
	probe    time.Duration
	observer sluice.Observer
	clock    func() time.Time
	br       breaker // the whole store's, or its keys' of no known partition
	// parter is the backend as a sluice.Partitioner, nil if it is not;
	// parts the breakers of its partitions (partition.go), made with opts.
	parter sluice.Partitioner
	parts  atomic.Pointer[map[string]*breaker]
	partMu sync.Mutex
	opts   Options
	cache  *denyCache  // nil when disabled
	evict  *evictWatch // the owned fallback's evictions; nil without one
	slots  policySlots // holders the policy granted (inflight.go)
	sent   policySlots // holders whose backend Acquire failed: it may have run (AbandonSlot)
	closed atomic.Bool // Close was called
}

// MultiStore is a Store over a sluice.MultiStore backend: it also checks
// layered limits all-or-nothing with TakeAll.
type MultiStore struct {
	*Store
	multi   sluice.MultiStore
	fbMulti sluice.MultiStore
}

// New returns a Store applying opts around backend. A nil backend, or a
// nil pointer as backend or Options.Fallback, is refused with
// ErrInvalidOptions, as is a fallback that was never built (a zero
// memory.Store: see sluice.CheckBuilt), which would fail every call of an
// outage. A misbuilt backend fails every call with its own error (below). Options.Observer receives the breaker's initial state
// at once (see sluice.Observer.ObserveBreaker).
func New(backend sluice.Store, opts *Options) (*Store, error) {
	s, err := build(backend, opts)
	if err != nil {
		return nil, err
	}
	s.br.announce()
	return s, nil
}

// build is New without announcing the breaker.
func build(backend sluice.Store, opts *Options) (*Store, error) {
	if isNil(backend) {
		return nil, fmt.Errorf("%w: nil backend %T", ErrInvalidOptions, backend)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	var unbuilt error
	if o.Fallback != nil && !isNil(o.Fallback) {
		unbuilt = sluice.CheckBuilt(o.Fallback)
	}
	switch {
	case o.Fallback != nil && isNil(o.Fallback):
		return nil, fmt.Errorf("%w: nil fallback %T", ErrInvalidOptions, o.Fallback)
	case unbuilt != nil:
		// It would answer nothing, and only an outage would show it.
		return nil, fmt.Errorf("%w: fallback: %w", ErrInvalidOptions, unbuilt)
	case o.Policy > FailClosed:
		return nil, fmt.Errorf("%w: unknown policy %d", ErrInvalidOptions, o.Policy)
	case o.Timeout < 0:
		return nil, fmt.Errorf("%w: negative timeout %v", ErrInvalidOptions, o.Timeout)
	case o.Nodes < 0:
		return nil, fmt.Errorf("%w: negative node count %d", ErrInvalidOptions, o.Nodes)
	case o.FallbackMaxKeys < 0:
		return nil, fmt.Errorf("%w: negative FallbackMaxKeys %d", ErrInvalidOptions, o.FallbackMaxKeys)
	case o.FailureThreshold < 0:
		return nil, fmt.Errorf("%w: negative failure threshold %d", ErrInvalidOptions, o.FailureThreshold)
	case o.ProbeInterval < 0:
		return nil, fmt.Errorf("%w: negative probe interval %v", ErrInvalidOptions, o.ProbeInterval)
	case o.FailureRate < 0 || o.FailureRate > 1 || o.FailureRate != o.FailureRate:
		return nil, fmt.Errorf("%w: failure rate %v outside [0, 1]", ErrInvalidOptions, o.FailureRate)
	case o.MinCalls < 0 || o.CloseAfter < 0:
		return nil, fmt.Errorf("%w: negative call count", ErrInvalidOptions)
	case o.Window < 0 || o.DeadAfter < 0:
		return nil, fmt.Errorf("%w: negative breaker span", ErrInvalidOptions)
	}
	s := &Store{
		backend:  backend,
		fallback: o.Fallback,
		name:     orDefault(o.Name, "store"),
		policy:   o.Policy,
		timeout:  orDefault(o.Timeout, DefaultTimeout),
		inline:   o.TrustContext,
		nodes:    int64(o.Nodes),
		fleet:    o.Fleet,
		probe:    orDefault(o.ProbeInterval, time.Second),
		observer: o.Observer,
		clock:    o.Clock,
	}
	if s.clock == nil {
		s.clock = time.Now
	}
	s.br = newBreaker(&o, s.name)
	s.opts = o
	s.parter, _ = backend.(sluice.Partitioner)
	if o.DenyCacheSize >= 0 {
		s.cache = newDenyCache(orDefault(o.DenyCacheSize, 100_000), o.DenyCacheFor)
	}
	if s.policy == FallbackLocal && s.fallback == nil {
		s.owned = memory.New(&memory.Options{Clock: o.Clock, MaxKeys: o.FallbackMaxKeys})
		s.fallback = s.owned
		s.evict = newEvictWatch(s.owned, orDefault(o.Logger, slog.Default()), s.name, o.Observer)
	}
	return s, nil
}

// NewMulti returns a MultiStore applying opts around backend, as New does.
// Under FallbackLocal, opts.Fallback (if set) must be a sluice.MultiStore.
func NewMulti(backend sluice.MultiStore, opts *Options) (*MultiStore, error) {
	if isNil(backend) {
		return nil, fmt.Errorf("%w: nil backend", ErrInvalidOptions)
	}
	s, err := build(backend, opts)
	if err != nil {
		return nil, err
	}
	m := &MultiStore{Store: s, multi: backend}
	if s.policy == FallbackLocal {
		fb, ok := s.fallback.(sluice.MultiStore)
		if !ok {
			s.Close()
			return nil, fmt.Errorf("%w: fallback %T is not a sluice.MultiStore", ErrInvalidOptions, s.fallback)
		}
		m.fbMulti = fb
	}
	s.br.announce()
	return m, nil
}

// Close writes the pending line for decisions the failure policy answered
// while the breaker was closed, if any, and releases the default fallback
// store. The backend is the caller's to close. Every call made after Close
// fails with an error wrapping sluice.ErrStoreClosed, and no policy
// answers it: Probe and ProbeNow send no probe, and AbandonSlot sends no
// release (TryAbandonSlot returns the error when it had one to send).
func (s *Store) Close() error {
	if s == nil {
		return nil
	}
	s.closed.Store(true)
	for _, b := range s.breakers() {
		b.closed.flush()
	}
	if s.owned != nil {
		return s.owned.Close()
	}
	return nil
}

// Take implements sluice.Store.
func (s *Store) Take(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	ctx = ctxutil.OrBackground(ctx)
	return s.decide(ctx, "take", key, limit, cost, true)
}

// Peek implements sluice.Store. Peeks are answered from the deny cache too:
// a cached denial is what the backend would report.
func (s *Store) Peek(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	ctx = ctxutil.OrBackground(ctx)
	return s.decide(ctx, "peek", key, limit, cost, false)
}

// refuse returns why a decision cannot be made at all: bad input, a zero
// Store, or ctx ended.
func (s *Store) refuse(ctx context.Context, op, key string, limit sluice.Limit, cost int64) error {
	if err := sluice.ValidateRequest(key, limit, cost); err != nil {
		return err
	}
	if s == nil || s.backend == nil {
		return ErrZeroStore
	}
	return s.ended(ctx, op)
}

func (s *Store) decide(ctx context.Context, op, key string, limit sluice.Limit, cost int64, take bool) (sluice.Decision, error) {
	if err := s.refuse(ctx, op, key, limit, cost); err != nil {
		return sluice.Decision{}, err
	}
	now := s.clock()
	s.evict.check(now)
	if s.cache != nil {
		if d, ok := s.cache.get(key, limit, cost, now); ok {
			s.observe(op, key, sluice.SourceDenyCache, 0, nil)
			return d, nil
		}
	}
	b := s.breakerFor(key)
	call, tn := b.allow(now)
	if !call {
		return s.failOne(ctx, b, op, key, limit, cost, take, 0, nil, false)
	}
	fn := s.backend.Peek
	if take {
		fn = s.backend.Take
	}
	d, lat, err := bounded(ctx, s.timeout, s.inline, func(ctx context.Context) (sluice.Decision, error) {
		return fn(ctx, key, limit, cost)
	})
	if err == nil {
		s.answered(b, tn, now, take && d.Allowed)
		if s.cache != nil {
			switch {
			case !d.Allowed && d.Source != sluice.SourceFailClosed: // a wrapped resilient store's made-up denial is no state
				s.cache.put(key, limit, cost, d, now)
			case take:
				s.cache.forget(key, limit)
			}
		}
		s.observe(op, key, sluice.SourceBackend, lat, nil)
		return d, nil
	}
	if err := s.callerFault(ctx, op, err, gate{b, tn}); err != nil {
		return sluice.Decision{}, err
	}
	b.failure(tn, now, s.clock(), err)
	return s.failOne(ctx, b, op, key, limit, cost, take, lat, err, false)
}

// failOne answers one request by the policy, for key's breaker b. berr is the backend's error,
// nil when the breaker kept the backend from being called; reported: it
// is an earlier lease call's, which that call's event reported
// (sluice.StoreEvent.Reported).
func (s *Store) failOne(ctx context.Context, b *breaker, op, key string, limit sluice.Limit, cost int64, take bool, lat time.Duration, berr error, reported bool) (sluice.Decision, error) {
	b.policyAnswered(berr)
	src := sluice.SourceFallback
	switch s.policyNow() {
	case FailOpen:
		src = sluice.SourceFailOpen
	case FailClosed:
		src = sluice.SourceFailClosed
	}
	if s.observer != nil {
		s.observer.ObserveStore(sluice.StoreEvent{Store: s.name, Op: op, Key: key, Source: src, Latency: lat, Err: berr, Reported: reported})
	}
	switch src {
	case sluice.SourceFailOpen:
		return openDecision(limit, cost, take, s.clock()), nil
	case sluice.SourceFailClosed:
		return s.closedDecision(limit), nil
	}
	n := s.fleetSize()
	fn := s.fallback.Peek
	if take {
		fn = s.fallback.Take
	}
	d, err := fn(ctx, key, limit, localCost(limit, cost, n))
	s.evict.check(s.clock())
	if err != nil {
		return sluice.Decision{}, err
	}
	return share(d, limit, n, cost), nil
}

// fleetSize is how many processes share each limit: Nodes, else the
// Fleet's size, else 1.
func (s *Store) fleetSize() int64 {
	switch {
	case s.nodes > 0:
		return s.nodes
	case s.fleet != nil:
		return max(int64(s.fleet.Size()), 1)
	}
	return 1
}

// policyNow is the policy that answers now: FallbackLocal takes a share
// only while Nodes is set or the Fleet counts this process
// (Fleet.Counted), and refuses as FailClosed otherwise.
func (s *Store) policyNow() Policy {
	if s.policy == FallbackLocal && s.nodes == 0 && s.fleet != nil && !s.fleet.Counted() {
		return FailClosed
	}
	return s.policy
}

// localCost is what the fallback charges for cost units when n processes
// share limit: cost × n against the whole limit, so that n processes
// admit one limit between them. The fallback's state stays in units of the
// whole limit, so a change of n (a fleet growing or shrinking) keeps it:
// dividing the limit instead would read the key's state under another
// limit, of other burst and interval. Where cost × n exceeds the
// capacity, the capacity is charged: each process then admits at most one
// such request per refill of the whole capacity.
func localCost(limit sluice.Limit, cost, n int64) int64 {
	return scaled(limit.Capacity(), cost, n)
}

// scaled is cost × n, or capacity where that is larger.
func scaled(capacity, cost, n int64) int64 {
	if cost > capacity/n {
		return capacity
	}
	return cost * n
}

// share reports a fallback decision in the caller's units: this process's
// share of the limit and of what remains.
func share(d sluice.Decision, limit sluice.Limit, n, cost int64) sluice.Decision {
	d.Limit = localLimit(limit, n, cost)
	d.Remaining /= n
	d.Source = sluice.SourceFallback
	return d
}

// openDecision is what FailOpen reports: the decision a store makes on a
// fresh key at now, exactly as the memory store's. A take reports the
// time its units take to come back as ResetAfter, not 0: the rate-limit
// headers would otherwise tell the client its budget is whole again at
// once (t=0) right after a unit was notionally taken. A peek takes
// nothing, so the key stays fresh.
func openDecision(limit sluice.Limit, cost int64, take bool, now time.Time) sluice.Decision {
	d := sluice.Decision{Allowed: true, Limit: limit, Remaining: limit.Capacity(), Source: sluice.SourceFailOpen}
	if take {
		d.Remaining -= cost
		d.ResetAfter = freshReset(limit, cost, now)
	}
	return d
}

// freshReset is ResetAfter after cost units (at least 1) are taken from a
// fresh key at now: what the memory store's algorithms compute (see
// memory/*.go). The windows are calendar windows of Period from the Unix
// epoch, in µs, as there.
func freshReset(limit sluice.Limit, cost int64, now time.Time) time.Duration {
	period := limit.Period.Microseconds()
	into := now.UnixMicro() % period
	if into < 0 {
		into += period
	}
	switch limit.Algorithm {
	case sluice.FixedWindow: // to the end of the window the units count in
		return time.Duration(period-into) * time.Microsecond
	case sluice.SlidingWindowCounter: // they weigh on the next window too
		return time.Duration(2*period-into) * time.Microsecond
	case sluice.SlidingWindowLog: // the entries logged now leave after a period
		return limit.Period
	}
	return time.Duration(cost) * limit.Interval() // GCRA and the buckets: one interval per unit
}

func (s *Store) closedDecision(limit sluice.Limit) sluice.Decision {
	return sluice.Decision{Limit: limit, RetryAfter: s.probe, ResetAfter: s.probe, Source: sluice.SourceFailClosed}
}

// CheckLimit implements sluice.LimitChecker: ErrZeroStore for a zero
// Store, otherwise the backend's verdict on limit and, under FallbackLocal,
// the fallback's, when they are LimitCheckers (a lease store is). A limit
// they refuse would fail every call with the caller's error, never the
// policy's answer, so a Limiter or middleware built on s refuses it.
func (s *Store) CheckLimit(limit sluice.Limit) error {
	if s == nil || s.backend == nil {
		return ErrZeroStore
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if c, ok := s.backend.(sluice.LimitChecker); ok {
		if err := c.CheckLimit(limit); err != nil {
			return err
		}
	}
	if c, ok := s.fallback.(sluice.LimitChecker); ok {
		if err := c.CheckLimit(limit); err != nil {
			return fmt.Errorf("resilient: fallback: %w", err)
		}
	}
	return nil
}

// Reset implements sluice.Store. It resets the key on the backend (bounded
// by the timeout but not subject to the policy: a failure is returned), in
// the fallback store, and in this process's deny cache. Other processes'
// deny caches keep their entries until they expire.
func (s *Store) Reset(ctx context.Context, key string, limit sluice.Limit) error {
	ctx = ctxutil.OrBackground(ctx)
	if err := sluice.ValidateKey(key); err != nil {
		return err
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if s == nil || s.backend == nil {
		return ErrZeroStore
	}
	if err := s.ended(ctx, "reset"); err != nil {
		return err
	}
	if s.cache != nil {
		s.cache.forget(key, limit)
	}
	if s.fallback != nil {
		if err := s.fallback.Reset(ctx, key, limit); err != nil {
			return fmt.Errorf("resilient: reset fallback: %w", err)
		}
	}
	_, lat, err := bounded(ctx, s.timeout, s.inline, func(ctx context.Context) (struct{}, error) {
		return struct{}{}, s.backend.Reset(ctx, key, limit)
	})
	s.observe("reset", key, sluice.SourceBackend, lat, err)
	if err != nil {
		if cerr := s.backendClosed(err); cerr != nil {
			err = cerr
		}
		return fmt.Errorf("resilient: reset: %w", err)
	}
	return nil
}

// TakeAll implements sluice.MultiStore. When the deny cache answers for one
// request, nothing is taken and the verdicts for the others, which the
// backend was not asked about, report Remaining as for a fresh key; the
// same holds under FailOpen. On a deny-cache hit every verdict has Source
// SourceDenyCache.
func (m *MultiStore) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	ctx = ctxutil.OrBackground(ctx)
	s := m.store()
	for i, r := range reqs {
		if err := sluice.ValidateRequest(r.Key, r.Limit, r.Cost); err != nil {
			return nil, fmt.Errorf("request %d: %w", i, err)
		}
	}
	if s == nil || m.multi == nil {
		return nil, ErrZeroStore
	}
	if err := s.ended(ctx, "take_all"); err != nil {
		return nil, err
	}
	now := s.clock()
	s.evict.check(now)
	if s.cache != nil {
		hit := false
		out := make([]sluice.Decision, len(reqs))
		for i, r := range reqs {
			d, ok := s.cache.get(r.Key, r.Limit, r.Cost, now)
			if !ok {
				d = openDecision(r.Limit, r.Cost, false, now)
				d.Source = sluice.SourceDenyCache
			}
			hit = hit || ok
			out[i] = d
		}
		if hit {
			s.observe("take_all", "", sluice.SourceDenyCache, 0, nil)
			return out, nil
		}
	}
	gs, call := s.allowAll(reqs, now)
	if !call {
		return m.failAll(ctx, gs, reqs, 0, nil)
	}
	ds, lat, err := bounded(ctx, s.timeout, s.inline, func(ctx context.Context) ([]sluice.Decision, error) {
		if len(gs) == 1 || s.inline {
			return m.multi.TakeAll(ctx, reqs)
		}
		// A call spanning partitions ends a little before bounded gives up
		// on it, so that its error, which may name the partition it failed
		// on (sluice.KeyFailure), comes back to charge that one alone.
		cctx, cancel := context.WithTimeout(ctx, s.timeout-min(s.timeout/5, 10*time.Millisecond))
		defer cancel()
		ds, err := m.multi.TakeAll(cctx, reqs)
		if err != nil && ctx.Err() == nil && cctx.Err() != nil {
			err = fmt.Errorf("%w after %v: %w", ErrTimeout, s.timeout, err)
		}
		return ds, err
	})
	if err == nil && len(ds) != len(reqs) {
		err = fmt.Errorf("resilient: backend returned %d decisions for %d requests", len(ds), len(reqs))
	}
	if err == nil {
		for _, g := range gs {
			s.answered(g.b, g.t, now, allowedAll(ds))
		}
		if s.cache != nil {
			took := allowedAll(ds)
			for i, d := range ds {
				if !d.Allowed && d.Source != sluice.SourceFailClosed {
					s.cache.put(reqs[i].Key, reqs[i].Limit, reqs[i].Cost, d, now)
				} else if took {
					s.cache.forget(reqs[i].Key, reqs[i].Limit)
				}
			}
		}
		s.observe("take_all", "", sluice.SourceBackend, lat, nil)
		return ds, nil
	}
	if err := s.callerFault(ctx, "take_all", err, gs...); err != nil {
		return nil, err
	}
	return m.failAll(ctx, s.failedAll(gs, now, s.clock(), err), reqs, lat, err)
}

func allowedAll(ds []sluice.Decision) bool {
	for _, d := range ds {
		if !d.Allowed {
			return false
		}
	}
	return true
}

// failAll answers a TakeAll by the policy; gs are the breakers that kept
// it from the backend or were charged with its failure.
func (m *MultiStore) failAll(ctx context.Context, gs []gate, reqs []sluice.Request, lat time.Duration, berr error) ([]sluice.Decision, error) {
	s := m.Store
	for _, g := range gs {
		g.b.policyAnswered(berr)
	}
	out := make([]sluice.Decision, len(reqs))
	switch s.policyNow() {
	case FailOpen:
		s.observe("take_all", "", sluice.SourceFailOpen, lat, berr)
		now := s.clock()
		for i, r := range reqs {
			out[i] = openDecision(r.Limit, r.Cost, true, now)
		}
		return out, nil
	case FailClosed:
		s.observe("take_all", "", sluice.SourceFailClosed, lat, berr)
		for i, r := range reqs {
			out[i] = s.closedDecision(r.Limit)
		}
		return out, nil
	}
	s.observe("take_all", "", sluice.SourceFallback, lat, berr)
	n := s.fleetSize()
	local := make([]sluice.Request, len(reqs))
	for i, r := range reqs {
		local[i] = sluice.Request{Key: r.Key, Limit: r.Limit, Cost: localCost(r.Limit, r.Cost, n)}
	}
	ds, err := m.fbMulti.TakeAll(ctx, local)
	s.evict.check(s.clock())
	if err != nil {
		return nil, err
	}
	for i, r := range reqs {
		ds[i] = share(ds[i], r.Limit, n, r.Cost)
	}
	return ds, nil
}

func (s *Store) observe(op, key string, src sluice.Source, lat time.Duration, err error) {
	if s.observer != nil {
		s.observer.ObserveStore(sluice.StoreEvent{Store: s.name, Op: op, Key: key, Source: src, Latency: lat, Err: err})
	}
}

// bounded runs fn with a timeout. Unless inline, it runs fn in its own
// goroutine and stops waiting when the timeout passes, even if fn ignores
// its context (a stalled connection can).
func bounded[T any](ctx context.Context, timeout time.Duration, inline bool, fn func(context.Context) (T, error)) (T, time.Duration, error) {
	type result struct {
		v   T
		err error
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	start := time.Now()
	if inline {
		v, err := fn(cctx)
		if err != nil && ctx.Err() == nil && cctx.Err() != nil {
			err = fmt.Errorf("%w after %v: %w", ErrTimeout, timeout, err)
		}
		return v, time.Since(start), err
	}
	done := make(chan result, 1) // buffered: an abandoned fn must not leak blocked
	go func() {
		v, err := fn(cctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, time.Since(start), r.err
	case <-cctx.Done():
		var zero T
		if ctx.Err() != nil {
			return zero, time.Since(start), ctx.Err()
		}
		return zero, time.Since(start), fmt.Errorf("%w after %v", ErrTimeout, timeout)
	}
}

// isNil reports whether v is nil or a nil pointer (a typed nil store, whose
// every call would fail or panic).
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Func, reflect.Chan, reflect.Slice, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// badInput reports whether err is the caller's fault, not the backend's:
// the same call would fail again whatever the backend's health. A backend
// built wrong (sluice.ErrStoreNotBuilt) is one: no outage would ever end;
// so is one its owner closed (sluice.ErrStoreClosed).
func badInput(err error) bool {
	return errors.Is(err, sluice.ErrStoreNotBuilt) || errors.Is(err, sluice.ErrStoreClosed) ||
		errors.Is(err, sluice.ErrInvalidKey) || errors.Is(err, sluice.ErrInvalidLimit) ||
		errors.Is(err, sluice.ErrInvalidCost) || errors.Is(err, sluice.ErrCostExceedsBurst) ||
		errors.Is(err, sluice.ErrInvalidWeight) || errors.Is(err, sluice.ErrInvalidHolder) ||
		errors.Is(err, sluice.ErrGrantUnsupported) || errors.Is(err, sluice.ErrInvalidReturn)
}

// ended returns the error of a call whose context has already ended, as
// callerFault words it, or of one made after Close (sluice.ErrStoreClosed),
// and nil otherwise. It is checked before the deny cache, the breaker and
// the policy, so that such a call fails alike whatever would have
// answered it, and spends no probe.
func (s *Store) ended(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("resilient: %s: %w", op, err)
	}
	if s.closed.Load() {
		return fmt.Errorf("resilient: %s: %w", op, sluice.ErrStoreClosed)
	}
	return nil
}

// closedChecker is a backend that tells, with no round trip, that its
// client was closed by its owner (redisstore.Store).
type closedChecker interface{ CheckClosed() error }

// backendClosed returns err as the backend's closure when its client was
// closed, else nil. redisstore tells a closed Redis Cluster client at
// go-redis's first try, within microseconds; a backend that did not, as
// one whose client's retries (100–145 ms on a closed Cluster client) the
// timeout cuts first, leaves err silent on it: without asking, such
// calls would count as an outage and be answered by the policy.
func (s *Store) backendClosed(err error) error {
	c, ok := s.backend.(closedChecker)
	if !ok {
		return nil
	}
	if cerr := c.CheckClosed(); cerr != nil {
		return fmt.Errorf("%w: %w", cerr, err)
	}
	return nil
}

// callerFault returns the error to return as it is, with the probe
// released, when a failed backend call was the caller's doing (its context
// ended, bad input, or a backend whose client is closed), and nil when
// the backend failed.
func (s *Store) callerFault(ctx context.Context, op string, err error, gs ...gate) error {
	if cerr := ctx.Err(); cerr != nil {
		release(gs)
		return fmt.Errorf("resilient: %s: %w", op, cerr)
	}
	if badInput(err) {
		release(gs)
		return err
	}
	if cerr := s.backendClosed(err); cerr != nil {
		release(gs)
		return cerr
	}
	return nil
}

// release gives back the probes of gs.
func release(gs []gate) {
	for _, g := range gs {
		g.b.release(g.t)
	}
}

// localLimit is l divided among nodes, as a fallback decision reports it:
// Rate and Burst each divided (at least 1), and the capacity kept at least
// cost. If the result would not validate, l itself.
func localLimit(l sluice.Limit, nodes, cost int64) sluice.Limit {
	if nodes <= 1 {
		return l
	}
	d := l
	d.Rate = max(l.Rate/nodes, 1)
	windowed := l.Algorithm == sluice.FixedWindow || l.Algorithm == sluice.SlidingWindowLog || l.Algorithm == sluice.SlidingWindowCounter
	if windowed {
		d.Rate = max(d.Rate, cost)
		if l.Burst != 0 {
			d.Burst = d.Rate
		}
	} else {
		if l.Burst != 0 {
			d.Burst = max(l.Burst/nodes, 1)
		}
		if d.Capacity() < cost {
			d.Burst = cost
		}
	}
	if d.Validate() != nil {
		return l
	}
	return d
}

// orDefault returns v, or def when v is the zero value.
func orDefault[T comparable](v, def T) T {
	var zero T
	if v == zero {
		return def
	}
	return v
}
