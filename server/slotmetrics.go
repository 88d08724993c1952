package server

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
)

// slotMetrics are the in-flight metrics: acquires by policy, priority and
// outcome; extends and releases by outcome; the weight of expired holds
// the store removed; and, from the service's heldSlots, the weight held
// through this instance.
type slotMetrics struct {
	acquires *prometheus.CounterVec
	calls    *prometheus.CounterVec
	expired  *prometheus.CounterVec
	held     *prometheus.Desc
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
		expired: counterVec("sluice_inflight_expired_total",
			"Weight of in-flight holds that reached their hold timeout unreleased (a crashed or overrunning holder), as the store removed them on an acquire through this instance: summed over a fleet, each counted once.",
			"policy"),
		held: prometheus.NewDesc("sluice_inflight_held",
			"Weight of in-flight slots acquired through this instance and neither released through it nor past their hold timeout.",
			[]string{"policy"}, nil),
	}
}

func counterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

func (m *slotMetrics) Describe(ch chan<- *prometheus.Desc) {
	m.acquires.Describe(ch)
	m.calls.Describe(ch)
	m.expired.Describe(ch)
	ch <- m.held
}

func (m *slotMetrics) Collect(ch chan<- prometheus.Metric) {
	m.acquires.Collect(ch)
	m.calls.Collect(ch)
	m.expired.Collect(ch)
	h := m.src.Load()
	if h == nil {
		return
	}
	for p, n := range h.held() {
		ch <- prometheus.MustNewConstMetric(m.held, prometheus.GaugeValue, float64(n), p)
	}
}

// watchSlots makes the held figures h's.
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

// slotExpired counts the weight of expired holds an acquire removed.
func (m *Metrics) slotExpired(policy string, weight int64) {
	if m != nil && weight > 0 {
		m.slots.expired.WithLabelValues(policy).Add(float64(weight))
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
	m.expired.DeletePartialMatch(prometheus.Labels{"policy": policy})
}
