// Package promsluice exposes what sluice's middleware and failure-policy
// wrapper observe as Prometheus metrics. A Collector is a sluice.Observer
// (pass it as the Observer option of httplimit, grpclimit and resilient)
// and a prometheus.Collector (register it once):
//
//	sluice_decisions_total{policy,outcome}      outcome: allowed, denied, shadow_denied, error; a denied request counts only for the policies that denied it
//	sluice_near_limit_total{policy}             allowed with Remaining <= NearLimitRatio × capacity
//	sluice_store_calls_total{store,op,source}   source: backend, deny_cache, fallback, fail_open, fail_closed
//	sluice_store_errors_total{store,op}         backend failures (timeouts included); {store,op,cause} with Options.Cause
//	sluice_store_latency_seconds{store,op}      backend latency, when the backend was called
//	sluice_breaker_state{store,partition,state} 1 for the current state (closed, half_open, open), 0 for the others; from resilient.New on, which reports the initial state; partition: a Redis Cluster master's address for its breaker, "" for the store's own; a master's series go when its breaker is forgotten (no key maps to it any more)
//	sluice_breaker_transitions_total{store,partition,to}     each change of a breaker's state (to: closed, half_open, open), so that an episode shorter than a scrape interval still shows (a forgotten master's counts stay); 0 from the breaker's build on
//	sluice_inflight_acquires_total{policy,priority,outcome}  outcome: allowed, denied, shed, error
//	sluice_inflight_calls_total{policy,call,outcome}         call: extend, release; outcome: extended, released, released_before, not_held, error, not_retried
//	sluice_inflight_held{policy}                             weight this process holds now
//	sluice_inflight_expired_total{policy}                    weight of holds the store found past their hold timeout
//	sluice_fallback_evicted_keys_total{store}                keys resilient's default fallback evicted (each starts its limit afresh)
//	sluice_fallback_evicted_exhausted_keys_total{store}      of those, keys that had taken their whole limit
//
// The middleware and the service report the same in-flight events
// (sluice.SlotEvent), so both export these under one description.
//
// Label values come from configuration (rule and store names), never from
// requests, so cardinality stays bounded.
//
// A counter series that appears only at its first event appears at 1, and
// Prometheus's increase() and rate() see no increase in it: an alert such
// as increase(x[10m]) > 0 would miss that event. So series start at 0 as
// soon as what they count can happen: a breaker's transitions when it is
// built (resilient announces it), a policy's decision and in-flight series
// at its first event of any kind, or before with AddPolicy (which
// httplimit and grpclimit call for their rules when built with the
// Collector as their Observer, and sluice serve at each configuration).
package promsluice

import (
	"math"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
)

var (
	_ sluice.SlotObserver     = (*Collector)(nil)
	_ sluice.EvictionObserver = (*Collector)(nil)
	_ prometheus.Collector    = (*Collector)(nil)
)

// Options configures a Collector. A nil *Options is valid.
type Options struct {
	// Namespace prefixes every metric name. Default: "sluice".
	Namespace string
	// NearLimitRatio: an allowed decision whose Remaining is at most this
	// share of the limit's capacity counts as near the limit. Default: 0.1.
	NearLimitRatio float64
	// LatencyBuckets are the store latency histogram's buckets in seconds,
	// taken sorted, without duplicates or values that are not finite
	// (Prometheus would panic on them at the first observation). Default:
	// 0.5ms to 1s, suited to a Redis round trip with a timeout of tens of
	// milliseconds.
	LatencyBuckets []float64
	// Refresh, if set, is called at the start of every Collect: a front
	// end that learns of some events only when it looks (the service's
	// holds past their timeout, reported as sluice.SlotExpire) reports
	// them there, so that a scrape never reads them stale. It may call
	// the Collector's Observe methods. Default: nil.
	Refresh func()
	// Cause, if set, names the kind of a backend failure, as a label
	// value: store_errors_total then has a cause label. It must return
	// one of a small fixed set, never the error's text. Default: nil, no
	// cause label.
	Cause func(error) string
}

