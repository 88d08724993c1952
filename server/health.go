package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/tick"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// DefaultStoreCheckInterval is how often the service asks its store
// whether it answers (Options.StoreCheckInterval).
const DefaultStoreCheckInterval = time.Second

// Health is what this instance can do, as /readyz, /v1/status, gRPC
// health, the sluice_degraded gauge and the dashboard's banner report it.
//
// Ready means "this instance can answer decisions under its failure
// policy": with a failure policy (local, open, closed) it stays ready while
// the store is down, since the policy answers; without one (error) it is
// ready only while the store answers. Degraded means decisions are not
// what a healthy fleet would make: the store is down, or the failure
// policy is answering for it, or a Redis Cluster master fails the checks
// while the others pass them, or the memory store evicts keys.
//
// Every change is one log line and a metric. A nil *Health is always
// ready and never degraded. It is safe for concurrent use.
type Health struct {
	log        *slog.Logger
	policy     string // local, open, closed, or error
	withPolicy bool
	store      string // memory, redis, or custom
	probe      func(context.Context) error
	configured func() bool
	// live bounds a request's check of the store (liveCheck); 0 without
	// a watch.
	live time.Duration
	// quick asks the store, ahead of every check (quickCheck), without
	// retrying a dial or a command (quickPing); nil: none.
	quick func(context.Context) error
	// refusals ends a check early, with the error of a dial of the
	// store's client refused while it runs (refusedDials); nil: none.
	refusals func(context.Context) (context.Context, func() error)
	m        *healthMetrics
	// breaker sends the failure policy's breaker probe when one is due
	// (resilient.Store.Probe); nil without a policy. The watch calls it
	// after each check the store passed, so an instance no request
	// reaches still closes its breaker.
	breaker func(context.Context)
	// breakerNow probes every open breaker at once (resilient.Store.
	// ProbeNow): the watch calls it instead of breaker on the check that
	// finds the store back, so that no instance waits out a probe interval
	// after a failed probe (the fleet's stagger S, its r·S, shrinks).
	breakerNow func(context.Context)

	mu       sync.Mutex
	storeErr error // classified; nil while the store answers
	// since: while the store is lost, the start of the outage's earliest
	// evidence; else when it came back (or the service started).
	since time.Time
	// firstFail is the start of the earliest failed check or store call
	// since answeredAt, the start of the last check the store passed or
	// of the last call it answered (once a failure awaited): the watch
	// declares the store lost a check or more after its first failure,
	// and the outage is counted from there. failPending mirrors
	// !firstFail.IsZero() for callAnswered, off the lock.
	firstFail, answeredAt time.Time
	failPending           atomic.Bool
	fallback              bool
	openedBy              error // the call error that opened the breaker, while open
	// parts: the Redis Cluster masters (by address) whose own breakers
	// are open or half-open, each with the error that opened it: the
	// failure policy answers their keys, the others' decide on Redis.
	// Degraded while it has any.
	parts map[string]error
	// allParts: parts holds every known master, so the failure policy
	// answers every decision, as with the store's breaker open (see
	// partsLocked).
	allParts bool
	// masters: the Redis Cluster masters (by address) that fail the
	// service's checks while others pass them, each with its error
	// (classified) and since when. Degraded while it has any.
	masters map[string]failingMaster
	// known: the masters sluice_store_node_up has a series for.
	known map[string]bool
	// checks numbers the checks of the store as they start; applied is
	// the last one recorded. /readyz's checks run beside the watch's, and
	// one that started earlier but ended later (a dial retried through a
	// restart) must not undo a newer result.
	checks, applied uint64
	// partial: the failure policy has answered decisions whose store
	// calls failed while the breaker stayed closed and the store answered
	// the watch (a Cluster node down among live ones fails only its keys'
	// calls), without a pause of partialGap, for partialAfter; the last
	// at partialAt. Degraded until it ends (see decided and refresh).
	partial   bool
	runFrom   time.Time // the first failed call of the current run
	runLast   time.Time // its last
	runN      int64
	partialAt time.Time
	partialN  int64 // such decisions in the current episode
	runErr    error // the last failed call's error (classified), for the log and status
	// confirming: a check of the store runs before a partial failure
	// starts (confirmPartial).
	confirming bool
	// mastersBack counts the Cluster masters that passed the checks
	// again after failing them: the watch then probes every open breaker
	// at once (watchOnce).
	mastersBack atomic.Uint64
	// rechecking: a check runs because the breaker closed while the last
	// check had the store lost (recheckLocked).
	rechecking bool
	// failing: the policies whose store calls failed (a decision the
	// failure policy answered, a lease's or a slot's call), since the last
	// one Redis answered; cleared: Redis has answered the last of them
	// since the last failed call. A
	// partial failure with a permanent cause ends once both hold and no
	// call has failed for partialWindow (see answeredLocked).
	failing map[string]bool
	cleared bool
	// tracking mirrors len(failing) > 0, and answering the failure policy
	// answering while the breaker is open or the store lost, so that
	// decided takes no lock on the hot path.
	tracking, answering atomic.Bool
	// uncounted: under the local policy, the fleet does not count this
	// instance (resilient.Fleet.Counted), so the policy refuses;
	// registered: a registration was ever answered (else nobody ever
	// counted it).
	uncounted  bool
	registered bool
	grpc       *health.Server
	// setFallback mirrors FallbackActive into sluice_fallback_active.
	setFallback func(bool)
	// setStalled tells the metrics whether the store is down as stalled.
	setStalled func(bool)
	// connected reports whether the store accepted the client's last
	// connection: the last dial to addr (a Cluster master), or to any
	// node for ""; nil: unknown (see redisstore.WatchDials).
	connected func(addr string) bool
	// evicting is the reason while the memory store evicts keys (see
	// memoryWatch), "" otherwise: degraded, as the limits of the keys it
	// evicts start afresh, though still ready.
	evicting string
	// sentinel is the reason while a Sentinel client is on a master the
	// Sentinels replaced (see redisstore.FollowOptions.OnDegraded), "" otherwise.
	sentinel string
	// memory reads the memory store's figures for /v1/status, without
	// mu; nil without a memory store.
	memory func() *MemoryStatus
	// policyOf names the policy a store key is of ("" for none known), so
	// that a store call, a lease's or a slot's with no decision of its own,
	// tells which policy failed or was answered; nil: none known.
	policyOf func(key string) string
}

// healthOptions configures newHealth.
type healthOptions struct {
	log        *slog.Logger
	policy     string
	withPolicy bool
	store      string
	// probe asks the store whether it answers; nil for a store that
	// cannot fail (memory).
	probe      func(context.Context) error
	configured func() bool
	// live: Health.live.
	live time.Duration
	reg  *prometheus.Registry // nil: no metrics
}

func newHealth(o healthOptions) *Health {
	h := &Health{
		log: o.log, policy: o.policy, withPolicy: o.withPolicy, store: o.store, probe: o.probe,
		configured: o.configured, live: o.live, since: time.Now(),
	}
	if h.log == nil {
		h.log = slog.New(slog.DiscardHandler)
	}
	if o.reg != nil {
		h.m = newHealthMetrics(o.reg)
		h.m.storeUp.Set(1)
	}
	return h
}

type healthMetrics struct {
	degraded, storeUp prometheus.Gauge
	nodeUp            *prometheus.GaugeVec
	storeChanges      *prometheus.CounterVec
	fallbackChanges   *prometheus.CounterVec
	partialChanges    *prometheus.CounterVec
}

