// Package promsluice exposes what sluice's middleware and failure-policy
// wrapper observe as Prometheus metrics. A Collector is a sluice.Observer
// (pass it as the Observer option of httplimit, grpclimit and resilient)
// and a prometheus.Collector (register it once):
//
//	sluice_decisions_total{policy,outcome}      outcome: allowed, denied, shadow_denied, error
//	sluice_near_limit_total{policy}             allowed with Remaining <= NearLimitRatio × capacity
//	sluice_store_calls_total{store,op,source}   source: backend, deny_cache, fallback, fail_open, fail_closed
//	sluice_store_errors_total{store,op}         backend failures (timeouts included)
//	sluice_store_latency_seconds{store,op}      backend latency, when the backend was called
//	sluice_breaker_state{store,state}           1 for the current state (closed, half_open, open), 0 for the others
//
// Label values come from configuration (rule and store names), never from
// requests, so cardinality stays bounded.
package promsluice

import (
	"math"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
)

var (
	_ sluice.Observer      = (*Collector)(nil)
	_ prometheus.Collector = (*Collector)(nil)
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
}

// Collector is a sluice.Observer that keeps Prometheus metrics. It is safe
// for concurrent use. Build one with New: the zero value observes nothing
// and exposes no metrics.
type Collector struct {
	ratio       float64
	decisions   *prometheus.CounterVec
	nearLimit   *prometheus.CounterVec
	storeCalls  *prometheus.CounterVec
	storeErrors *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	breaker     *prometheus.GaugeVec
}

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
	return &Collector{
		ratio:       o.NearLimitRatio,
		decisions:   counterVec(ns, "decisions_total", "Rate-limit decisions by policy and outcome (allowed, denied, shadow_denied, error).", "policy", "outcome"),
		nearLimit:   counterVec(ns, "near_limit_total", "Allowed decisions that left little quota (Remaining at most the near-limit share of capacity).", "policy"),
		storeCalls:  counterVec(ns, "store_calls_total", "Calls of a wrapped store by operation and by who answered (backend, deny_cache, fallback, fail_open, fail_closed).", "store", "op", "source"),
		storeErrors: counterVec(ns, "store_errors_total", "Backend failures of a wrapped store, timeouts included.", "store", "op"),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: ns, Name: "store_latency_seconds",
			Help:    "Latency of backend calls of a wrapped store.",
			Buckets: o.LatencyBuckets,
		}, []string{"store", "op"}),
		breaker: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Name: "breaker_state",
			Help: "Circuit breaker state of a wrapped store: 1 for the current state (closed, half_open, open), 0 for the others.",
		}, []string{"store", "state"}),
	}
}

// counterVec makes one of the collector's counters: its namespace, name,
// help and labels.
func counterVec(ns, name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: name, Help: help}, labels)
}

// ObserveDecision implements sluice.Observer.
func (c *Collector) ObserveDecision(e sluice.DecisionEvent) {
	if c.decisions == nil {
		return // a zero Collector
	}
	c.decisions.WithLabelValues(e.Policy, e.Outcome.String()).Inc()
	if e.Outcome == sluice.OutcomeAllowed && float64(e.Decision.Remaining) <= c.ratio*float64(e.Decision.Limit.Capacity()) {
		c.nearLimit.WithLabelValues(e.Policy).Inc()
	}
}

// ForgetPolicy drops the series of a policy that no longer exists (say,
// removed by a configuration reload), so that they do not linger at their
// last values.
func (c *Collector) ForgetPolicy(name string) {
	if c.decisions == nil {
		return // a zero Collector
	}
	c.decisions.DeletePartialMatch(prometheus.Labels{"policy": name})
	c.nearLimit.DeletePartialMatch(prometheus.Labels{"policy": name})
}

// ObserveStore implements sluice.Observer.
func (c *Collector) ObserveStore(e sluice.StoreEvent) {
	if c.decisions == nil {
		return // a zero Collector
	}
	c.storeCalls.WithLabelValues(e.Store, e.Op, e.Source.String()).Inc()
	if e.Err != nil {
		c.storeErrors.WithLabelValues(e.Store, e.Op).Inc()
	}
	if e.Latency > 0 {
		c.latency.WithLabelValues(e.Store, e.Op).Observe(e.Latency.Seconds())
	}
}

// ObserveBreaker implements sluice.Observer.
// Every state has a series, so that an alert on state="open" has one to
// read while the breaker is closed.
func (c *Collector) ObserveBreaker(e sluice.BreakerEvent) {
	if c.decisions == nil {
		return // a zero Collector
	}
	for _, s := range [...]sluice.BreakerState{sluice.BreakerClosed, sluice.BreakerHalfOpen, sluice.BreakerOpen} {
		v := 0.0
		if s == e.To {
			v = 1
		}
		c.breaker.WithLabelValues(e.Store, s.String()).Set(v)
	}
}

// metrics are the collector's vectors; none for a zero Collector.
func (c *Collector) metrics() []prometheus.Collector {
	if c.decisions == nil {
		return nil
	}
	return []prometheus.Collector{c.decisions, c.nearLimit, c.storeCalls, c.storeErrors, c.latency, c.breaker}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range c.metrics() {
		m.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for _, m := range c.metrics() {
		m.Collect(ch)
	}
}
