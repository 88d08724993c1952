package server

import (
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"sluice"
)

// NearLimitRatio: an allowed decision leaving less than this share of the
// capacity counts as near the limit (envoyproxy/ratelimit's default 0.8
// used, seen from the other side).
const NearLimitRatio = 0.2

// Metrics are the service's Prometheus metrics. A nil *Metrics records
// nothing, so tests and embedders can leave it out.
type Metrics struct {
	reg          *prometheus.Registry
	decisions    *prometheus.CounterVec
	nearLimit    *prometheus.CounterVec
	storeLatency *prometheus.HistogramVec
	storeErrors  *prometheus.CounterVec
	fallback     prometheus.Gauge
	reloads      *prometheus.CounterVec
	configTime   prometheus.Gauge
	answers      *prometheus.CounterVec
	breaker      prometheus.Gauge
	latency      map[string]prometheus.Observer // by op, made once
	errorsByOp   map[string]prometheus.Counter

	// wrapped: a failure-policy store reports store errors through
	// ObserveStore, so the service must not count them again.
	wrapped bool
}

var _ sluice.Observer = (*Metrics)(nil)

// NewMetrics registers the service's metrics, plus the Go and process
// collectors, in a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_decisions_total",
			Help: "Rate-limit decisions by policy and outcome (allowed, denied, shadow_denied).",
		}, []string{"policy", "outcome"}),
		nearLimit: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_near_limit_total",
			Help: "Allowed decisions that left less than 20% of the policy's capacity.",
		}, []string{"policy"}),
		storeLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_store_latency_seconds",
			Help:    "Latency of store operations.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"op"}),
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_errors_total",
			Help: "Store operations that failed.",
		}, []string{"op"}),
		fallback: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_fallback_active",
			Help: "1 while decisions are made by the failure policy instead of the primary store.",
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_config_reloads_total",
			Help: "Configuration reloads by result (success, failure).",
		}, []string{"result"}),
		configTime: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_config_last_reload_success_timestamp_seconds",
			Help: "When the configuration in force was loaded.",
		}),
		answers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_store_answers_total",
			Help: "Store calls by who answered: backend, deny_cache, fallback, fail_open, fail_closed.",
		}, []string{"source"}),
		breaker: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "sluice_breaker_state",
			Help: "The Redis circuit breaker: 0 closed, 1 half open, 2 open.",
		}),
	}
	m.reg.MustRegister(m.decisions, m.answers, m.breaker, m.nearLimit, m.storeLatency, m.storeErrors, m.fallback, m.reloads, m.configTime,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	m.latency, m.errorsByOp = map[string]prometheus.Observer{}, map[string]prometheus.Counter{}
	for _, op := range []string{"take", "take_all", "peek", "reset"} {
		m.latency[op] = m.storeLatency.WithLabelValues(op)
		m.errorsByOp[op] = m.storeErrors.WithLabelValues(op)
	}
	return m
}

// Registry returns the registry, so embedders can add their collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// policyMetrics are one policy's counters, looked up once per
// configuration rather than per decision.
type policyMetrics struct {
	allowed, denied, shadowDenied, nearLimit prometheus.Counter
}

func (m *Metrics) forPolicy(name string) *policyMetrics {
	if m == nil {
		return nil
	}
	return &policyMetrics{
		allowed:      m.decisions.WithLabelValues(name, Allowed.String()),
		denied:       m.decisions.WithLabelValues(name, Denied.String()),
		shadowDenied: m.decisions.WithLabelValues(name, ShadowDenied.String()),
		nearLimit:    m.nearLimit.WithLabelValues(name),
	}
}

func (pm *policyMetrics) decision(r Result) {
	if pm == nil {
		return
	}
	switch r.Outcome {
	case Allowed:
		pm.allowed.Inc()
		if c := r.Decision.Limit.Capacity(); float64(r.Decision.Remaining) < NearLimitRatio*float64(c) {
			pm.nearLimit.Inc()
		}
	case Denied:
		pm.denied.Inc()
	case ShadowDenied:
		pm.shadowDenied.Inc()
	}
}

func (m *Metrics) store(op string, d time.Duration, err error) {
	if m == nil {
		return
	}
	m.latency[op].Observe(d.Seconds())
	if err != nil && !m.wrapped {
		m.errorsByOp[op].Inc()
	}
}

// SetFallback records whether the failure policy is deciding.
func (m *Metrics) SetFallback(active bool) {
	if m == nil {
		return
	}
	v := 0.0
	if active {
		v = 1
	}
	m.fallback.Set(v)
}

func (m *Metrics) reload(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.reloads.WithLabelValues("success").Inc()
		m.configTime.SetToCurrentTime()
	} else {
		m.reloads.WithLabelValues("failure").Inc()
	}
}

// ObserveDecision implements sluice.Observer. The service counts its own
// decisions; this is for middleware sharing the registry.
func (m *Metrics) ObserveDecision(e sluice.DecisionEvent) {
	m.decisions.WithLabelValues(e.Policy, e.Outcome.String()).Inc()
}

// ObserveStore implements sluice.Observer for the failure-policy store:
// errors, who answered, and whether the fallback is deciding.
func (m *Metrics) ObserveStore(e sluice.StoreEvent) {
	m.answers.WithLabelValues(e.Source.String()).Inc()
	if e.Err != nil {
		m.storeErrors.WithLabelValues(e.Op).Inc()
	}
	switch e.Source {
	case sluice.SourceBackend:
		m.SetFallback(false)
	case sluice.SourceFallback, sluice.SourceFailOpen, sluice.SourceFailClosed:
		m.SetFallback(true)
	}
}

// ObserveBreaker implements sluice.Observer.
func (m *Metrics) ObserveBreaker(e sluice.BreakerEvent) {
	m.breaker.Set(float64(e.To))
	m.SetFallback(e.To != sluice.BreakerClosed)
}