func newHealthMetrics(reg *prometheus.Registry) *healthMetrics {
	m := &healthMetrics{
		degraded:        newGauge("sluice_degraded", "1 while decisions are degraded: the store does not answer, or the failure policy answers for it, or a Redis Cluster master fails the checks (sluice_store_node_up), or the memory store evicts keys (each starting its limit afresh), or a Sentinel client is on a master the Sentinels replaced."),
		storeUp:         newGauge("sluice_store_up", "1 while the store (Redis) answers the service's checks."),
		storeChanges:    newCounterVec("sluice_store_transitions_total", "Store state changes: to=down (with the cause: unreachable, stalled, auth, tls, database, sentinel_master, permission, topology, version, replicas, oom, maxclients, resharding, not_replicated) or to=up.", "to", "cause"),
		fallbackChanges: newCounterVec("sluice_fallback_transitions_total", "Failure policy changes: to=on when the breaker opens (or the last Redis Cluster master's of all), to=off when it closes (or one master's).", "to"),
		partialChanges:  newCounterVec("sluice_partial_failure_transitions_total", "Partial store failures (store calls failing while the breaker stays closed and the store answers the checks): to=on with the cause (as sluice_store_transitions_total's) when one starts, to=off when it ends (a transient cause: 10s without a failed call; a permanent one: the store answering every policy that failed; or the breaker or a lost store taking over).", "to", "cause"),
		nodeUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_store_node_up",
			Help: "Redis Cluster only: 1 while the master (node: its address) passes the service's checks, 0 while it fails them (its keys' calls fail; the others' decide on Redis, unless all fail: sluice_store_up 0)."}, []string{"node"}),
	}
	reg.MustRegister(m.degraded, m.storeUp, m.storeChanges, m.fallbackChanges, m.partialChanges, m.nodeUp)
	m.fallbackChanges.WithLabelValues("on")
	m.fallbackChanges.WithLabelValues("off")
	m.partialChanges.WithLabelValues("off", "")
	m.storeChanges.WithLabelValues("up", "")
	return m
}

// causes names each kind of store failure in logs and metrics.
var causes = []struct {
	kind error
	name string
}{
	{redisstore.ErrAuth, "auth"},
	{redisstore.ErrDatabase, "database"},
	{redisstore.ErrTLS, "tls"},
	{redisstore.ErrSentinelMaster, "sentinel_master"},
	{redisstore.ErrPermission, "permission"},
	{redisstore.ErrTopology, "topology"},
	{redisstore.ErrVersion, "version"},
	{redisstore.ErrReplicas, "replicas"},
	{redisstore.ErrOOM, "oom"},
	{redisstore.ErrMaxClients, "maxclients"},
	// TRYAGAIN past the store's retries: a slot migration split a call's
	// keys, so not "unreachable".
	{redisstore.ErrResharding, "resharding"},
	// Answers PING but holds writes (CLIENT PAUSE ... WRITE): reachable,
	// so not "unreachable".
	{redisstore.ErrStalled, "stalled"},
	// A take WAIT found too few replicas for (wait_replicas): Redis
	// answered, so not "unreachable".
	{redisstore.ErrNotReplicated, "not_replicated"},
}

func cause(err error) string {
	for _, c := range causes {
		if errors.Is(err, c.kind) {
			return c.name
		}
	}
	return "unreachable"
}

// check asks the store whether it answers and records the result.
func (h *Health) check(ctx context.Context) error {
	n, start := h.startCheck(), time.Now()
	rctx, refused := h.watchRefusals(ctx)
	err := h.quickCheck(rctx)
	if err == nil {
		err = h.probe(rctx)
	}
	if r := refused(); r != nil && err != nil {
		err = r
	}
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return err // the caller left: nothing learned about the store
	}
	h.checked(n, start, err)
	return err
}

// startCheck numbers a check of the store as it starts.
func (h *Health) startCheck() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.checks++
	return h.checks
}

// storeResult records what a check of the store that just ended found.
func (h *Health) storeResult(err error) {
	if h == nil {
		return
	}
	h.checked(h.startCheck(), time.Now(), err)
}

// checked records what check n, which started at start, found, unless a
// check that started later was recorded already. A change (down, a new
// cause while down, up again) is logged once and counted.
func (h *Health) checked(n uint64, start time.Time, err error) {
	err = h.checkErr(err)
	h.mu.Lock()
	defer h.mu.Unlock()
	if n <= h.applied {
		return
	}
	h.applied = n
	// Some Cluster masters failing while others answer is the store up:
	// the failing ones are named, their keys' calls fail.
	var part *redisstore.PartialError
	if errors.As(err, &part) {
		err = nil
	}
	// After the store's own line, if any: a store back with a master
	// still failing says so in that order.
	defer h.mastersLocked(part, err)
	if err == nil {
		// The store answered after start: failures from before are not
		// of the next outage.
		if start.After(h.answeredAt) {
			h.answeredAt = start
		}
		if h.firstFail.Before(start) {
			h.firstFail = time.Time{}
			h.failPending.Store(false)
		}
	} else {
		h.failedAtLocked(start)
	}
	was := h.storeErr
	h.storeErr = err
	switch {
	case err == nil && was == nil:
		return
	case err != nil && was != nil && cause(err) == cause(was):
		return
	}
	// The metrics change before the line that announces it: a reader of
	// the line then finds them changed.
	if err == nil {
		now := time.Now()
		downFor := now.Sub(h.since)
		h.count("up", "")
		h.since = now
		h.publishLocked()
		h.log.Info("store back", "store", h.store, "down_for", downFor.Round(time.Millisecond))
		return
	}
	msg := "store still lost, another cause" // one outage: since and the down count stay
	if was == nil {
		msg = "store lost"
		h.endPartialLocked()
		h.count("down", cause(err))
		h.since = start
		if !h.firstFail.IsZero() && h.firstFail.Before(start) {
			h.since = h.firstFail
		}
		h.firstFail = time.Time{}
		h.failPending.Store(false)
	}
	h.publishLocked()
	h.log.Log(context.Background(), causeLevel(err), msg, "store", h.store, "cause", cause(err),
		"failure_policy", h.policy, "ready", h.readyLocked(), "err", err)
}

// failingMaster is a Redis Cluster master that fails the service's
// checks while others pass them.
type failingMaster struct {
	err   error // classified
	since time.Time
}

// mastersLocked records which Cluster masters fail the service's checks:
// those part names, or none when a check passed (err nil, part nil). A
// check that failed on every master (err) is the store lost, whose own
// line tells it: the masters then stay as they were. Each master that
// starts failing, changes cause or passes again is one line, and its
// sluice_store_node_up changes before it.
func (h *Health) mastersLocked(part *redisstore.PartialError, err error) {
	if err != nil {
		for a := range h.known {
			h.nodeUp(a, false)
		}
		return
	}
	var failed map[string]error
	var addrs []string
	if part != nil {
		failed, addrs = part.Failed, part.Addrs()
		for _, a := range part.Answered {
			h.knowLocked(a)
			h.nodeUp(a, true)
		}
	}
	now := time.Now()
	for _, a := range addrs {
		e := failed[a]
		was, ok := h.masters[a]
		if ok && cause(was.err) == cause(e) {
			h.masters[a] = failingMaster{e, was.since}
			continue
		}
		msg := "Redis Cluster master failing the service's checks: its keys' calls fail, the other masters' decide on Redis"
		since := now
		if ok {
			msg, since = "Redis Cluster master still failing the service's checks, another cause", was.since
		}
		if h.masters == nil {
			h.masters = map[string]failingMaster{}
		}
		h.masters[a] = failingMaster{e, since}
		h.knowLocked(a)
		h.nodeUp(a, false)
		h.publishLocked()
		h.log.Log(context.Background(), causeLevel(e), msg, "store", h.store, "node", a, "cause", cause(e),
			"failure_policy", h.policy, "err", e)
	}
	for a, fm := range h.masters {
		if _, still := failed[a]; still {
			continue
		}
		delete(h.masters, a)
		downFor := now.Sub(fm.since).Round(time.Millisecond)
		if (part != nil && !slices.Contains(part.Answered, a)) || (part == nil && !h.known[a]) {
			// A failover or a resharding took its slots: nothing of
			// sluice's is on it any more.
			h.forgetLocked(a)
			h.publishLocked()
			h.log.Info("Redis Cluster master failing the service's checks is no longer a master", "store", h.store, "node", a, "failed_for", downFor)
			continue
		}
		h.nodeUp(a, true)
		h.mastersBack.Add(1)
		h.publishLocked()
		h.log.Info("Redis Cluster master passes the service's checks again", "store", h.store, "node", a, "down_for", downFor)
	}
	if part == nil {
		for a := range h.known {
			h.nodeUp(a, true)
		}
	}
	h.partsLocked()
}

