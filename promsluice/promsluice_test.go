package promsluice_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/promsluice"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/storetest"
)

func TestCollector(t *testing.T) {
	t.Parallel()
	c, reg, store := newCollector(t)

	// Decisions through the middleware.
	mw, err := httplimit.New(store, []httplimit.Rule{
		{Name: "api", Limit: sluice.PerMinute(10), Key: httplimit.Global()},
		{Name: "dark", Limit: sluice.PerMinute(1), Key: httplimit.Global(), Strategy: httplimit.Shadow},
	}, &httplimit.Options{Observer: c})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 12 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}

	// Store calls through the failure-policy wrapper: a dead backend.
	rs, err := resilient.New(storetest.Down{Store: store}, &resilient.Options{Name: "redis", Observer: c, FailureThreshold: 2, DeadAfter: time.Nanosecond, Timeout: time.Minute, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	for range 3 {
		if _, err := rs.Take(context.Background(), "k", sluice.PerSecond(5), 1); err != nil {
			t.Fatal(err)
		}
	}

	for _, tt := range []struct {
		metric string
		want   float64
	}{
		{"api allowed", 10},
		{"api denied", 2},
		{"dark allowed", 1},
		// A shadow rule counts only requests the others admit: the two
		// that api denies are not dark's decisions.
		{"dark shadow_denied", 9},
	} {
		policy, outcome, _ := strings.Cut(tt.metric, " ")
		got := gather(t, reg, "sluice_decisions_total", map[string]string{"policy": policy, "outcome": outcome})
		if got != tt.want {
			t.Errorf("decisions %s = %v, want %v", tt.metric, got, tt.want)
		}
	}
	// 10/min: allowed with 1 and 0 left are near the limit (<= 10%).
	if got := gather(t, reg, "sluice_near_limit_total", map[string]string{"policy": "api"}); got != 2 {
		t.Errorf("near limit = %v, want 2", got)
	}
	if got := gather(t, reg, "sluice_store_calls_total", map[string]string{"store": "redis", "op": "take", "source": "fallback"}); got != 3 {
		t.Errorf("fallback calls = %v, want 3", got)
	}
	if got := gather(t, reg, "sluice_store_errors_total", map[string]string{"store": "redis", "op": "take"}); got != 2 {
		t.Errorf("store errors = %v, want 2 (the third call found the breaker open)", got)
	}
	// One-hot: the current state 1, the others 0.
	for state, want := range map[string]float64{"closed": 0, "half_open": 0, "open": 1} {
		if got := gather(t, reg, "sluice_breaker_state", map[string]string{"store": "redis", "state": state}); got != want {
			t.Errorf("breaker_state{state=%q} = %v, want %v", state, got, want)
		}
	}

	// The pedantic registry checked the metrics for consistency; and they
	// scrape.
	rec := httptest.NewRecorder()
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(rec.Body)
	for _, name := range []string{"sluice_decisions_total", "sluice_store_latency_seconds_bucket", "sluice_breaker_state"} {
		if !strings.Contains(string(body), name) {
			t.Errorf("scrape lacks %s", name)
		}
	}
}

// newCollector returns a Collector registered with a pedantic registry,
// and a memory store.
// Decisions a lease answers count as near the limit only when the key is:
// their Remaining is the key's figure, not the lease's few units.
func TestNearLimitUnderLease(t *testing.T) {
	t.Parallel()
	c, reg, _ := newCollector(t)
	clock := storetest.NewClock(storetest.T0) // frozen: nothing refills
	mem := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	ls, err := lease.New(mem, &lease.Options{MaxStaleness: time.Second, Size: 5, Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.New(ls, []httplimit.Rule{{Name: "leased", Limit: sluice.PerMinute(100), Key: httplimit.Global()}}, &httplimit.Options{Observer: c})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	near := func() float64 {
		return gather(t, reg, "sluice_near_limit_total", map[string]string{"policy": "leased"})
	}
	for range 89 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	if got := near(); got != 0 {
		t.Fatalf("near limit after 89 of 100 = %v, want 0 (11 left at least)", got)
	}
	for range 6 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	// Requests 90 to 95 leave 10 to 5: at most 10 % of 100.
	if got := near(); got != 6 {
		t.Fatalf("near limit after 95 of 100 = %v, want 6", got)
	}
	if st := ls.Stats(); st.Local == 0 {
		t.Fatalf("lease stats %+v: no decision was local", st)
	}
}

func newCollector(t *testing.T) (*promsluice.Collector, *prometheus.Registry, *memory.Store) {
	t.Helper()
	c := promsluice.New(nil)
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	return c, reg, store
}

func Example() {
	metrics := promsluice.New(nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(metrics)

	store := memory.New(nil)
	defer store.Close()
	mw, err := httplimit.New(store, []httplimit.Rule{
		{Name: "api", Limit: sluice.PerMinute(3), Key: httplimit.PeerIP()},
	}, &httplimit.Options{Observer: metrics})
	if err != nil {
		log.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	for range 5 {
		h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	}
	// Serve reg with promhttp.HandlerFor(reg, promhttp.HandlerOpts{}).
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			fmt.Printf("%s{%s} %v\n", mf.GetName(), strings.Join(labels, ","), m.GetCounter().GetValue())
		}
	}
	// Output:
	// sluice_decisions_total{outcome=allowed,policy=api} 3
	// sluice_decisions_total{outcome=denied,policy=api} 2
	// sluice_decisions_total{outcome=error,policy=api} 0
	// sluice_decisions_total{outcome=shadow_denied,policy=api} 0
	// sluice_near_limit_total{policy=api} 1
}

// Buckets out of order, repeated or infinite are put right rather than
// left to panic at the first observation.
func TestLatencyBucketsSanitised(t *testing.T) {
	c, reg := registered(t, &promsluice.Options{LatencyBuckets: []float64{0.1, 0.01, 0.1, math.Inf(1), math.NaN()}})
	c.ObserveStore(sluice.StoreEvent{Store: "redis", Op: "take", Source: sluice.SourceBackend, Latency: 5 * time.Millisecond})
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
}

func TestForgetPolicy(t *testing.T) {
	c, reg := registered(t, nil)
	for _, p := range []string{"gone", "kept"} {
		c.ObserveDecision(sluice.DecisionEvent{Policy: p, Outcome: sluice.OutcomeAllowed, Decision: sluice.Decision{Allowed: true, Limit: sluice.PerMinute(10)}})
	}
	c.ForgetPolicy("gone")
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "policy" && l.GetValue() == "gone" {
					t.Errorf("%s still has policy=gone", mf.GetName())
				}
			}
		}
	}
}