// Collector is a sluice.Observer that keeps Prometheus metrics. It is safe
// for concurrent use. Build one with New: the zero value (and a nil
// *Collector) observes nothing and exposes no metrics.
type Collector struct {
	ratio        float64
	refresh      func()
	cause        func(error) string
	decisions    *prometheus.CounterVec
	nearLimit    *prometheus.CounterVec
	storeCalls   *prometheus.CounterVec
	storeErrors  *prometheus.CounterVec
	latency      *prometheus.HistogramVec
	breaker      *prometheus.GaugeVec
	breakerMoves *prometheus.CounterVec
	acquires     *prometheus.CounterVec
	slotCalls    *prometheus.CounterVec
	held         *prometheus.GaugeVec
	expired      *prometheus.CounterVec
	evicted      *prometheus.CounterVec
	exhausted    *prometheus.CounterVec
	// policies holds the names of the policies whose series exist (as
	// policyKinds), so that an event makes them once.
	policies sync.Map
}

// policyKinds are the bits of a policies entry: which of a policy's
// series exist.
const (
	rateSeries uint8 = 1 << iota
	slotSeries
)

// New returns a Collector. Register it with a prometheus.Registerer.
func New(opts *Options) *Collector {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.Namespace == "" {
		o.Namespace = "sluice"
	}
	if o.NearLimitRatio <= 0 {
		o.NearLimitRatio = 0.1
	}
	o.LatencyBuckets = slices.DeleteFunc(slices.Clone(o.LatencyBuckets), func(b float64) bool {
		return math.IsNaN(b) || math.IsInf(b, 0)
	})
	slices.Sort(o.LatencyBuckets)
	o.LatencyBuckets = slices.Compact(o.LatencyBuckets)
	if len(o.LatencyBuckets) == 0 {
		o.LatencyBuckets = []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1}
	}
	ns := o.Namespace
	errLabels := []string{"store", "op"}
	if o.Cause != nil {
		errLabels = append(errLabels, "cause")
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	gauge := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: name, Help: help}, labels)
	}
	return &Collector{
		ratio:   o.NearLimitRatio,
		refresh: o.Refresh,
		cause:   o.Cause,
		decisions: counter("decisions_total",
			"Rate-limit decisions by policy and outcome (allowed, denied, shadow_denied, error). A denied request counts only for the policies that denied it: the others took nothing.", "policy", "outcome"),
		nearLimit: counter("near_limit_total",
			"Allowed decisions that left little quota (Remaining at most the near-limit share of capacity).", "policy"),
		storeCalls: counter("store_calls_total",
			"Calls of a wrapped store by operation and by who answered (backend, deny_cache, fallback, fail_open, fail_closed).", "store", "op", "source"),
		storeErrors: counter("store_errors_total",
			"Backend failures of a wrapped store, timeouts included.", errLabels...),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "store_latency_seconds",
			Help:    "Latency of backend calls of a wrapped store.",
			Buckets: o.LatencyBuckets,
		}, []string{"store", "op"}),
		breaker: gauge("breaker_state",
			"Circuit breaker state of a wrapped store, or of one partition of it (a Redis Cluster master, by address; \"\" for the whole store): 1 for the current state (closed, half_open, open), 0 for the others.", "store", "partition", "state"),
		breakerMoves: counter("breaker_transitions_total",
			"Changes of state of a wrapped store's circuit breaker, or of one partition's (a Redis Cluster master, by address; \"\" for the whole store), by the state changed to (closed, half_open, open): an episode shorter than a scrape interval, which breaker_state may miss, still shows.", "store", "partition", "to"),
		acquires: counter("inflight_acquires_total",
			"In-flight slot acquires by policy, the request's priority (critical, normal, sheddable) and outcome: allowed, denied (the key's slots are full: 429), shed (the priority's share is full: 503) or error.",
			"policy", "priority", "outcome"),
		slotCalls: counter("inflight_calls_total",
			"In-flight slot extends and releases by policy, call (extend, release) and outcome: extended, released, released_before (a repeated release, or one sent again whose failed first try had freed the slot), not_held (expired or never acquired: nothing freed), error (a release is sent again in the background until the store answers or its hold passes, an extend tried again at the next round) or not_retried (a failed release not sent again, too many being sent already: the store frees the slot at its hold timeout).",
			"policy", "call", "outcome"),
		evicted: counter("fallback_evicted_keys_total",
			"Keys a wrapped store's default fallback evicted to stay within its bound; each starts its limit afresh.", "store"),
		exhausted: counter("fallback_evicted_exhausted_keys_total",
			"Of fallback_evicted_keys_total, keys that had taken their whole limit (denying, or a Penalty block): each may admit its whole limit again.", "store"),
		held: gauge("inflight_held",
			"In-flight weight acquired through this process and neither released through it nor past its hold timeout, by policy; summed over the fleet, the weight in use.", "policy"),
		expired: counter("inflight_expired_total",
			"Weight of in-flight holds that reached their hold timeout unreleased (a crashed or overrunning holder), as the store removed them on an acquire through this process: summed over a fleet, each counted once.", "policy"),
	}
}