// setMasters records the Cluster's masters, by address, as a full check of
// Redis found them: sluice_store_node_up has a series for each, and for
// none else.
func (h *Health) setMasters(addrs []string) {
	if h == nil || len(addrs) == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for a := range h.known {
		if !slices.Contains(addrs, a) {
			h.forgetLocked(a)
		}
	}
	for _, a := range addrs {
		if !h.known[a] {
			h.knowLocked(a)
			_, failing := h.masters[a]
			h.nodeUp(a, !failing && h.storeErr == nil)
		}
	}
	h.partsLocked()
}

func (h *Health) knowLocked(addr string) {
	if h.known == nil {
		h.known = map[string]bool{}
	}
	h.known[addr] = true
}

// forgetLocked drops a master no longer in the slot map.
func (h *Health) forgetLocked(addr string) {
	delete(h.known, addr)
	if h.m != nil {
		h.m.nodeUp.DeleteLabelValues(addr)
	}
}

func (h *Health) nodeUp(addr string, up bool) {
	if h.m != nil {
		h.m.nodeUp.WithLabelValues(addr).Set(b2f(up))
	}
}

// mastersFailing reports whether some Cluster masters fail the service's
// checks.
func (h *Health) mastersFailing() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.masters) > 0
}

// failedAtLocked records a failed check or store call that started at t,
// unless the store answered a check started since: evidence of an outage
// the watch may not have declared yet.
func (h *Health) failedAtLocked(t time.Time) {
	if h.storeErr != nil || t.Before(h.answeredAt) {
		return
	}
	if h.firstFail.IsZero() || t.Before(h.firstFail) {
		h.firstFail = t
		h.failPending.Store(true)
	}
}

// callAnswered records a store call Redis answered, which took latency:
// a failure that started before it was an isolated one (a timeout under
// load, Redis answering the next calls), not an outage's first, as a
// check passed since would say. Without it, a timeout between two checks
// stayed the outage's start if Redis went before the next check. No lock
// unless a failure awaits.
func (h *Health) callAnswered(latency time.Duration) {
	if h == nil || !h.failPending.Load() {
		return
	}
	start := time.Now().Add(-latency)
	h.mu.Lock()
	defer h.mu.Unlock()
	if start.After(h.answeredAt) {
		h.answeredAt = start
	}
	if !h.firstFail.IsZero() && h.firstFail.Before(start) {
		h.firstFail = time.Time{}
		h.failPending.Store(false)
	}
}

// causeLevel is the level of a store failure's line: permanent causes are
// errors, since someone must change a setting.
func causeLevel(err error) slog.Level {
	if errors.Is(err, redisstore.ErrMisconfigured) || errors.Is(err, redisstore.ErrReplicas) || errors.Is(err, redisstore.ErrOOM) ||
		errors.Is(err, redisstore.ErrMaxClients) {
		return slog.LevelError
	}
	return slog.LevelWarn
}

func (h *Health) count(to, cause string) {
	if h.m != nil {
		h.m.storeChanges.WithLabelValues(to, cause).Inc()
	}
}

// partitionBreaker records the breaker of one Redis Cluster master's
// keys (resilient's per-partition breakers): on when it leaves closed,
// off when it closes. Unlike the store's own breaker, it leaves
// FallbackActive off (the failure policy answers only that master's
// keys) but the instance degraded, the master named in the status;
// unless every master's is open (partsLocked).
func (h *Health) partitionBreaker(partition string, on bool, why error) {
	if h == nil {
		return
	}
	if why != nil {
		why = h.callErrAt(why, partition)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	_, was := h.parts[partition]
	switch {
	case on && (why != nil || !was):
		if h.parts == nil {
			h.parts = map[string]error{}
		}
		h.parts[partition] = why
	case !on:
		delete(h.parts, partition)
	}
	if on != was {
		h.publishLocked()
		h.partsLocked()
	}
	if _, failing := h.masters[partition]; !on && was && failing {
		h.recheckLocked()
	}
}

// fallbackActive records the breaker: on when it leaves closed (the
// failure policy answers), off when it closes; why is the error of the
// call that opened it, which the status reports while it stays open (the
// store's probe may pass where decisions fail: an ACL user allowed the
// probe but not every command inside the scripts). Package resilient logs
// each transition (Options.Logger); this counts them and reports the
// state.
func (h *Health) fallbackActive(on bool, why error) {
	if h == nil {
		return
	}
	if why != nil {
		why = h.callErr(why)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if why != nil || !on {
		h.openedBy = why
	}
	if on == h.fallback {
		return
	}
	was := h.breakerOpenLocked()
	h.fallback = on
	h.fallbackChangedLocked(was)
	if !on && h.storeErr != nil {
		h.recheckLocked()
	}
}

// recheckLocked checks the store now, on a goroutine of its own: the
// breaker closed on probes Redis answered while the last check had the
// store lost (or a Cluster master's, that master failing), and until the
// watch's next check (a second later by default) /readyz, /v1/status,
// sluice_store_up and sluice_fallback_active (sluice_store_node_up) would
// tell the failure policy answering the decisions Redis answers.
func (h *Health) recheckLocked() {
	if h.probe == nil || h.rechecking {
		return
	}
	h.rechecking = true
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second) // the watch's
		defer cancel()
		h.check(ctx)
		h.mu.Lock()
		h.rechecking = false
		h.mu.Unlock()
	}()
}

// breakerOpenLocked reports whether breakers keep every decision off the
// store: the store's own, or every known Cluster master's.
func (h *Health) breakerOpenLocked() bool { return h.fallback || h.allParts }

// fallbackChangedLocked counts a change of breakerOpenLocked from was, and
// publishes it.
func (h *Health) fallbackChangedLocked(was bool) {
	on := h.breakerOpenLocked()
	if on == was {
		h.publishLocked()
		return
	}
	h.endPartialLocked()
	to := "off"
	if on {
		to = "on"
	}
	if h.m != nil {
		h.m.fallbackChanges.WithLabelValues(to).Inc()
	}
	h.publishLocked()
}

// partsLocked sets allParts: on once every master the checks know has
// its breaker open (a Cluster down, or in a failover that took every
// master), off when one closes or the checks find another master. The
// failure policy then answers every decision, so FallbackActive and
// sluice_fallback_active say so, as for the store's breaker: an alert on
// them must not miss a whole Cluster's. One line per change: package
// resilient logs each master's breaker, not all of them.
func (h *Health) partsLocked() {
	all := len(h.known) > 0
	for a := range h.known {
		if _, open := h.parts[a]; !open {
			all = false
			break
		}
	}
	if all == h.allParts {
		return
	}
	was := h.breakerOpenLocked()
	h.allParts = all
	if all {
		h.log.Warn("every Redis Cluster master's breaker is open: the failure policy answers every decision",
			"store", h.store, "masters", strings.Join(slices.Sorted(maps.Keys(h.known)), ","), "failure_policy", h.policy)
	} else {
		h.log.Info("not every Redis Cluster master's breaker is open any more: the closed ones' keys decide on Redis again",
			"store", h.store, "open", strings.Join(slices.Sorted(maps.Keys(h.parts)), ","), "masters", len(h.known))
	}
	h.fallbackChangedLocked(was)
}

// setGRPC makes g's health follow readiness, for the whole server and for
// the rate limit service.
func (h *Health) setGRPC(g *health.Server) {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.grpc = g
	h.publishLocked()
	h.mu.Unlock()
}

