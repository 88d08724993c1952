package server

import (
	"cmp"
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/promsluice"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/server/config"
)

// Metrics are the service's Prometheus metrics: package promsluice's
// (decisions by policy and outcome, near-limit, store calls, errors and
// latency, breaker state, in-flight slots), the same the middleware
// exports, plus the
// service's own (build, fallback state, config reloads, requests and
// latency per API, Envoy requests no configuration answers, and Redis's
// own figures when the store is Redis). A nil *Metrics records nothing.
type Metrics struct {
	reg        *prometheus.Registry
	obs        *promsluice.Collector
	fallback   prometheus.Gauge
	reloads    *prometheus.CounterVec
	configTime prometheus.Gauge
	configOK   prometheus.Gauge
	requests   *prometheus.CounterVec
	duration   *prometheus.HistogramVec
	unknown    prometheus.Counter
	unmatched  *prometheus.CounterVec
	timeout    prometheus.Gauge
	// connRefused counts connections closed at once for the listener's
	// cap (--max-connections).
	connRefused *prometheus.CounterVec
	// holds are the service's held slots, swept at each collection so
	// that sluice_inflight_held drops a hold once past its timeout.
	holds atomic.Pointer[heldSlots]

	// storeName labels store metrics: "memory" or "redis".
	storeName string
	// wrapped: a failure-policy store reports its calls to ObserveStore
	// itself, so the service must not report them again.
	wrapped bool
	// stalled: the store watch finds Redis answering but holding writes,
	// so a call's timeout is that, not Redis out of reach.
	stalled atomic.Bool
	// health learns which policies Redis answers (Health.decided); nil
	// without a store to watch.
	health *Health
}

var _ sluice.SlotObserver = (*Metrics)(nil)

// NewMetrics registers the service's metrics, plus the Go and process
// collectors, in a new registry.
func NewMetrics() *Metrics {
	m := &Metrics{
		reg:        prometheus.NewRegistry(),
		storeName:  "memory",
		fallback:   newGauge("sluice_fallback_active", "1 while the failure policy answers decisions: the circuit breaker keeps them off Redis (open or half-open), or every Redis Cluster master's does, or Redis does not answer the service's checks."),
		reloads:    newCounterVec("sluice_config_reloads_total", "Configuration reloads by result (success, failure); the load at start is no reload.", "result"),
		configTime: newGauge("sluice_config_last_reload_success_timestamp_seconds", "When the configuration in force was loaded."),
		configOK:   newGauge("sluice_config_last_reload_successful", "1 when the last load of the configuration succeeded; 0 while the file on disk is rejected and the previous configuration stays in force."),
		requests:   newCounterVec("sluice_api_requests_total", "Requests served, by API (grpc, http), endpoint (gRPC method or HTTP route) and code (gRPC status or HTTP status).", "api", "endpoint", "code"),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_api_request_duration_seconds",
			Help:    "Time to answer a request, by API and endpoint; Envoy's rate limit filter timeout applies to the grpc ShouldRateLimit series.",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
		}, []string{"api", "endpoint"}),
		unknown:     newCounter("sluice_rls_unknown_domain_requests_total", "Envoy rate limit requests for a domain no configuration names; they are answered OK. Each domain is logged once (the first 1,000); it is not a label: requests choose it."),
		unmatched:   newCounterVec("sluice_rls_unmatched_descriptors_total", "Descriptors of a configured domain that no rule matches, so nothing limits them.", "domain"),
		connRefused: newCounterVec("sluice_connections_refused_total", "Connections closed as soon as accepted because the listener (http, grpc) had --max-connections open.", "listener"),
		timeout:     newGauge("sluice_decision_timeout_seconds", "The longest wait for Redis before the failure policy answers (--decision-timeout); 0 without Redis. Alerts compare store latency with it."),
	}
	m.obs = promsluice.New(&promsluice.Options{Refresh: func() {
		if h := m.holds.Load(); h != nil {
			h.expire()
		}
	}, Cause: m.cause})
	m.reg.MustRegister(m.obs, m.fallback, m.reloads, m.configTime, m.configOK, m.requests, m.duration, m.unknown, m.unmatched, m.timeout, m.connRefused,
		ReadBuildInfo().collector(),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.reloads.WithLabelValues("success")
	m.reloads.WithLabelValues("failure")
	return m
}

// newGauge, newCounter and newCounterVec make the service's own metrics: a
// name, its help and, for a vector, its labels.
func newGauge(name, help string) prometheus.Gauge {
	return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help})
}

func newCounter(name, help string) prometheus.Counter {
	return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
}

func newCounterVec(name, help string, labels ...string) *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
}

