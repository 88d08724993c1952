package httplimit

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/unbuilt"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/storetest"
)

// leaseEveryKey is a lease store on Redis whose Options.For leases every
// key for a second, a sliding window log's too: a configuration error the
// store can only raise per request.
func leaseEveryKey(t *testing.T, clk *storetest.Clock) *lease.Store {
	t.Helper()
	rs := middlewaretest.Redis(t, clk)
	ls, err := lease.New(rs, &lease.Options{Clock: clk.Now, For: func(string, sluice.Limit) time.Duration { return time.Second }})
	if err != nil {
		t.Fatal(err)
	}
	return ls
}

func onPath(p string) func(*http.Request) bool {
	return func(r *http.Request) bool { return r.URL.Path == p }
}

// checkMisconfigured checks that r is the misconfiguration answer: 500
// problem+json naming the refused rules and the cause, with nothing telling
// the client to retry.
func checkMisconfigured(t *testing.T, r response, rules, cause string) {
	t.Helper()
	if r.status != http.StatusInternalServerError || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%d %q %s, want 500 problem+json", r.status, r.header.Get("Content-Type"), r.body)
	}
	if v := r.header.Get(HeaderRetryAfter); v != "" {
		t.Errorf("Retry-After %q: no wait mends a configuration", v)
	}
	var p Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("%s: %v", r.body, err)
	}
	for _, s := range []string{"misconfigured", rules, cause} {
		if !strings.Contains(p.Detail, s) {
			t.Errorf("detail %q does not say %q", p.Detail, s)
		}
	}
}

// A limit the store refuses at a request (a lease store's Options.For
// leasing a sliding window log) is a 500 naming the cause, not a 503 with
// Retry-After as for a Redis outage, observed as an error outcome. Alone and layered, over a real listener and Redis.
func TestRedisStoreRefusesRuleIs500(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	log := sluice.PerMinute(3).WithAlgorithm(sluice.SlidingWindowLog)
	e := newEnvStore(t, clk, leaseEveryKey(t, clk), []Rule{
		{Name: "log", Limit: log, Key: Global(), Match: onPath("/log")},
		{Name: "api", Limit: sluice.PerMinute(100), Key: Global(), Match: onPath("/api")},
		{Name: "layered", Limit: log, Key: Global(), Match: onPath("/both")},
		{Name: "account", Limit: sluice.PerMinute(100), Key: Global(), Match: onPath("/both")},
	}, nil)
	checkMisconfigured(t, e.get("/log"), `rule "log"`, "cannot grant")
	if r := e.get("/api"); r.status != 200 {
		t.Errorf("/api: %d %s, want 200", r.status, r.body)
	}
	checkMisconfigured(t, e.get("/both"), `rules "layered", "account"`, "cannot grant")
	// Observed as errors (no rule decided), so that a dashboard of error
	// outcomes shows the misconfiguration.
	for _, k := range []string{"log/error", "layered/error", "account/error"} {
		if n := e.obs.Get(k); n != 1 {
			t.Errorf("observed %d %s, want 1", n, k)
		}
	}
	// An ErrorHandler is told it is a configuration error, and the store's
	// own.
	errs := make(chan error, 1)
	h := newEnvStore(t, clk, leaseEveryKey(t, clk), []Rule{{Name: "log", Limit: log, Key: Global()}}, &Options{
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			errs <- err
			w.WriteHeader(http.StatusTeapot)
		},
	})
	if r := h.get("/"); r.status != http.StatusTeapot {
		t.Fatalf("with an ErrorHandler: %d %s", r.status, r.body)
	}
	err := <-errs
	if !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sluice.ErrGrantUnsupported) || !errors.Is(err, sluice.ErrInvalidLimit) || errors.Is(err, ErrStore) {
		t.Errorf("ErrorHandler's err %v: want ErrInvalidConfig, sluice.ErrGrantUnsupported and sluice.ErrInvalidLimit, not ErrStore", err)
	}
}

// Behind package resilient, a limit the backend refuses at every request
// never opens the breaker nor gets the failure policy's answer: it is the
// caller's error, answered 500, while the backend keeps answering the
// other rules.
func TestRedisStoreRefusesRuleKeepsBreakerClosed(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	res, err := resilient.NewMulti(leaseEveryKey(t, clk), &resilient.Options{Policy: resilient.FailClosed, MinCalls: 5, FailureThreshold: 2, DeadAfter: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { res.Close() })
	e := newEnvStore(t, clk, res, []Rule{
		{Name: "log", Limit: sluice.PerMinute(3).WithAlgorithm(sluice.SlidingWindowLog), Key: Global(), Match: onPath("/log")},
		{Name: "api", Limit: sluice.PerMinute(100), Key: Global(), Match: onPath("/api")},
	}, nil)
	for range 10 {
		checkMisconfigured(t, e.get("/log"), `rule "log"`, "cannot grant")
	}
	if s := res.State(); s != sluice.BreakerClosed {
		t.Errorf("breaker %v after refused limits, want closed", s)
	}
	if r := e.get("/api"); r.status != 200 || r.header.Get(HeaderRateLimit) != `"api";r=99;t=1` {
		t.Errorf("/api: %d %q %s, want 200 from the backend", r.status, r.header.Get(HeaderRateLimit), r.body)
	}
	if n := e.obs.Get("log/error"); n != 10 {
		t.Errorf("observed %d log/error, want 10", n)
	}
}

// A store built without what it needs (a redisstore without a client, a
// zero memory store) is refused by New; one New cannot see through (a
// wrapper that hides it) fails every request the same way: a 500 naming
// the cause, not a 503 that tells clients to come back.
func TestStoreNotBuiltIs500(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	for name, store := range map[string]sluice.MultiStore{"redisstore": redisstore.New(nil, nil), "memory": &memory.Store{}} {
		rules := []Rule{{Name: "api", Limit: sluice.PerMinute(100), Key: Global()}}
		if _, err := New(store, rules, nil); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("%s: New: %v, want ErrInvalidConfig and ErrStoreNotBuilt", name, err)
		}
		e := newEnvStore(t, clk, struct{ sluice.MultiStore }{store}, []Rule{{Name: "api", Limit: sluice.PerMinute(100), Key: Global()}}, nil)
		r := e.get("/")
		checkMisconfigured(t, r, `rule "api"`, "store not built")
		if n := e.obs.Get("api/error"); n != 1 {
			t.Errorf("%s: observed %d api/error, want 1", name, n)
		}
	}
}