// rlsServiceName is the rate limit service's name for gRPC health.
const rlsServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// Partial failure: the failure policy answering decisions whose store
// calls failed, with the breaker closed and the store answering the watch,
// is degraded once such calls have gone on for partialAfter with no pause
// of partialGap or more (isolated timeouts, a slow command, do not count;
// a dead store opens the breaker sooner), or at the first one whose cause
// is permanent (causeLevel ERROR); until partialWindow passes without one
// (a transient cause), and the store has answered every policy that
// failed since (a permanent one: see decided).
const (
	partialWindow = 10 * time.Second
	partialAfter  = 2 * time.Second
	partialGap    = 500 * time.Millisecond
)

// failedCall records a decision the failure policy answered because its
// store call, for a key of policy ("" unknown), failed. With the breaker
// closed that is part of the store failing: degraded, logged once per
// episode.
func (h *Health) failedCall(now time.Time, policy string, err error) { h.failed(now, policy, err, 1) }

// failedOtherCall records a failed store call that answers no decision: a
// lease's grant, regrant or return (the requests that waited for it are
// answered by the failure policy, each reported with its error by
// resilient's TakeByPolicy, so failedCall counts them), or an in-flight
// slot's extend or release. A failed call as any other.
func (h *Health) failedOtherCall(now time.Time, policy string, err error) {
	h.failed(now, policy, err, 0)
}

// failed records a failed store call for a key of policy ("" unknown),
// for which the failure policy answered answered decisions.
func (h *Health) failed(now time.Time, policy string, err error, answered int64) {
	if h == nil {
		return
	}
	err = h.callErr(err)
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.breakerOpenLocked() || h.storeErr != nil || h.masterToldLocked(err) {
		return // the breakers or the watch tell this failure
	}
	h.runErr = err
	h.cleared = false
	if policy != "" {
		h.failingLocked(policy)
	}
	if h.partial {
		h.partialAt = now
		h.partialN += answered
		return
	}
	if h.runFrom.IsZero() || now.Sub(h.runLast) >= partialGap {
		h.runFrom, h.runN = now, 0
	}
	h.runLast = now
	h.runN += answered
	// A permanent cause (NOPERM, OOM, ...) will not pass on its own, and a
	// policy with little traffic never sustains a run: told at once.
	if now.Sub(h.runFrom) < partialAfter && causeLevel(err) < slog.LevelError {
		return
	}
	if h.probe == nil {
		h.startPartialLocked(now)
		return
	}
	// Partial only if the store as a whole still answers: a Redis that
	// refuses every connection (a password it no longer takes) is lost,
	// and its first line must say so. Checked now, not at the next tick.
	if !h.confirming {
		h.confirming = true
		go h.confirmPartial()
	}
}

// confirmPartial checks the store after calls failed: lost, the check's
// own line tells it; answering, the partial failure starts.
func (h *Health) confirmPartial() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	h.check(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.confirming = false
	if h.runErr == nil || h.partial || h.breakerOpenLocked() || h.storeErr != nil || h.masterToldLocked(h.runErr) {
		return // the run ended meanwhile, or another line tells it
	}
	h.startPartialLocked(h.runLast)
}

// masterToldLocked reports whether err, classified, has the cause of a
// Redis Cluster master failing the checks: calls failing so are that
// master's keys', which its own line and reason tell, and which end when
// it passes the checks again. As a partial failure of their own they
// would be told twice at the start and, for a permanent cause (OOM, an
// ACL), stay degraded for partialWindow after the master recovered.
func (h *Health) masterToldLocked(err error) bool {
	for _, fm := range h.masters {
		if cause(fm.err) == cause(err) {
			return true
		}
	}
	return false
}

// startPartialLocked starts a partial failure whose last failed call came
// at last.
func (h *Health) startPartialLocked(last time.Time) {
	err := h.runErr
	h.partial, h.partialAt, h.partialN = true, last, h.runN
	if h.m != nil {
		h.m.partialChanges.WithLabelValues("on", cause(err)).Inc()
	}
	h.publishLocked()
	h.log.Log(context.Background(), causeLevel(err), "store calls failing while the breaker is closed: the failure policy answers them (part of the store down, such as a Cluster node?)",
		"store", h.store, "cause", cause(err), "failure_policy", h.policy, "err", err)
}

// decided records who answered a decision of policy: the failure policy
// for a failed store call, or Redis (a lease included). A partial failure
// with a permanent cause ends on evidence, once Redis has answered every
// policy that failed, not on a quiet spell alone: a policy used less
// often than partialWindow would start and end one at each call. Nor on
// an answer alone: where only some of a policy's keys are refused (an ACL, a
// Cluster node whose user lacks a permission), its other keys' answers
// would end one at each, and the next refusal start another.
func (h *Health) decided(policy string, src sluice.Source) {
	if h == nil {
		return
	}
	switch src {
	case sluice.SourceFallback, sluice.SourceFailOpen, sluice.SourceFailClosed:
		if h.answering.Load() {
			return
		}
	case sluice.SourceBackend, sluice.SourceLease:
		if !h.tracking.Load() {
			return
		}
	default:
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.breakerOpenLocked() || h.storeErr != nil {
		return
	}
	switch src {
	case sluice.SourceFallback, sluice.SourceFailOpen, sluice.SourceFailClosed:
		h.failingLocked(policy)
	case sluice.SourceBackend, sluice.SourceLease:
		// A lease's units are a grant Redis answered: under a lease, that
		// is most of a policy's answers, a refill being fetched ahead.
		h.answeredByLocked(policy, time.Now())
	}
}

// storeAnswered records a store call Redis answered, for key: evidence
// that Redis answers its policy, as a decision is (decided), for the
// calls that answer none (a lease's grant or return, an in-flight slot's
// calls) and which alone may have started a partial failure.
func (h *Health) storeAnswered(key string) {
	if h == nil || !h.tracking.Load() || h.policyOf == nil {
		return
	}
	policy := h.policyOf(key)
	if policy == "" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.breakerOpenLocked() || h.storeErr != nil {
		return
	}
	h.answeredByLocked(policy, time.Now())
}

// failingLocked marks policy as one whose store call failed.
func (h *Health) failingLocked(policy string) {
	if h.failing == nil {
		h.failing = map[string]bool{}
	}
	h.failing[policy] = true
	h.tracking.Store(true)
}

// answeredByLocked records Redis answering policy at now.
func (h *Health) answeredByLocked(policy string, now time.Time) {
	if !h.failing[policy] {
		return
	}
	delete(h.failing, policy)
	h.tracking.Store(len(h.failing) > 0)
	h.cleared = len(h.failing) == 0
	h.answeredLocked(now)
}

// forget drops policies a reload removed: no call of theirs can end a
// partial failure any more.
func (h *Health) forget(policies []string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	var removed []string
	for _, p := range policies {
		if h.failing[p] {
			removed = append(removed, p)
			delete(h.failing, p)
		}
	}
	h.tracking.Store(len(h.failing) > 0)
	if len(removed) > 0 && len(h.failing) == 0 && h.partial && permanent(h.runErr) {
		// Nothing was answered: the line must not say the store was.
		runErr, n := h.runErr, h.partialN
		h.endPartialLocked()
		h.publishLocked()
		h.log.Info("store calls failing no more: a reload removed the policies whose calls failed", "store", h.store, "cause", cause(runErr),
			"removed", removed, "answered_by_policy", n)
	}
}

// answeredLocked ends a partial failure with a permanent cause once Redis
// has answered every policy that failed and no call has failed for
// partialWindow.
func (h *Health) answeredLocked(now time.Time) {
	if !h.partial || !permanent(h.runErr) || len(h.failing) > 0 || !h.cleared || now.Sub(h.partialAt) < partialWindow {
		return
	}
	runErr, n := h.runErr, h.partialN
	h.endPartialLocked()
	h.publishLocked()
	h.log.Info("store calls answered again", "store", h.store, "cause", cause(runErr), "since_last_failure", now.Sub(h.partialAt).Round(time.Millisecond), "answered_by_policy", n)
}

// permanent: a cause that does not pass until someone acts.
func permanent(err error) bool { return err != nil && causeLevel(err) >= slog.LevelError }

// callErr classifies a failed store call. A timeout is the store out of
// reach only if it refuses connections: one that accepts them holds its
// answer (writes paused, a long script, a stopped or frozen process).
// While the watch has the store lost, a timeout has the watch's cause:
// the breaker's reopenings and the errors' counts then say what the
// `store lost` line says.
func (h *Health) callErr(err error) error { return h.callErrAt(err, "") }

// callErrAt is callErr for a call to addr (a Cluster master; "" for any).
func (h *Health) callErrAt(err error, addr string) error {
	if h == nil || !callTimeout(err) {
		return redisstore.Classify(err)
	}
	err = fmt.Errorf("%w (%w)", err, context.DeadlineExceeded)
	h.mu.Lock()
	down := h.storeErr
	h.mu.Unlock()
	switch {
	case down != nil && errors.Is(down, redisstore.ErrStalled),
		down == nil && h.accepted(addr):
		return redisstore.Unanswered(err)
	}
	return redisstore.Classify(err)
}

// checkErr classifies a failed check of the store as callErr does a
// call: a timeout against a Redis that accepted the connection is a
// stall, not the store out of reach (a stopped Redis accepts connections
// and answers nothing; a killed one refuses them), so that the `store
// lost` line and the breaker's calls name one cause for one event. On a
// Cluster each failing master is judged by its own dials.
func (h *Health) checkErr(err error) error {
	err = redisstore.Classify(err)
	var part *redisstore.PartialError
	if errors.As(err, &part) {
		failed := make(map[string]error, len(part.Failed))
		for a, e := range part.Failed {
			failed[a] = h.unanswered(e, a)
		}
		return &redisstore.PartialError{Failed: failed, Answered: part.Answered}
	}
	return h.unanswered(err, "")
}

// unanswered is err, classified, as a stall if it is a timeout and addr
// ("" for any node) accepted the client's last connection.
func (h *Health) unanswered(err error, addr string) error {
	if errors.Is(err, redisstore.ErrUnreachable) && callTimeout(err) && h.accepted(addr) {
		return redisstore.Unanswered(err)
	}
	return err
}

// accepted reports whether addr ("" for any node) accepted the client's
// last connection; false when unknown.
func (h *Health) accepted(addr string) bool { return h.connected != nil && h.connected(addr) }

// callTimeout reports whether a store call failed for want of an answer in
// time: the failure policy's timeout, or a deadline in the client.
func callTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, resilient.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// refresh ends an episode of failing calls with a transient cause once
// partialWindow has passed without one, and one with a permanent cause
// once answered (answeredLocked); the watch calls it every check.
func (h *Health) refresh(now time.Time) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if permanent(h.runErr) {
		h.answeredLocked(now)
		return
	}
	if h.partial && now.Sub(h.partialAt) >= partialWindow {
		// No call failed for partialWindow; none on the failing keys need
		// have succeeded (a seldom-used policy refused by an ACL), so the
		// line says what is known.
		n := h.partialN
		h.endPartialLocked()
		h.publishLocked()
		h.log.Info("store calls no longer failing", "store", h.store, "since_last_failure", now.Sub(h.partialAt).Round(time.Millisecond), "answered_by_policy", n)
	}
}