// vecs returns every metric vector of c, for Describe and Collect.
func (c *Collector) vecs() []prometheus.Collector {
	return []prometheus.Collector{c.decisions, c.nearLimit, c.storeCalls, c.storeErrors, c.latency, c.breaker, c.breakerMoves, c.acquires, c.slotCalls, c.held, c.expired, c.evicted, c.exhausted}
}

// ObserveEvictions implements sluice.EvictionObserver.
func (c *Collector) ObserveEvictions(e sluice.EvictionEvent) {
	if c == nil || c.decisions == nil {
		return // a zero Collector
	}
	c.evicted.WithLabelValues(e.Store).Add(float64(e.Keys))
	c.exhausted.WithLabelValues(e.Store).Add(float64(e.Exhausted))
}

// ObserveDecision implements sluice.Observer.
func (c *Collector) ObserveDecision(e sluice.DecisionEvent) {
	if c == nil || c.decisions == nil {
		return // a zero Collector
	}
	c.known(e.Policy, false)
	c.decisions.WithLabelValues(e.Policy, e.Outcome.String()).Inc()
	if e.Outcome == sluice.OutcomeAllowed && float64(e.Decision.Remaining) <= c.ratio*float64(e.Decision.Limit.Capacity()) {
		c.nearLimit.WithLabelValues(e.Policy).Inc()
	}
}

// ForgetPolicy drops the series of a policy that no longer exists (say,
// removed by a configuration reload), so that they do not linger at their
// last values.
func (c *Collector) ForgetPolicy(name string) {
	if c == nil || c.decisions == nil {
		return // a zero Collector
	}
	c.policies.Delete(name)
	for _, v := range []*prometheus.MetricVec{c.decisions.MetricVec, c.nearLimit.MetricVec, c.acquires.MetricVec, c.slotCalls.MetricVec, c.held.MetricVec, c.expired.MetricVec} {
		v.DeletePartialMatch(prometheus.Labels{"policy": name})
	}
}

// AddPolicy makes the series of a policy at 0: its decision series, or
// with inFlight its in-flight ones, every outcome (and priority) of them.
// The Collector makes them at the policy's first event anyway; calling
// AddPolicy when the policy is configured makes them exist before it, so
// that an alert on increase() or rate() sees even the first event (a
// series born at 1 shows no increase). ForgetPolicy drops them.
func (c *Collector) AddPolicy(name string, inFlight bool) {
	if c == nil || c.decisions == nil {
		return // a zero Collector
	}
	c.known(name, inFlight)
}

// known makes policy's series of the kind given, unless they exist.
func (c *Collector) known(policy string, inFlight bool) {
	kind := rateSeries
	if inFlight {
		kind = slotSeries
	}
	if v, ok := c.policies.Load(policy); ok && v.(uint8)&kind != 0 {
		return
	}
	if inFlight {
		for _, p := range [...]sluice.Priority{sluice.PriorityCritical, sluice.PriorityNormal, sluice.PrioritySheddable} {
			for _, o := range [...]sluice.Outcome{sluice.OutcomeAllowed, sluice.OutcomeDenied, sluice.OutcomeShed, sluice.OutcomeError} {
				c.acquires.WithLabelValues(policy, p.String(), o.String())
			}
		}
		for _, o := range [...]string{"extended", "not_held", "error"} {
			c.slotCalls.WithLabelValues(policy, sluice.SlotExtend.String(), o)
		}
		for _, o := range [...]string{"released", "released_before", "not_held", "error", "not_retried"} {
			c.slotCalls.WithLabelValues(policy, sluice.SlotRelease.String(), o)
		}
		c.held.WithLabelValues(policy)
		c.expired.WithLabelValues(policy)
	} else {
		for _, o := range [...]sluice.Outcome{sluice.OutcomeAllowed, sluice.OutcomeDenied, sluice.OutcomeShadowDenied, sluice.OutcomeError} {
			c.decisions.WithLabelValues(policy, o.String())
		}
		c.nearLimit.WithLabelValues(policy)
	}
	for {
		v, loaded := c.policies.LoadOrStore(policy, kind)
		if !loaded || c.policies.CompareAndSwap(policy, v, v.(uint8)|kind) {
			return
		}
	}
}