// A zero Collector observes nothing and exposes nothing, without panicking.
func TestZeroCollector(t *testing.T) {
	t.Parallel()
	var c promsluice.Collector
	c.ObserveDecision(sluice.DecisionEvent{Policy: "p"})
	c.ObserveStore(sluice.StoreEvent{Store: "s", Op: "take"})
	c.ObserveBreaker(sluice.BreakerEvent{Store: "s"})
	c.ForgetPolicy("p")
	reg := prometheus.NewRegistry()
	if err := reg.Register(&c); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	if len(mfs) != 0 {
		t.Errorf("a zero Collector exposes %d metric families, want 0", len(mfs))
	}
}

// TestCollectorErrorCause: with Options.Cause, store_errors_total has a
// cause label naming each failure's kind; without, it has none.
func TestCollectorErrorCause(t *testing.T) {
	t.Parallel()
	refused := fmt.Errorf("NOPERM no permissions to access a key")
	for _, withCause := range []bool{false, true} {
		var o promsluice.Options
		if withCause {
			o.Cause = func(err error) string {
				if strings.Contains(err.Error(), "NOPERM") {
					return "permission"
				}
				return "unreachable"
			}
		}
		c := promsluice.New(&o)
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(c)
		for _, err := range []error{refused, refused, context.DeadlineExceeded} {
			c.ObserveStore(sluice.StoreEvent{Store: "redis", Op: "take", Source: sluice.SourceFallback, Err: err})
		}
		want := map[string]float64{"": 3}
		if withCause {
			want = map[string]float64{"permission": 2, "unreachable": 1}
		}
		for cause, n := range want {
			labels := map[string]string{"store": "redis", "op": "take"}
			if cause != "" {
				labels["cause"] = cause
			}
			if got := gather(t, reg, "sluice_store_errors_total", labels); got != n {
				t.Errorf("with cause %v: store errors %v = %v, want %v", withCause, labels, got, n)
			}
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "sluice_store_errors_total" {
				continue
			}
			if got := len(mf.GetMetric()[0].GetLabel()); got != 2+btoi(withCause) {
				t.Errorf("with cause %v: %d labels, want %d", withCause, got, 2+btoi(withCause))
			}
		}
	}
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}

// A fallback's evictions add up in sluice_fallback_evicted_keys_total and
// its exhausted share, by store.
func TestFallbackEvictionsCounted(t *testing.T) {
	c, reg := registered(t, nil)
	c.ObserveEvictions(sluice.EvictionEvent{Store: "redis", Keys: 5, Exhausted: 1})
	c.ObserveEvictions(sluice.EvictionEvent{Store: "redis", Keys: 2})
	for name, want := range map[string]float64{"sluice_fallback_evicted_keys_total": 7, "sluice_fallback_evicted_exhausted_keys_total": 1} {
		if got, ok := promtest.Value(t, reg, name, map[string]string{"store": "redis"}); !ok || got != want {
			t.Errorf("%s = %v (%v), want %v", name, got, ok, want)
		}
	}
}