// endPartialLocked ends the episode of failing calls, and the run that
// would start one: also when the breaker opens or closes or the store is
// lost, whose own lines then tell the state (failures from before do not
// add to a run after). An episode's end is counted however it ends, so
// that on less off is the episodes under way.
func (h *Health) endPartialLocked() {
	if h.partial && h.m != nil {
		h.m.partialChanges.WithLabelValues("off", "").Inc()
	}
	h.partial, h.partialN, h.runErr, h.cleared = false, 0, nil, false
	h.runFrom, h.runLast, h.runN = time.Time{}, time.Time{}, 0
	clear(h.failing)
	h.tracking.Store(false)
}

func (h *Health) degradedLocked() bool {
	return h.storeErr != nil || h.fallback || h.partial || h.uncounted || h.evicting != "" || h.sentinel != "" || len(h.parts) > 0 || len(h.masters) > 0
}

// setEvicting records the memory store evicting keys (a reason) or no
// longer ("").
func (h *Health) setEvicting(reason string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.evicting = reason
	h.publishLocked()
}

// setSentinel records the Sentinel client on a replaced master (a
// reason) or on the one announced ("").
func (h *Health) setSentinel(reason string) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sentinel = reason
	h.publishLocked()
}

// fleetCounted records whether the fleet counts this instance, and
// whether it ever registered; only the local policy depends on it.
func (h *Health) fleetCounted(counted, registered bool) {
	if h == nil || h.policy != "local" {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.uncounted, h.registered = !counted, registered
	h.publishLocked()
}

// answeringLocked reports whether the failure policy answers decisions:
// the breaker (or every Cluster master's) keeps them off the store, or
// the store does not answer.
func (h *Health) answeringLocked() bool {
	return h.withPolicy && (h.breakerOpenLocked() || h.storeErr != nil)
}

// policyAnswer says what the failure policy does with a decision.
func (h *Health) policyAnswer() string {
	switch {
	case !h.uncounted:
		return "failure policy " + h.policy + " decides"
	case h.registered:
		return "failure policy local refuses every decision: the fleet no longer counts this instance (its registration in Redis has failed for longer than the others keep counting it), until a registration succeeds"
	}
	return "failure policy local refuses every decision: this instance has never registered in the fleet, so no other instance counts it; it takes its share once Redis answers, or set --fleet-size to give it one without Redis"
}

func (h *Health) publishLocked() {
	h.answering.Store(h.breakerOpenLocked() || h.storeErr != nil)
	ready := h.readyLocked()
	if h.m != nil {
		h.m.degraded.Set(b2f(h.degradedLocked()))
		h.m.storeUp.Set(b2f(h.storeErr == nil))
	}
	if h.setFallback != nil {
		h.setFallback(h.answeringLocked())
	}
	if h.setStalled != nil {
		h.setStalled(errors.Is(h.storeErr, redisstore.ErrStalled))
	}
	if h.grpc != nil {
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if ready {
			st = healthpb.HealthCheckResponse_SERVING
		}
		h.grpc.SetServingStatus("", st)
		h.grpc.SetServingStatus(rlsServiceName, st)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

func (h *Health) readyLocked() bool {
	if h.configured != nil && !h.configured() {
		return false
	}
	return h.withPolicy || h.storeErr == nil
}

// StoreStatus is the store's part of Status.
type StoreStatus struct {
	// Kind is "memory", "redis" or "custom".
	Kind string `json:"kind"`
	// Up is true while the store answers the service's checks.
	Up bool `json:"up"`
	// Cause and Error say why it does not: Cause is one word (unreachable,
	// stalled, auth, tls, database, sentinel_master, permission, topology,
	// version, replicas, oom, maxclients, resharding, not_replicated),
	// Error Redis's one-sentence message.
	Cause string `json:"cause,omitempty"`
	Error string `json:"error,omitempty"`
	// Since is when Up last changed (or the service started); for a lost
	// store, when its outage's first failed check or store call started,
	// as the `store back` line's down_for counts.
	Since time.Time `json:"since"`
	// Memory is the in-process memory store, if there is one: the store
	// itself, or the local failure policy's.
	Memory *MemoryStatus `json:"memory,omitempty"`
}

// Status is the body of /v1/status.
type Status struct {
	// Ready: this instance can answer decisions under its failure policy.
	Ready bool `json:"ready"`
	// Degraded: decisions are not what a healthy fleet would make.
	Degraded bool `json:"degraded"`
	// Reasons explain Degraded and a false Ready, a sentence each.
	Reasons []string `json:"reasons"`
	// FailurePolicy is local, open, closed or error.
	FailurePolicy string `json:"failure_policy"`
	// FallbackActive: the failure policy answers decisions (the breaker
	// is open, or every Redis Cluster master's, or the store does not
	// answer).
	FallbackActive bool `json:"fallback_active"`
	// OpenPartitions names the Redis Cluster masters (by address) whose
	// own breakers are open or half-open: the failure policy answers
	// their keys while the other masters' keys decide on Redis
	// (FallbackActive stays false for that, unless every master's is
	// open).
	OpenPartitions []string `json:"open_partitions,omitempty"`
	// FailingMasters names the Redis Cluster masters (by address) that
	// fail the service's checks while the others pass them: their keys'
	// calls fail, the others' decide on Redis. Ready stays true: the store
	// is lost only when every master fails.
	FailingMasters []string    `json:"failing_masters,omitempty"`
	Store          StoreStatus `json:"store"`
	// Admin says whether admin endpoints (reset) are enabled, and how:
	// "token", "loopback", "insecure" or "disabled".
	Admin string `json:"admin"`
	// Config is the configuration in force and a rejected reload's errors
	// (set by the handler, not by Health).
	Config *ConfigStatus `json:"config,omitempty"`
}

// Status reports the current state.
func (h *Health) Status() Status {
	if h == nil {
		return Status{Ready: true, Reasons: []string{}, FailurePolicy: "local", Store: StoreStatus{Kind: "memory", Up: true}}
	}
	var mem *MemoryStatus
	if h.memory != nil {
		mem = h.memory() // before mu: it may record an episode's start or end
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	st := Status{
		Ready: h.readyLocked(), Degraded: h.degradedLocked(), Reasons: []string{},
		FailurePolicy: h.policy, FallbackActive: h.answeringLocked(),
		Store: StoreStatus{Kind: h.store, Up: h.storeErr == nil, Since: h.since, Memory: mem},
	}
	if h.configured != nil && !h.configured() {
		st.Reasons = append(st.Reasons, "no configuration is loaded")
	}
	if h.storeErr != nil {
		st.Store.Cause, st.Store.Error = cause(h.storeErr), h.storeErr.Error()
		if h.withPolicy {
			st.Reasons = append(st.Reasons, "the store does not answer ("+st.Store.Error+"): "+h.policyAnswer())
		} else {
			st.Reasons = append(st.Reasons, "the store does not answer ("+st.Store.Error+") and there is no failure policy: decisions fail")
		}
	}
	if h.fallback && h.storeErr == nil {
		why := ""
		if h.openedBy != nil {
			why = " (calls failed: " + cause(h.openedBy) + ": " + h.openedBy.Error() + ")"
		}
		until := " until a probe succeeds"
		if h.uncounted {
			until = ""
		}
		st.Reasons = append(st.Reasons, "the breaker is open"+why+": "+h.policyAnswer()+until)
	}
	for p := range h.parts {
		st.OpenPartitions = append(st.OpenPartitions, p)
	}
	slices.Sort(st.OpenPartitions)
	if parts := st.OpenPartitions; len(parts) > 0 && !h.fallback && h.storeErr == nil {
		why := ""
		if err := h.parts[parts[0]]; err != nil {
			err = h.shutdownNamedLocked(parts[0], err)
			why = " (calls failed: " + cause(err) + ": " + err.Error() + ")"
		}
		whose := "the breaker of Redis Cluster master " + parts[0] + " is open"
		if len(parts) > 1 {
			whose = "the breakers of Redis Cluster masters " + strings.Join(parts, ", ") + " are open"
		}
		if h.allParts {
			st.Reasons = append(st.Reasons, "the breakers of every Redis Cluster master ("+strings.Join(parts, ", ")+") are open"+why+": "+h.policyAnswer()+" for every decision until a probe succeeds")
		} else {
			st.Reasons = append(st.Reasons, whose+why+": for their keys, "+h.policyAnswer()+" until a probe succeeds; the other masters' keys decide on Redis")
		}
	}
	for a := range h.masters {
		st.FailingMasters = append(st.FailingMasters, a)
	}
	slices.Sort(st.FailingMasters)
	if ms := st.FailingMasters; len(ms) > 0 && h.storeErr == nil {
		err := h.masters[ms[0]].err
		whose, its := "Redis Cluster master "+ms[0]+" fails the service's checks ("+cause(err)+": "+err.Error()+"): ", "its"
		if len(ms) > 1 {
			whose, its = "Redis Cluster masters "+strings.Join(ms, ", ")+" fail the service's checks ("+ms[0]+": "+cause(err)+": "+err.Error()+"): ", "their"
		}
		then := its + " keys' decisions fail (no failure policy)"
		if h.withPolicy {
			then = its + " keys' calls fail, and for them " + h.policyAnswer()
		}
		st.Reasons = append(st.Reasons, whose+then+"; the other masters' keys decide on Redis")
	}
	if h.uncounted && !h.answeringLocked() {
		// Nothing answers by the policy now: say what it would do.
		st.Reasons = append(st.Reasons, "while Redis fails, "+h.policyAnswer())
	}
	if h.evicting != "" {
		st.Reasons = append(st.Reasons, h.evicting)
	}
	if h.sentinel != "" {
		st.Reasons = append(st.Reasons, h.sentinel)
	}
	if h.partial && !h.breakerOpenLocked() && h.storeErr == nil {
		why := "part of the store down?"
		if h.runErr != nil {
			why = cause(h.runErr) + ": " + h.runErr.Error()
		}
		st.Reasons = append(st.Reasons, fmt.Sprintf("store calls fail while the breaker is closed (%s): failure policy %s answered %d decisions, the last %v ago",
			why, h.policy, h.partialN, time.Since(h.partialAt).Round(time.Millisecond)))
	}
	return st
}

// shutdownNamedLocked is why, the error that opened master addr's
// breaker, its stall named as the shutdown the service's checks found
// that master in: a call cannot tell a shutdown from CLIENT PAUSE, the
// check asks INFO.
func (h *Health) shutdownNamedLocked(addr string, why error) error {
	if m, ok := h.masters[addr]; ok && redisstore.ShuttingDown(m.err) && errors.Is(why, redisstore.ErrStalled) {
		return redisstore.StalledOnShutdown(why)
	}
	return why
}

// ready answers /readyz and /v1/status. Without a failure policy it asks
// the store first, so the answer is current; with one, the store's state
// cannot change readiness, so the watch's last result serves.
func (h *Health) ready(ctx context.Context) Status {
	if h != nil && !h.withPolicy && h.probe != nil {
		h.liveCheck(ctx)
	}
	return h.Status()
}

// liveCheck is a request's check of the store. Under the service it is
// bounded by the decision timeout, so that a silent store cannot hold a
// probe past its own timeout, and one cut short by that bound learned
// nothing: the watch, which waits longer, tells a silent store. Without a
// watch (a handler's Ready) nothing else would, so it waits up to 2 s and
// records what it found.
func (h *Health) liveCheck(ctx context.Context) {
	if h.live <= 0 {
		ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		h.check(ctx)
		return
	}
	ctx, cancel := context.WithTimeout(ctx, h.live)
	defer cancel()
	n, start := h.startCheck(), time.Now()
	ctx, refused := h.watchRefusals(ctx)
	err, cut := h.quickCheck(ctx), false
	if err == nil {
		if cut = cutShort(ctx); !cut {
			err = h.probe(ctx)
			cut = err != nil && cutShort(ctx)
		}
	}
	// A refused dial is an answer, whatever the bound.
	if r := refused(); r != nil && (err != nil || cut) {
		err, cut = r, false
	}
	if !cut {
		h.checked(n, start, err)
	}
}

// watchRefusals returns ctx, ended early when a dial of the store's
// client is refused (refusals), and a func to call once the check is done,
// which returns that dial's error, nil if none.
func (h *Health) watchRefusals(ctx context.Context) (context.Context, func() error) {
	if h.refusals == nil {
		return ctx, func() error { return nil }
	}
	return h.refusals(ctx)
}

// quickCheck runs the quick ping, if any, and returns its error when it
// found Redis unreachable, else nil. The probe's client retries a refused
// dial, and then the command, for about a second, so a killed Redis went
// unheard by a request's check (cut short by its bound) and was told by
// the watch's a second late. Any other failure (maxclients refusing the
// ping's new connection while the pool's go on working) is the probe's
// to judge.
func (h *Health) quickCheck(ctx context.Context) error {
	if h.quick == nil {
		return nil
	}
	err := h.quick(ctx)
	if err == nil || cutShort(ctx) || cause(redisstore.Classify(err)) != "unreachable" {
		return nil
	}
	return err
}

// cutShort reports whether ctx has ended, or its deadline has passed
// though its timer has not fired yet: go-redis (ContextTimeoutEnabled) and
// redisstore end a call at the deadline itself, and on a loaded machine
// the timer runs late. Reading ctx.Err() alone, a live check cut short
// recorded a lost store (unreachable or stalled) with Redis up.
func cutShort(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// watch checks the store every interval until stop closes.
func (h *Health) watch(stop <-chan struct{}, interval time.Duration) {
	if h == nil || h.probe == nil {
		return
	}
	tick.Every(stop, interval, func() { h.watchOnce(interval) })
}

// watchOnce is one of the watch's checks, and the probes after it.
func (h *Health) watchOnce(interval time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), max(interval, time.Second))
	// A Cluster master that passes the checks again is Redis back for
	// its keys' breaker, as the store back is for every breaker.
	wasDown, backs := h.storeDown(), h.mastersBack.Load()
	err := h.check(ctx)
	h.refresh(time.Now())
	back := wasDown || h.mastersBack.Load() != backs
	switch {
	case err == nil && back && h.breakerNow != nil:
		h.breakerNow(ctx)
	case err == nil && h.breaker != nil:
		h.breaker(ctx)
	}
	cancel()
	if errors.Is(err, redisstore.ErrPartial) && h.breaker != nil {
		// The live masters' breakers are still probed, on a time of
		// their own: a stopped master held the check to its end.
		ctx, cancel := context.WithTimeout(context.Background(), max(interval, time.Second))
		if back && h.breakerNow != nil {
			h.breakerNow(ctx)
		} else {
			h.breaker(ctx)
		}
		cancel()
	}
}

// policyName names the failure policy in logs and /v1/status.
func policyName(o Options) string {
	if o.NoFailurePolicy {
		return "error"
	}
	return o.FailurePolicy.String()
}

// startCheckTimeout bounds the check of Redis at start, and each step
// after it (the access check, the warm-up); partialStartTimeout bounds
// those steps when some Cluster masters failed the check: a silent one
// would hold each to its end (5s more a step before the service starts),
// where the others answer in milliseconds, and the watch checks every
// master from then on.
const (
	startCheckTimeout   = 5 * time.Second
	partialStartTimeout = time.Second
)

// startTimeout bounds a step of the start after the check of Redis.
func (s *Server) startTimeout() time.Duration {
	if s.health.mastersFailing() {
		return partialStartTimeout
	}
	return startCheckTimeout
}

// checkRedis checks Redis at start: a misconfiguration (see
// redisstore.Check) is returned, to refuse the start; an unreachable Redis
// is a warning, and the health watch keeps checking. It then makes Health
// watch the client.
func (s *Server) checkRedis(c redis.UniversalClient) error {
	s.health.store = "redis"
	w := checkWarnings{every: recheckChecks * s.opts.StoreCheckInterval}
	_, cluster := c.(*redis.ClusterClient)
	s.health.probe = func(ctx context.Context) error {
		down := s.health.storeDown()
		// A master failing among live ones comes back usable too: the
		// full check while any does.
		if !down && !w.due(time.Now()) && (!cluster || !s.health.mastersFailing()) {
			if cluster {
				// A ping would go to one master, chosen at random:
				// CheckAccess (checkAccess) pings every one.
				return nil
			}
			// Bounded by ctx: c comes from newRedisClient, which sets
			// ContextTimeoutEnabled on every kind of client (a default
			// go-redis client would wait out its 5s ReadTimeout).
			return c.Ping(ctx).Err()
		}
		// Coming back must mean usable: the full check, not a ping;
		// its warnings logged as they change (a Redis back from a
		// failover or a restart may now evict keys), not again at each
		// back: a flapping Redis repeated them at every one. While up,
		// every recheckChecks-th check is the full one, for a CONFIG SET
		// made at runtime.
		rep, err := redisstore.Check(ctx, c)
		if rep != nil { // passed, or some Cluster masters did
			w.log(s.log, rep.Warnings, err == nil)
			s.health.setMasters(rep.Masters)
		}
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), startCheckTimeout)
	defer cancel()
	rep, err := redisstore.Check(ctx, c)
	if errors.Is(err, redisstore.ErrMisconfigured) {
		return err
	}
	if rep != nil {
		s.health.setMasters(rep.Masters)
	}
	if err != nil {
		// A timeout against a Redis that accepted the connection (the
		// check's dial, watched) is a stall, as it is after the start: a
		// stopped Redis was told as unreachable here, and in the metric
		// and /v1/status.
		classified := redisstore.Classify(err)
		err = s.health.checkErr(err)
		msg := "Redis unreachable at start; serving under the failure policy and retrying"
		switch {
		case errors.Is(err, redisstore.ErrPartial):
			msg = "some Redis Cluster masters fail at start; their keys' calls fail, the others' decide on Redis; retrying"
		case errors.Is(err, redisstore.ErrStalled) && !errors.Is(classified, redisstore.ErrStalled):
			msg = "Redis not answering at start (it accepts connections, but answers nothing in time: stopped, frozen, or behind a long command); serving under the failure policy and retrying"
		case errors.Is(err, redisstore.ErrStalled):
			msg = "Redis stalled at start (it answers, but a write does not complete); serving under the failure policy and retrying"
		case errors.Is(err, redisstore.ErrMaxClients):
			msg = "Redis refuses new connections at start (maxclients reached); serving under the failure policy and retrying"
		}
		s.log.Warn(msg, "failure_policy", s.health.policy, "every", s.opts.StoreCheckInterval, "err", err)
		s.health.storeResult(err)
		return nil
	}
	w.log(s.log, rep.Warnings, true)
	s.log.Info("Redis checked", "version", rep.Version, "cluster", rep.Cluster)
	return nil
}

// quickPing returns a check of c's Redis (standalone, or the master a
// Sentinel names) that neither retries a dial nor waits to retry a
// command, as c's client does for about a second: it pings on a client
// of its own, of one connection, and when that fails dials afresh, and
// returns that dial's error, or nil when the dial succeeds (the ping's
// connection may have been closed while it idled; and go-redis's pool,
// once a dial failed, fails the next for up to a second without
// dialing, so only a dial of its own is an answer). Nil for a Cluster,
// whose check asks every master (checkAccess).
func quickPing(c redis.UniversalClient) (ping func(context.Context) error, closeIt func()) {
	rc, ok := c.(*redis.Client)
	if !ok {
		return nil, func() {}
	}
	o := *rc.Options()
	o.MaxRetries, o.DialerRetries = -1, 1
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = 1, 0, 1, 0
	q := redis.NewClient(&o)
	redisstore.DetectRefusals(q)
	dial, network, addr := o.Dialer, o.Network, o.Addr
	return func(ctx context.Context) error {
		if q.Ping(ctx).Err() == nil {
			return nil
		}
		conn, err := dial(ctx, network, addr)
		if err != nil {
			return err
		}
		conn.Close()
		return nil
	}, func() { q.Close() }
}

// refusedDials returns Health.refusals for c (standalone, or the master a
// Sentinel names; nil for a Cluster, where one master refusing is not the
// store lost). A check whose call meets Redis killed mid-way gets no
// answer from go-redis for about a second: it retries the call, redials
// (refused, retried) and then fails each retry at once with the last dial
// error, until the check's own deadline, which then reads as a stall. The
// first refused redial, within milliseconds of the kill, is certain: this
// hook ends the checks under way with it.
func refusedDials(c redis.UniversalClient) func(context.Context) (context.Context, func() error) {
	rc, ok := c.(*redis.Client)
	if !ok {
		return nil
	}
	d := &dialRefusals{waits: map[*refusalWait]struct{}{}}
	rc.AddHook(d)
	return d.during
}

// dialRefusals is a go-redis hook that ends the checks under way when a
// dial is refused.
type dialRefusals struct {
	mu    sync.Mutex
	waits map[*refusalWait]struct{}
}

type refusalWait struct {
	cancel context.CancelCauseFunc
	err    error // the refused dial's; guarded by dialRefusals.mu
}

func (d *dialRefusals) during(ctx context.Context) (context.Context, func() error) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &refusalWait{cancel: cancel}
	d.mu.Lock()
	d.waits[w] = struct{}{}
	d.mu.Unlock()
	return ctx, func() error {
		d.mu.Lock()
		delete(d.waits, w)
		err := w.err
		d.mu.Unlock()
		cancel(nil)
		return err
	}
}

func (d *dialRefusals) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil && errors.Is(err, syscall.ECONNREFUSED) {
			d.mu.Lock()
			for w := range d.waits {
				if w.err == nil {
					w.err = err
					w.cancel(err)
				}
			}
			d.mu.Unlock()
		}
		return c, err
	}
}