// Registry returns the registry, so embedders can add their collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus exposition format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// store reports a call of an unwrapped store.
func (m *Metrics) store(op string, d time.Duration, err error) {
	if m == nil || m.wrapped {
		return
	}
	m.obs.ObserveStore(sluice.StoreEvent{Store: m.storeName, Op: op, Source: sluice.SourceBackend, Latency: d, Err: err})
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

// unknownDomain counts a request for an unknown domain.
func (m *Metrics) unknownDomain() {
	if m != nil {
		m.unknown.Inc()
	}
}

// forget drops the series of policies a reload removed.
func (m *Metrics) forget(policies []string) {
	if m == nil {
		return
	}
	for _, p := range policies {
		m.obs.ForgetPolicy(p)
	}
	m.health.forget(policies)
}

// configured makes the series of policies (a configuration's, as they
// load) at 0, before their first event: a series born at 1 shows an
// alert's increase() nothing.
func (m *Metrics) configured(policies []*config.Policy) {
	if m == nil {
		return
	}
	for _, p := range policies {
		m.obs.AddPolicy(p.Name, p.InFlight != nil)
	}
}

// watchSlots makes h the held slots swept at each collection.
func (m *Metrics) watchSlots(h *heldSlots) {
	if m != nil {
		m.holds.Store(h)
	}
}

// loaded notes the configuration loaded at start: no reload, but its
// time is the last successful load's.
func (m *Metrics) loaded() {
	if m != nil {
		m.configTime.SetToCurrentTime()
		m.configOK.Set(1)
	}
}

// reload counts a reload (not the load at start) by its result.
func (m *Metrics) reload(ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.reloads.WithLabelValues("success").Inc()
		m.configTime.SetToCurrentTime()
		m.configOK.Set(1)
	} else {
		m.reloads.WithLabelValues("failure").Inc()
		m.configOK.Set(0)
	}
}

// ObserveDecision implements sluice.Observer.
func (m *Metrics) ObserveDecision(e sluice.DecisionEvent) {
	m.obs.ObserveDecision(e)
	if m.health != nil && e.Outcome != sluice.OutcomeError {
		m.health.decided(e.Policy, e.Decision.Source)
	}
}

// ObserveStore implements sluice.Observer for the failure-policy store.
// Single calls answered by the failure policy (a timeout while the breaker
// is closed) show in the store metrics, not in sluice_fallback_active,
// which follows the breaker so that it is steady enough to alert on.
func (m *Metrics) ObserveStore(e sluice.StoreEvent) { m.obs.ObserveStore(e) }

// ObserveSlot implements sluice.SlotObserver: the service's in-flight
// acquires, extends, releases and expiries.
func (m *Metrics) ObserveSlot(e sluice.SlotEvent) {
	if m != nil {
		m.obs.ObserveSlot(e)
	}
}

// ObserveBreaker implements sluice.Observer, and tracks the breaker state
// in sluice_fallback_active.
func (m *Metrics) ObserveBreaker(e sluice.BreakerEvent) {
	m.obs.ObserveBreaker(e)
	m.SetFallback(e.To != sluice.BreakerClosed)
}

// rlsUnmatched counts a descriptor of a configured domain that no rule
// matches.
func (m *Metrics) rlsUnmatched(domain string) {
	if m == nil {
		return
	}
	m.unmatched.WithLabelValues(domain).Inc()
}

func (m *Metrics) request(api, endpoint, code string, d time.Duration) {
	if m == nil {
		return
	}
	m.requests.WithLabelValues(api, endpoint, code).Inc()
	m.duration.WithLabelValues(api, endpoint).Observe(d.Seconds())
}

// instrumentGRPC is a unary interceptor counting and timing every call
// by method and status code.
func (m *Metrics) instrumentGRPC(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	m.request("grpc", info.FullMethod, status.Code(err).String(), time.Since(start))
	return resp, err
}

// instrumentHTTP counts and times every request by the route pattern it
// matched (a bounded set, unlike raw paths) and status code.
func (m *Metrics) instrumentHTTP(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		h.ServeHTTP(sw, r)
		// ServeMux records the pattern in the request it was given; its
		// exact-match marker is routing syntax, not part of the endpoint.
		endpoint := strings.TrimSuffix(cmp.Or(r.Pattern, "other"), "{$}")
		code := strconv.Itoa(cmp.Or(sw.code, http.StatusOK))
		if sw.code == 0 && r.Context().Err() != nil {
			// Its client went away before an answer and none was written:
			// nginx's "client closed request", not the empty 200 net/http
			// would send to nobody.
			code = "499"
		}
		m.request("http", endpoint, code, time.Since(start))
	})
}

// statusWriter remembers the status code written.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.code == 0 {
		w.code = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush makes the writer an http.Flusher, which handlers that stream
// (server-sent events) assert rather than finding it through Unwrap.
func (w *statusWriter) Flush() {
	if w.code == 0 {
		w.code = http.StatusOK
	}
	http.NewResponseController(w.ResponseWriter).Flush()
}

