package server

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
)

// slotMetrics are the in-flight metrics: acquires by policy, priority and
// outcome; extends and releases by outcome; and, from the service's
// heldSlots, the weight held and the holds expired through this instance.
type slotMetrics struct {
	acquires *prometheus.CounterVec
	calls    *prometheus.CounterVec
	held     *prometheus.Desc
	expired  *prometheus.Desc
	src      atomic.Pointer[heldSlots]
}

func newSlotMetrics() *slotMetrics {
	return &slotMetrics{
		acquires: counterVec("sluice_inflight_acquires_total",
			"In-flight slot acquires by policy, priority and outcome: allowed, denied (the key's slots are full: 429), shed (the priority's share is full: 503) or error.",
			"policy", "priority", "outcome"),
		calls: counterVec("sluice_inflight_calls_total",
			"In-flight slot extends and releases by policy, call and outcome: extended, released, released_before (a repeated release) or not_held (expired, or a forged token: nothing freed).",
			"policy", "call", "outcome"),
		held: prometheus.NewDesc("sluice_inflight_held",
			"Weight of in-flight slots acquired through this instance and neither released through it nor past their hold timeout.",
			[]string{"policy"}, nil),
		expired: prometheus.NewDesc("sluice_inflight_expired_total",
			"Slots acquired through this instance that reached their hold timeout without a release through it (a crashed or slow holder, or a release through another instance).",
			[]string{"policy"}, nil),
	}
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func (m *slotMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.acquires.Describe(ch)
	m.calls.Describe(ch)
	ch <- m.held
	ch <- m.expired
}

func (m *slotMetrics) Collect(ch chan<- prometheus.Metric) {
	m.acquires.Collect(ch)
	m.calls.Collect(ch)
	h := m.src.Load()
	if h == nil {
		return
	}
	held, expired := h.figures()
	for p, n := range held {
		ch <- prometheus.MustNewConstMetric(m.held, prometheus.GaugeValue, float64(n), p)
	}
	for p, n := range expired {
		ch <- prometheus.MustNewConstMetric(m.expired, prometheus.CounterValue, float64(n), p)
	}
}

// watchSlots makes the held and expired figures h's.
func (m *Metrics) watchSlots(h *heldSlots) {
	if m != nil {
		m.slots.src.Store(h)
	}
}

func (m *Metrics) slotAcquire(policy string, prio sluice.Priority, outcome string) {
	if m != nil {
		m.slots.acquires.WithLabelValues(policy, prio.String(), outcome).Inc()
	}
}

func (m *Metrics) slotCall(policy, call, outcome string) {
	if m != nil {
		m.slots.calls.WithLabelValues(policy, call, outcome).Inc()
	}
}

// forgetSlots drops the in-flight series of a removed policy.
func (m *slotMetrics) forget(policy string) {
	m.acquires.DeletePartialMatch(prometheus.Labels{"policy": policy})
	m.calls.DeletePartialMatch(prometheus.Labels{"policy": policy})
}