func (*dialRefusals) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (*dialRefusals) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// recheckChecks: a Redis that answers is checked in full
// (redisstore.Check) once in this many store checks (a minute, by
// default), so that a maxmemory-policy set at runtime is told.
const recheckChecks = 60

// checkWarnings remembers the warnings of the last full check of Redis,
// so that a periodic check logs only what changed.
type checkWarnings struct {
	every time.Duration
	mu    sync.Mutex
	next  time.Time
	last  []string
}

// due reports whether the periodic full check is due at now.
func (w *checkWarnings) due(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !now.Before(w.next)
}

// log logs the warnings of a full check new since the last one (all of
// them at the first, or after they cleared), and a line naming those of
// the last check that are gone (others may stay: a Redis without appendonly keeps its
// warning while an eviction policy is set right). A check that not every
// Cluster master passed (not complete) reports only the others' warnings:
// those of the failing ones are not gone, only unasked.
func (w *checkWarnings) log(l *slog.Logger, ws []error, complete bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next = time.Now().Add(w.every)
	now := make([]string, len(ws))
	for i, e := range ws {
		now[i] = e.Error()
		if !slices.Contains(w.last, now[i]) {
			l.Warn("Redis check", "warning", e)
		}
	}
	if !complete {
		for _, n := range now {
			if !slices.Contains(w.last, n) {
				w.last = append(w.last, n)
			}
		}
		return
	}
	var gone []string
	for _, was := range w.last {
		if !slices.Contains(now, was) {
			gone = append(gone, was)
		}
	}
	if len(gone) > 0 {
		l.Info("Redis check: warnings cleared", "were", strings.Join(gone, "; "))
	}
	w.last = now
}