// ObserveSlot implements sluice.SlotObserver.
func (c *Collector) ObserveSlot(e sluice.SlotEvent) {
	if c == nil || c.decisions == nil {
		return // a zero Collector
	}
	c.known(e.Policy, true)
	switch e.Op {
	case sluice.SlotAcquire:
		c.acquires.WithLabelValues(e.Policy, e.Priority.String(), e.Outcome.String()).Inc()
		if e.Outcome == sluice.OutcomeAllowed {
			c.held.WithLabelValues(e.Policy).Add(float64(e.Weight))
		}
		if e.Decision.Expired > 0 {
			c.expired.WithLabelValues(e.Policy).Add(float64(e.Decision.Expired))
		}
	case sluice.SlotExtend, sluice.SlotRelease:
		c.slotCalls.WithLabelValues(e.Policy, e.Op.String(), callOutcome(e)).Inc()
		if e.Op == sluice.SlotRelease && e.Weight != 0 && e.Outcome == sluice.OutcomeAllowed {
			c.held.WithLabelValues(e.Policy).Sub(float64(e.Weight))
		}
	case sluice.SlotExpire:
		c.held.WithLabelValues(e.Policy).Sub(float64(e.Weight))
	}
}

// callOutcome is the outcome label of an extend or release.
func callOutcome(e sluice.SlotEvent) string {
	switch {
	case e.Outcome == sluice.OutcomeError && e.NotRetried:
		return "not_retried"
	case e.Outcome == sluice.OutcomeError:
		return "error"
	case e.Outcome != sluice.OutcomeAllowed:
		return "not_held"
	case e.Op == sluice.SlotExtend:
		return "extended"
	case e.Again:
		return "released_before"
	}
	return "released"
}

// ObserveStore implements sluice.Observer.
func (c *Collector) ObserveStore(e sluice.StoreEvent) {
	if c == nil || c.decisions == nil {
		return // a zero Collector
	}
	c.storeCalls.WithLabelValues(e.Store, e.Op, e.Source.String()).Inc()
	if e.Err != nil && !e.Reported { // a reported error was counted with its own call
		if c.cause != nil {
			c.storeErrors.WithLabelValues(e.Store, e.Op, c.cause(e.Err)).Inc()
		} else {
			c.storeErrors.WithLabelValues(e.Store, e.Op).Inc()
		}
	}
	if e.Latency > 0 {
		c.latency.WithLabelValues(e.Store, e.Op).Observe(e.Latency.Seconds())
	}
}

// ObserveBreaker implements sluice.Observer.
// Every state has a series, so that an alert on state="open" has one to
// read while the breaker is closed.
func (c *Collector) ObserveBreaker(e sluice.BreakerEvent) {
	if c == nil || c.decisions == nil {
		return // a zero Collector
	}
	if e.From != e.To {
		c.breakerMoves.WithLabelValues(e.Store, e.Partition, e.To.String()).Inc()
	}
	for _, s := range [...]sluice.BreakerState{sluice.BreakerClosed, sluice.BreakerHalfOpen, sluice.BreakerOpen} {
		if e.Forgotten {
			// Its transitions' counts stay: an episode just before a
			// failover would otherwise vanish unscraped.
			c.breaker.DeleteLabelValues(e.Store, e.Partition, s.String())
			continue
		}
		// Its transitions from 0, before the first: a series born at 1
		// shows no increase.
		c.breakerMoves.WithLabelValues(e.Store, e.Partition, s.String())
		v := 0.0
		if s == e.To {
			v = 1
		}
		c.breaker.WithLabelValues(e.Store, e.Partition, s.String()).Set(v)
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	if c == nil || c.decisions == nil {
		return // a zero Collector
	}
	for _, v := range c.vecs() {
		v.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	if c == nil || c.decisions == nil {
		return // a zero Collector
	}
	if c.refresh != nil {
		c.refresh()
	}
	for _, v := range c.vecs() {
		v.Collect(ch)
	}
}