// A Reject rule (the default) with MaxDelay or Penalty set is refused,
// naming the field: either used to be ignored in silence, so a rule meant
// to delay or block only rejected.
func TestRuleSettingsOfAnotherStrategy(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	for field, r := range map[string]Rule{
		"MaxDelay":   {Name: "api", Limit: sluice.PerMinute(10), Key: Global(), MaxDelay: time.Second},
		"Penalty":    {Name: "api", Limit: sluice.PerMinute(10), Key: Global(), Penalty: time.Minute},
		"MaxWaiting": {Name: "api", Limit: sluice.PerMinute(10), Key: Global(), MaxWaiting: 8},
	} {
		if _, err := New(store, []Rule{r}, nil); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), field) {
			t.Errorf("a Reject rule with %s: %v, want ErrInvalidConfig naming it", field, err)
		}
	}
}

// New refuses a store that was never built, and NewTransport a zero
// Limiter: both used to be accepted and then answer every request with a
// 500 (or every round trip with an error).
func TestNewRefusesUnbuiltStore(t *testing.T) {
	t.Parallel()
	rules := []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: Global()}}
	for _, u := range unbuilt.Stores() {
		if m, err := New(u.Store, rules, nil); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("New(%s): %v, %v; want ErrInvalidConfig and ErrStoreNotBuilt", u.Name, m, err)
		}
		inflight := &Options{InFlight: []InFlightRule{{Name: "f", Limit: sluice.Concurrent(1, time.Second), Key: Global()}}}
		if m, err := New(u.Store, nil, inflight); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%s) with in-flight rules only: %v, %v; want ErrInvalidConfig", u.Name, m, err)
		}
	}
	if tr, err := NewTransport(&sluice.Limiter{}, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewTransport(zero Limiter): %v, %v; want ErrInvalidConfig", tr, err)
	}
	// A built limiter is accepted, and a round trip over a real listener
	// goes through.
	store := middlewaretest.Memory(t)
	lim, err := sluice.NewLimiter(store, sluice.PerMinute(10), nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTransport(lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(srv.Close)
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

// A nil *Middleware (New's error ignored) answers every request 500 with
// a problem naming the cause: it neither panics nor lets traffic through
// unlimited.
func TestNilMiddleware(t *testing.T) {
	t.Parallel()
	var m *Middleware
	var called atomic.Bool
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called.Store(true) })))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p Problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusInternalServerError || resp.Header.Get("Content-Type") != "application/problem+json" ||
		p.Status != 500 || !strings.Contains(p.Detail, "nil *httplimit.Middleware") {
		t.Errorf("nil Middleware: %d %q %+v; want 500 problem+json naming the nil Middleware", resp.StatusCode, resp.Header.Get("Content-Type"), p)
	}
	if called.Load() {
		t.Error("nil Middleware passed the request to its handler")
	}
}

// Requests the Transport cannot key, and a nil *Transport, fail with typed
// errors (and the body closed), as net/http's own transport does, rather
// than panicking.
func TestTransportBadInput(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	lim, err := sluice.NewLimiter(store, sluice.PerSecond(10), nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTransport(lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := &closeRecorder{Reader: strings.NewReader("payload")}
	if _, err := tr.RoundTrip(&http.Request{Body: body}); !errors.Is(err, ErrKey) {
		t.Errorf("RoundTrip with a nil URL = %v, want ErrKey", err)
	}
	if !body.closed.Load() {
		t.Error("request body not closed")
	}
	if _, err := tr.RoundTrip(nil); !errors.Is(err, ErrKey) {
		t.Errorf("RoundTrip(nil) = %v, want ErrKey", err)
	}
	var none *Transport
	if _, err := none.RoundTrip(&http.Request{URL: &url.URL{Scheme: "http", Host: "example.com"}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil Transport's RoundTrip = %v, want ErrInvalidConfig", err)
	}
	var zero Transport
	if _, err := zero.RoundTrip(&http.Request{URL: &url.URL{Scheme: "http", Host: "example.com"}}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("zero Transport's RoundTrip = %v, want ErrInvalidLimit", err)
	}
}