// checkAccess stops the start when the Redis user may run scripts but not
// read and write sluice's keys (redisstore.Store.CheckAccess); a Redis
// that does not answer is the failure policy's, as in checkRedis.
func (s *Server) checkAccess(rs *redisstore.Store) error {
	// A Redis that answers PING may still refuse sluice's scripts (too few
	// replicas for min-replicas-to-write, out of memory, an ACL): the
	// watch runs the access script too, so readiness tells the truth
	// where no breaker does (the error policy).
	ping := s.health.probe
	_, cluster := s.redis.(*redis.ClusterClient)
	s.health.probe = func(ctx context.Context) error {
		if !cluster {
			if err := ping(ctx); err != nil {
				return err
			}
			return rs.CheckAccess(ctx)
		}
		// Every master on its own, and both checks at once: a master that
		// holds one to ctx's end must not leave the other no time.
		pinged := make(chan error, 1)
		go func() { pinged <- ping(ctx) }()
		err := rs.CheckAccess(ctx)
		// The masters as calls are routed now, from memory: a failover
		// (a planned one fails no call) shows in sluice_store_node_up at
		// the next check, not at the next full one, a minute on.
		if ms, merr := redisstore.Masters(ctx, s.redis.(*redis.ClusterClient)); merr == nil {
			addrs := make([]string, len(ms))
			for i, m := range ms {
				addrs[i] = m.Options().Addr
			}
			s.health.setMasters(addrs)
		}
		return redisstore.JoinMasters(<-pinged, err)
	}
	if s.health.storeDown() {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), s.startTimeout())
	defer cancel()
	err := rs.CheckAccess(ctx)
	if errors.Is(err, redisstore.ErrMisconfigured) {
		return err
	}
	if err != nil {
		// Reachable but refusing writes (out of memory, too few
		// replicas): lost from the start, not only from the watch's first
		// check.
		s.health.storeResult(err)
	}
	return nil
}