// timedStore reports the calls of store to m's store metrics (unless a
// failure-policy store reports them itself). It keeps store's TakeAll,
// and its Grant, Return and Regrant, timed as their own ops: the service
// puts it below the lease store, as a failure-policy store sits, so that
// every policy reports the same ops.
func timedStore(store sluice.Store, m *Metrics) sluice.Store {
	if m == nil || m.wrapped { // the failure-policy store times its own calls
		return store
	}
	t := timed{store, m}
	multi, isMulti := store.(sluice.MultiStore)
	g, isGranter := store.(sluice.Granter)
	rg, isRegranter := store.(sluice.Regranter)
	ga, isGrantAller := store.(sluice.GrantAller)
	switch {
	case isGrantAller && isMulti:
		return timedGrantAllerMulti{timedRegranterMulti{timedRegranter{timedGranter{t, g}, ga}, multi}, ga}
	case isRegranter && isMulti:
		return timedRegranterMulti{timedRegranter{timedGranter{t, g}, rg}, multi}
	case isRegranter:
		return timedRegranter{timedGranter{t, g}, rg}
	case isGranter && isMulti:
		return timedGranterMulti{timedGranter{t, g}, multi}
	case isGranter:
		return timedGranter{t, g}
	case isMulti:
		return timedMulti{t, multi}
	}
	return t
}

type timed struct {
	sluice.Store
	m *Metrics
}

// Take and Peek answered from a lease made no store call: the lease
// metrics count them.
func (t timed) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	start := time.Now()
	d, err := t.Store.Take(ctx, key, l, cost)
	if d.Source != sluice.SourceLease {
		t.m.store("take", time.Since(start), err)
	}
	return d, err
}

func (t timed) Peek(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	start := time.Now()
	d, err := t.Store.Peek(ctx, key, l, cost)
	if d.Source != sluice.SourceLease {
		t.m.store("peek", time.Since(start), err)
	}
	return d, err
}

func (t timed) Reset(ctx context.Context, key string, l sluice.Limit) error {
	start := time.Now()
	err := t.Store.Reset(ctx, key, l)
	t.m.store("reset", time.Since(start), err)
	return err
}

type timedMulti struct {
	timed
	multi sluice.MultiStore
}

func (t timedMulti) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	start := time.Now()
	ds, err := t.multi.TakeAll(ctx, reqs)
	t.m.store("take_all", time.Since(start), err)
	return ds, err
}

// CheckLimit passes store's verdict on (none when it gives none).
func (t timed) CheckLimit(l sluice.Limit) error {
	if c, ok := t.Store.(sluice.LimitChecker); ok {
		return c.CheckLimit(l)
	}
	return nil
}

type timedGranter struct {
	timed
	g sluice.Granter
}

func (t timedGranter) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	start := time.Now()
	g, err := t.g.Grant(ctx, key, l, n)
	t.m.store("grant", time.Since(start), err)
	return g, err
}

func (t timedGranter) Return(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused int64) (int64, error) {
	start := time.Now()
	n, err := t.g.Return(ctx, key, l, g, unused)
	t.m.store("return", time.Since(start), err)
	return n, err
}

type timedRegranter struct {
	timedGranter
	rg sluice.Regranter
}

func (t timedRegranter) Regrant(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	start := time.Now()
	back, next, err := t.rg.Regrant(ctx, key, l, g, unused, n)
	t.m.store("regrant", time.Since(start), err)
	return back, next, err
}

type timedGranterMulti struct {
	timedGranter
	multi sluice.MultiStore
}

func (t timedGranterMulti) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	return timedMulti{t.timed, t.multi}.TakeAll(ctx, reqs)
}

type timedRegranterMulti struct {
	timedRegranter
	multi sluice.MultiStore
}

func (t timedRegranterMulti) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	return timedMulti{t.timed, t.multi}.TakeAll(ctx, reqs)
}

// timedGrantAllerMulti keeps a store's GrantAll, so that a layered leased
// request's grants still go in one call (package lease), each timed as
// Grant or Regrant alone would be: the call's time, its own error.
type timedGrantAllerMulti struct {
	timedRegranterMulti
	ga sluice.GrantAller
}

func (t timedGrantAllerMulti) GrantAll(ctx context.Context, reqs []sluice.GrantRequest) []sluice.GrantResult {
	start := time.Now()
	res := t.ga.GrantAll(ctx, reqs)
	took := time.Since(start)
	for i, r := range res {
		op := "grant"
		if reqs[i].Unused > 0 {
			op = "regrant"
		}
		t.m.store(op, took, r.Err)
	}
	return res
}

// cause names the kind of a failed store call: the causes of
// sluice_store_errors_total and of the breaker's transition lines.
func (m *Metrics) cause(err error) string {
	// The causes of sluice_store_transitions_total; a memory store
	// fails only on a caller's mistake.
	if m.storeName != "redis" {
		return "other"
	}
	if m.stalled.Load() {
		if errors.Is(err, resilient.ErrTimeout) {
			return "stalled"
		}
		return cause(redisstore.Stalled(err))
	}
	return cause(m.health.callErr(err))
}