func (h *Health) storeDown() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.storeErr != nil
}

// healthObserver passes events to the metrics, and breaker changes to
// Health too.
type healthObserver struct {
	*Metrics
	h *Health
}

// ObserveStore implements sluice.Observer: a decision the failure policy
// answered for a failed store call is part of the store failing (one
// waiting for a failed lease call carries that call's error), and so is a
// failed lease call (grant, regrant, return), which the failure policy
// cannot answer.
func (o healthObserver) ObserveStore(e sluice.StoreEvent) {
	o.Metrics.ObserveStore(e)
	if e.Err != nil && !e.Reported && !errors.Is(e.Err, context.Canceled) {
		o.h.callFailed(time.Now().Add(-e.Latency))
	}
	byPolicy := e.Source == sluice.SourceFallback || e.Source == sluice.SourceFailOpen || e.Source == sluice.SourceFailClosed
	switch {
	case e.Err == nil:
		if e.Source == sluice.SourceBackend {
			o.h.storeAnswered(e.Key)
			o.h.callAnswered(e.Latency)
		}
	case byPolicy && (e.Op == "take" || e.Op == "peek" || e.Op == "take_all" || e.Op == "acquire"):
		o.h.failedCall(time.Now(), o.h.policyKey(e.Key), e.Err)
	case byPolicy && (e.Op == "extend" || e.Op == "release"),
		e.Source == sluice.SourceBackend && (e.Op == "grant" || e.Op == "regrant" || e.Op == "return"):
		o.h.failedOtherCall(time.Now(), o.h.policyKey(e.Key), e.Err)
	}
}

// callFailed records a store call that started at start and failed: the
// earliest evidence of an outage may be a call's, before any check fails.
func (h *Health) callFailed(start time.Time) {
	if h == nil {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failedAtLocked(start)
}

// policyKey is policyOf(key), "" when unknown.
func (h *Health) policyKey(key string) string {
	if h == nil || h.policyOf == nil || key == "" {
		return ""
	}
	return h.policyOf(key)
}

// ObserveBreaker implements sluice.Observer. Health sets
// sluice_fallback_active (Health.setFallback): the failure policy also
// answers while the store is down and the breaker not yet open.
func (o healthObserver) ObserveBreaker(e sluice.BreakerEvent) {
	o.Metrics.obs.ObserveBreaker(e)
	if e.Partition != "" {
		o.h.partitionBreaker(e.Partition, e.To != sluice.BreakerClosed, e.Err)
		return
	}
	o.h.fallbackActive(e.To != sluice.BreakerClosed, e.Err)
}
