package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	io.WriteString(w, "ok")
})

// env is a middleware over a memory store on a fake clock, served by a real
// httptest server.
type env struct {
	t     *testing.T
	clk   *storetest.Clock
	store sluice.Store
	srv   *httptest.Server
	obs   *middlewaretest.Decisions
}

func newEnv(t *testing.T, rules []Rule, opts *Options) *env {
	t.Helper()
	clk := storetest.NewClock(t0)
	store := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	return newEnvStore(t, clk, store, rules, opts)
}

func newEnvStore(t *testing.T, clk *storetest.Clock, store sluice.Store, rules []Rule, opts *Options) *env {
	t.Helper()
	e := &env{t: t, clk: clk, store: store, obs: &middlewaretest.Decisions{}}
	var o Options
	if opts != nil {
		o = *opts
	}
	o.Clock = clk.Now
	o.Observer = e.obs
	m, err := New(store, rules, &o)
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(m.Handler(okHandler))
	t.Cleanup(e.srv.Close)
	return e
}

type response struct {
	status int
	header http.Header
	body   string
}

func (e *env) get(path string, header ...string) response {
	e.t.Helper()
	req, err := http.NewRequest("GET", e.srv.URL+path, nil)
	if err != nil {
		e.t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Add(header[i], header[i+1])
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		e.t.Fatal(err)
	}
	return response{resp.StatusCode, resp.Header, string(b)}
}

func TestHeadersAllowedAndDenied(t *testing.T) {
	t.Parallel()
	for _, set := range []HeaderSet{StandardHeaders, AllHeaders, NoHeaders} {
		t.Run(set.String(), func(t *testing.T) {
			t.Parallel()
			testHeaders(t, set)
		})
	}
}

func testHeaders(t *testing.T, set HeaderSet) {
	e := newEnv(t, []Rule{{Name: "api", Limit: sluice.PerMinute(2), Key: PeerIP()}}, &Options{AllowedHeaders: set})
	steps := []struct {
		status    int
		remaining string
		rateLimit string
		retry     string
		reset     int64
	}{
		{200, "1", `"api";r=1;t=30`, "", 30},
		{200, "0", `"api";r=0;t=60`, "", 60},
		{429, "0", `"api";r=0;t=30`, "30", 60},
	}
	for i, st := range steps {
		r := e.get("/")
		if r.status != st.status {
			t.Fatalf("request %d: status %d, want %d", i, r.status, st.status)
		}
		want := map[string]string{
			HeaderLimit:           "2",
			HeaderRemaining:       st.remaining,
			HeaderRateLimitPolicy: `"api";q=2;w=60`,
			HeaderRateLimit:       st.rateLimit,
			HeaderRetryAfter:      st.retry,
			HeaderReset:           strconv.FormatInt(t0.Unix()+st.reset, 10),
		}
		if st.status == 200 && set != AllHeaders {
			want[HeaderLimit], want[HeaderRemaining], want[HeaderReset] = "", "", ""
			if set == NoHeaders {
				want[HeaderRateLimitPolicy], want[HeaderRateLimit] = "", ""
			}
		}
		for k, want := range want {
			if got := r.header.Get(k); got != want {
				t.Errorf("request %d: %s = %q, want %q", i, k, got, want)
			}
		}
	}
	r := e.get("/")
	if got, want := r.header.Get("Content-Type"), "application/problem+json"; got != want {
		t.Errorf("Content-Type %q, want %q", got, want)
	}
	var p Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("body %q: %v", r.body, err)
	}
	if p.Status != 429 || p.Policy != "api" || p.RetryAfter != 30 || !strings.Contains(p.Detail, `"api"`) {
		t.Errorf("problem = %+v", p)
	}
	if got := e.obs.Get("api/denied"); got != 2 {
		t.Errorf("observed %d denials, want 2", got)
	}
}

func TestParseHeaderSet(t *testing.T) {
	for _, s := range []HeaderSet{StandardHeaders, AllHeaders, NoHeaders} {
		if got, err := ParseHeaderSet(s.String()); err != nil || got != s {
			t.Errorf("ParseHeaderSet(%q) = %v, %v", s, got, err)
		}
	}
	if _, err := ParseHeaderSet("x-only"); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("ParseHeaderSet(x-only): %v, want ErrInvalidConfig", err)
	}
}

// retryLimits are limits whose waits are mostly not whole seconds.
var retryLimits = []sluice.Limit{
	sluice.PerSecond(3),
	sluice.PerMinute(7),
	{Rate: 10, Period: 90 * time.Second, Burst: 4},
	{Algorithm: sluice.TokenBucket, Rate: 5, Period: 7 * time.Second},
	{Algorithm: sluice.LeakyBucket, Rate: 13, Period: time.Minute},
	{Algorithm: sluice.FixedWindow, Rate: 3, Period: 10 * time.Second},
	{Algorithm: sluice.SlidingWindowLog, Rate: 4, Period: 11 * time.Second},
	{Algorithm: sluice.SlidingWindowCounter, Rate: 6, Period: 13 * time.Second},
}

// A client that waits exactly Retry-After seconds is admitted, for every
// algorithm.
func TestRetryAfterIsEnough(t *testing.T) {
	t.Parallel()
	for _, lim := range retryLimits {
		t.Run(lim.String(), func(t *testing.T) {
			t.Parallel()
			checkRetryAfter(t, newEnv(t, []Rule{{Name: "p", Limit: lim, Key: PeerIP()}}, nil))
		})
	}
}

// checkRetryAfter drives a client that, whenever denied, waits exactly
// Retry-After (on the fake clock) and tries again: it must be admitted.
func checkRetryAfter(t *testing.T, e *env) {
	t.Helper()
	e.clk.Advance(123457 * time.Microsecond) // off any window edge
	denied := 0
	for i := 0; i < 60 && denied < 12; i++ {
		r := e.get("/")
		if r.status == 200 {
			e.clk.Advance(time.Duration(i%3) * 100 * time.Millisecond)
			continue
		}
		denied++
		secs, err := strconv.Atoi(r.header.Get(HeaderRetryAfter))
		if err != nil || secs < 1 {
			t.Fatalf("Retry-After %q", r.header.Get(HeaderRetryAfter))
		}
		e.clk.Advance(time.Duration(secs) * time.Second)
		if r := e.get("/"); r.status != 200 {
			t.Fatalf("after waiting Retry-After %ds: status %d", secs, r.status)
		}
	}
	if denied == 0 {
		t.Fatal("never denied: the test proves nothing")
	}
}

type ctxKey struct{}

func withUser(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u := r.Header.Get("X-User"); u != "" {
			r = r.WithContext(context.WithValue(r.Context(), ctxKey{}, u))
		}
		next.ServeHTTP(w, r)
	})
}

// Layered limits: a request denied by one consumes nothing from the others.
func TestLayeredLimitsLeakNothing(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	store := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	user := sluice.PerMinute(10)
	login := sluice.PerMinute(3).WithAlgorithm(sluice.SlidingWindowLog)
	rules := []Rule{
		{Name: "user", Limit: user, Key: ContextValue(ctxKey{})},
		{Name: "login-ip", Limit: login, Key: PeerIP(), Match: func(r *http.Request) bool { return r.URL.Path == "/login" }},
	}
	m, err := New(store, rules, &Options{Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(withUser(m.Handler(okHandler)))
	t.Cleanup(srv.Close)
	e := &env{t: t, clk: clk, store: store, srv: srv}
	for i := range 8 {
		r := e.get("/login", "X-User", "alice")
		if want := 200; i >= 3 {
			want = 429
			if r.status != want || !strings.Contains(r.body, `"login-ip"`) {
				t.Fatalf("login %d: %d %s", i, r.status, r.body)
			}
		} else if r.status != want {
			t.Fatalf("login %d: %d", i, r.status)
		}
	}
	// alice made 8 requests; only the 3 admitted ones count against her.
	d, err := store.Peek(context.Background(), "httplimit:v3:user@01257885:alice", user, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.Remaining, int64(7); got != want {
		t.Errorf("user remaining %d, want %d: denied requests leaked quota", got, want)
	}
	// The headers of an allowed request report the rule closest to exhaustion.
	r := e.get("/other", "X-User", "alice")
	if got, want := r.header.Get(HeaderRateLimit), `"user";r=6;t=24`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
}

func TestClosestToExhaustionReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []Rule{
		{Name: "big", Limit: sluice.PerMinute(100), Key: PeerIP()},
		{Name: "small", Limit: sluice.PerMinute(4), Key: PeerIP()},
		{Name: "shadow", Limit: sluice.PerMinute(1), Key: PeerIP(), Strategy: Shadow},
	}, nil)
	r := e.get("/")
	if got, want := r.header.Get(HeaderRateLimitPolicy), `"small";q=4;w=60`; got != want {
		t.Errorf("RateLimit-Policy %q, want %q", got, want)
	}
}

func TestPerRouteCost(t *testing.T) {
	t.Parallel()
	cost := func(r *http.Request) int64 {
		if r.URL.Path == "/search" {
			return 5
		}
		return 1
	}
	e := newEnv(t, []Rule{{Name: "credits", Limit: sluice.PerMinute(12), Key: PeerIP(), Cost: cost}}, nil)
	for i, st := range []struct {
		path      string
		status    int
		remaining string
	}{
		{"/search", 200, "7"},
		{"/search", 200, "2"},
		{"/search", 429, "2"},
		{"/item", 200, "1"},
		{"/item", 200, "0"},
	} {
		r := e.get(st.path)
		if got := remainingOf(r.header); r.status != st.status || got != st.remaining {
			t.Errorf("step %d %s: %d remaining %s, want %d %s", i, st.path, r.status, got, st.status, st.remaining)
		}
	}
}

// remainingOf is the r parameter of the RateLimit field, which allowed
// responses carry by default.
func remainingOf(h http.Header) string {
	for _, p := range strings.Split(h.Get(HeaderRateLimit), ";") {
		if v, ok := strings.CutPrefix(p, "r="); ok {
			return v
		}
	}
	return ""
}

// A cost below 1 is the cost function's fault, not the client's: 500,
// observed as the rule's error (it was not observed at all), as is a key
// function's failure. (A cost above the capacity is the client's: see
// TestRedisCostOverCapacity.)
func TestBadCostAtRequestTime(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []Rule{
		{Name: "c", Limit: sluice.PerMinute(3), Key: PeerIP(), Cost: func(*http.Request) int64 { return 0 }},
		{Name: "other", Limit: sluice.PerMinute(3), Key: Global()},
	}, nil)
	if r := e.get("/"); r.status != 500 || !strings.Contains(r.body, "misconfigured") {
		t.Errorf("cost 0: %d %s", r.status, r.body)
	}
	if n, others := e.obs.Get("c/error"), e.obs.Get("other/allowed")+e.obs.Get("other/error"); n != 1 || others != 0 {
		t.Errorf("cost 0: observed c/error %d, other %d; want 1 and 0", n, others)
	}
	e = newEnv(t, []Rule{{Name: "k", Limit: sluice.PerMinute(3), Key: func(*http.Request) (string, error) { return "", errors.New("boom") }}}, nil)
	if r := e.get("/"); r.status != 500 || e.obs.Get("k/error") != 1 {
		t.Errorf("a failing key function: %d, observed k/error %d; want 500 and 1", r.status, e.obs.Get("k/error"))
	}
}

// A store that fails is a 503 saying when to come back.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	e := newEnvStore(t, storetest.NewClock(t0), storetest.Down{}, []Rule{{Name: "d", Limit: sluice.PerMinute(3), Key: PeerIP()}}, nil)
	if r := e.get("/"); r.status != 503 || r.header.Get("Retry-After") != "1" || !strings.Contains(r.body, "unavailable") {
		t.Errorf("store down: %d %v %s; want 503, Retry-After 1", r.status, r.header, r.body)
	}
}

func TestExemptAndNoKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []Rule{
		{Name: "key", Limit: sluice.PerMinute(1), Key: Header("X-API-Key")},
	}, &Options{Exempt: func(r *http.Request) bool { return r.URL.Path == "/healthz" }})
	for range 3 {
		if r := e.get("/healthz", "X-API-Key", "k1"); r.status != 200 || r.header.Get(HeaderRateLimit) != "" {
			t.Fatalf("exempt: %d %v", r.status, r.header)
		}
		if r := e.get("/anonymous"); r.status != 200 {
			t.Fatalf("no key: %d", r.status)
		}
	}
	if r := e.get("/", "X-API-Key", "k1"); r.status != 200 {
		t.Fatalf("first keyed: %d", r.status)
	}
	if r := e.get("/", "X-API-Key", "k1"); r.status != 429 {
		t.Fatalf("second keyed: %d", r.status)
	}
	if r := e.get("/", "X-API-Key", "k2"); r.status != 200 {
		t.Fatalf("other key: %d", r.status)
	}
}

func TestCustomDenyHandler(t *testing.T) {
	t.Parallel()
	deny := func(w http.ResponseWriter, r *http.Request, d Denial) {
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, "slow down, policy "+d.Policy)
	}
	e := newEnv(t, []Rule{{Name: "api", Limit: sluice.PerMinute(1), Key: PeerIP()}}, &Options{DenyHandler: deny})
	e.get("/")
	r := e.get("/")
	if r.status != http.StatusTeapot || r.body != "slow down, policy api" || r.header.Get(HeaderRetryAfter) != "60" {
		t.Errorf("custom denial: %d %q Retry-After %q", r.status, r.body, r.header.Get(HeaderRetryAfter))
	}
}

// Shadow rules decide and record but never block, and set no headers.
func TestShadow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []Rule{{Name: "dark", Limit: sluice.PerMinute(2), Key: PeerIP(), Strategy: Shadow}}, nil)
	for i := range 5 {
		if r := e.get("/"); r.status != 200 || r.header.Get(HeaderRateLimit) != "" {
			t.Fatalf("request %d: %d, RateLimit %q", i, r.status, r.header.Get(HeaderRateLimit))
		}
	}
	if a, d := e.obs.Get("dark/allowed"), e.obs.Get("dark/shadow_denied"); a != 2 || d != 3 {
		t.Errorf("shadow recorded %d allowed, %d shadow-denied; want 2, 3", a, d)
	}
}

// Penalty: after a violation the key is blocked for the penalty, even once
// the limit itself would admit again; other keys are untouched.
func TestPenalty(t *testing.T) {
	t.Parallel()
	e := newEnv(t, []Rule{{Name: "otp", Limit: sluice.PerMinute(2), Key: Header("X-Phone"), Strategy: Penalty, Penalty: time.Hour}}, nil)
	steps := []struct {
		advance time.Duration
		phone   string
		status  int
		retry   string
	}{
		{0, "1", 200, ""},
		{0, "1", 200, ""},
		{0, "1", 429, "3600"}, // violation: the block starts
		{time.Minute, "1", 429, "3540"},
		{0, "2", 200, ""},
		{58 * time.Minute, "1", 429, "60"},
		{time.Minute - time.Second, "1", 429, "1"},
		{time.Second, "1", 200, ""},
	}
	for i, st := range steps {
		e.clk.Advance(st.advance)
		r := e.get("/otp", "X-Phone", st.phone)
		if r.status != st.status || r.header.Get(HeaderRetryAfter) != st.retry {
			t.Errorf("step %d: %d Retry-After %q, want %d %q", i, r.status, r.header.Get(HeaderRetryAfter), st.status, st.retry)
		}
	}
}

// A block outlives a change of the rule's limit: a reload that tightens
// the limit (the counters start afresh under it) keeps its abusers
// blocked, on the same store.
func TestPenaltyOutlivesLimitChange(t *testing.T) {
	t.Parallel()
	rule := Rule{Name: "otp", Limit: sluice.PerMinute(2), Key: Header("X-Phone"), Strategy: Penalty, Penalty: time.Hour}
	e := newEnv(t, []Rule{rule}, nil)
	for i, want := range []int{200, 200, 429} {
		if r := e.get("/otp", "X-Phone", "1"); r.status != want {
			t.Fatalf("request %d: %d, want %d", i, r.status, want)
		}
	}
	rule.Limit = sluice.PerMinute(1)
	tight := newEnvStore(t, e.clk, e.store, []Rule{rule}, nil)
	if r := tight.get("/otp", "X-Phone", "1"); r.status != 429 || r.header.Get(HeaderRetryAfter) != "3600" {
		t.Errorf("blocked key under the tightened limit: %d Retry-After %q, want 429 3600", r.status, r.header.Get(HeaderRetryAfter))
	}
	if r := tight.get("/otp", "X-Phone", "2"); r.status != 200 {
		t.Errorf("another key under the tightened limit: %d, want 200", r.status)
	}
}

// Delay holds a request until quota is back when that is within MaxDelay,
// and rejects at once otherwise. Real time: the waits are short.
func TestDelay(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	for _, tt := range []struct {
		name     string
		limit    sluice.Limit
		maxDelay time.Duration
		want     int
	}{
		// One per 50ms: the second request waits for it.
		{"within-max", sluice.Limit{Rate: 20, Period: time.Second, Burst: 1}, 10 * time.Second, 200},
		// One per minute: the second would wait far past 1ms.
		{"past-max", sluice.Limit{Rate: 1, Period: time.Minute}, time.Millisecond, 429},
	} {
		t.Run(tt.name, func(t *testing.T) {
			m, err := New(store, []Rule{{Name: tt.name, Limit: tt.limit, Key: PeerIP(), Strategy: Delay, MaxDelay: tt.maxDelay}}, nil)
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(m.Handler(okHandler))
			defer srv.Close()
			e := &env{t: t, srv: srv}
			if r := e.get("/"); r.status != 200 {
				t.Fatalf("first: %d", r.status)
			}
			if r := e.get("/"); r.status != tt.want {
				t.Fatalf("second: %d, want %d", r.status, tt.want)
			}
		})
	}
}

// A Delay wait ends with the request's context.
func TestDelayHonoursContext(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	m, err := New(store, []Rule{{Name: "d", Limit: sluice.PerHour(1), Key: Global(), Strategy: Delay, MaxDelay: 2 * time.Hour}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(okHandler)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
	// The context ends while the request waits out its hour's delay.
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	rec := httptest.NewRecorder()
	start := time.Now()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	if rec.Code != 429 || time.Since(start) > time.Minute {
		t.Errorf("delayed request whose context ended: %d after %v, want 429 at once", rec.Code, time.Since(start))
	}
}

func TestHashKey(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	m, err := New(store, []Rule{{Name: "ip", Limit: sluice.PerMinute(1), Key: PeerIP(), Strategy: Penalty, Penalty: time.Minute}}, &Options{HashKey: []byte("secret")})
	if err != nil {
		t.Fatal(err)
	}
	keys := func(m *Middleware, ip string) (string, string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = ip + ":1234"
		cs, err := m.rules.Collect(r, nil)
		if err != nil || len(cs) != 1 {
			t.Fatalf("Collect = %v, %v; want one check", cs, err)
		}
		return cs[0].Key, cs[0].PenaltyKey
	}
	k1, p1 := keys(m, "192.0.2.1")
	k2, _ := keys(m, "192.0.2.2")
	if strings.Contains(k1, "192.0.2.1") || strings.Contains(p1, "192.0.2.1") {
		t.Errorf("raw IP in key %q / %q", k1, p1)
	}
	if k1 == k2 || k1 == p1 || !strings.HasPrefix(k1, "httplimit:v3:ip@a2e6a799#") {
		t.Errorf("keys %q, %q, penalty %q", k1, k2, p1)
	}
	if again, _ := keys(m, "192.0.2.1"); again != k1 {
		t.Errorf("hash not stable: %q vs %q", again, k1)
	}
	other, err := New(store, []Rule{{Name: "ip", Limit: sluice.PerMinute(1), Key: PeerIP()}}, &Options{HashKey: []byte("other")})
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := keys(other, "192.0.2.1"); k == k1 {
		t.Error("different secrets give the same key")
	}
}

// Bad input at request time: malformed and enormous headers are keyed
// safely (never a 5xx, never a way around the limit).
func TestHostileHeaders(t *testing.T) {
	t.Parallel()
	ip, err := ClientIP(&IPOptions{TrustedProxies: []string{"127.0.0.1"}})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnv(t, []Rule{
		{Name: "ip", Limit: sluice.PerMinute(1000), Key: ip},
		{Name: "key", Limit: sluice.PerMinute(2), Key: Header("X-API-Key")},
	}, nil)
	huge := strings.Repeat("k", 200_000)
	for i, st := range []struct {
		header []string
		status int
	}{
		{[]string{"X-Forwarded-For", "not an ip, , ,,,"}, 200},
		{[]string{"X-Forwarded-For", strings.Repeat("1.2.3.4,", 20_000)}, 200},
		{[]string{"X-Forwarded-For", "[::1, for=\"_x\", 999.1.1.1:80"}, 200},
		{[]string{"Forwarded", "for=1.2.3.4"}, 200},
		{[]string{"X-API-Key", huge}, 200},
		{[]string{"X-API-Key", huge}, 200},
		{[]string{"X-API-Key", huge}, 429}, // the hashed huge key is limited like any other
		{[]string{"X-API-Key", "\xff\xfe binary"}, 200},
	} {
		r := e.get("/", st.header...)
		if r.status != st.status {
			t.Errorf("step %d: status %d, want %d (%.80s)", i, r.status, st.status, r.body)
		}
	}
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	ok := Rule{Name: "ok", Limit: sluice.PerSecond(1), Key: PeerIP()}
	with := func(f func(*Rule)) []Rule { r := ok; f(&r); return []Rule{r} }
	tests := []struct {
		name  string
		store sluice.Store
		rules []Rule
		opts  *Options
	}{
		{"nil store", nil, []Rule{ok}, nil},
		{"no rules", store, nil, nil},
		{"empty rules", store, []Rule{}, nil},
		{"zero rule", store, []Rule{{}}, nil},
		{"no name", store, with(func(r *Rule) { r.Name = "" }), nil},
		{"bad name", store, with(func(r *Rule) { r.Name = "a\x00b" }), nil},
		{"long name", store, with(func(r *Rule) { r.Name = strings.Repeat("n", 1025) }), nil},
		{"no key", store, with(func(r *Rule) { r.Key = nil }), nil},
		{"bad limit", store, with(func(r *Rule) { r.Limit = sluice.Limit{Rate: -1} }), nil},
		{"delay without max", store, with(func(r *Rule) { r.Strategy = Delay }), nil},
		{"penalty without duration", store, with(func(r *Rule) { r.Strategy = Penalty }), nil},
		{"unknown strategy", store, with(func(r *Rule) { r.Strategy = 42 }), nil},
		{"duplicate names", store, []Rule{ok, ok}, nil},
		{"layered on a plain store", plainStore{store}, []Rule{ok, {Name: "two", Limit: sluice.PerSecond(1), Key: PeerIP()}}, nil},
		{"long prefix", store, []Rule{ok}, &Options{Prefix: strings.Repeat("p", 129)}},
		{"long prefix in bytes", store, []Rule{ok}, &Options{Prefix: strings.Repeat("é", 65)}},
		{"unknown header set", store, []Rule{ok}, &Options{AllowedHeaders: NoHeaders + 1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.store, tt.rules, tt.opts); !errors.Is(err, ErrInvalidConfig) {
				t.Errorf("New = %v, want ErrInvalidConfig", err)
			}
		})
	}
	if _, err := New(store, []Rule{ok}, &Options{Prefix: strings.Repeat("p", 128)}); err != nil {
		t.Errorf("128-byte prefix: %v", err)
	}
	if _, err := New(plainStore{store}, []Rule{ok, {Name: "s", Limit: sluice.PerSecond(1), Key: PeerIP(), Strategy: Shadow}}, nil); err != nil {
		t.Errorf("one enforcing rule and a shadow on a plain store: %v", err)
	}
	if _, err := ClientIP(&IPOptions{TrustedProxies: []string{"10.0.0.0/33"}}); err == nil {
		t.Error("bad CIDR accepted")
	}
	if _, err := ClientIP(&IPOptions{IPv6Prefix: 129}); err == nil {
		t.Error("bad prefix accepted")
	}
	if _, err := ClientIP(&IPOptions{Header: "X-Real-IP"}); err == nil {
		t.Error("unknown header accepted")
	}
}

type plainStore struct{ sluice.Store }

// MaxWaiting reaches the engine (whose tests hold requests against it).
func TestMaxWaitingPassedOn(t *testing.T) {
	t.Parallel()
	store := memory.New(&memory.Options{SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	m, err := New(store, []Rule{{Name: "d", Limit: sluice.PerSecond(1), Key: Global(), Strategy: Delay, MaxDelay: time.Second, MaxWaiting: 7}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.rules.Spec(0).MaxWaiting; got != 7 {
		t.Errorf("MaxWaiting %d, want 7", got)
	}
	if _, err := New(store, []Rule{{Name: "d", Limit: sluice.PerSecond(1), Key: Global(), Strategy: Delay, MaxDelay: time.Second, MaxWaiting: -1}}, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("negative MaxWaiting: %v, want ErrInvalidConfig", err)
	}
}

// RateLimit-Policy states a window algorithm's quota per its Period, even
// where a unit's Interval rounds (faster than one unit per µs).
func TestPolicyWindow(t *testing.T) {
	t.Parallel()
	for limit, want := range map[sluice.Limit]string{
		{Algorithm: sluice.FixedWindow, Rate: 3_000_000, Period: time.Second}:          `"w";q=3000000;w=1`,
		{Algorithm: sluice.FixedWindow, Rate: 1_000_000_000, Period: time.Millisecond}: `"w";q=1000000000000;w=1`,
		{Algorithm: sluice.SlidingWindowCounter, Rate: 100, Period: time.Minute}:       `"w";q=100;w=60`,
		{Algorithm: sluice.SlidingWindowLog, Rate: 3, Period: time.Second}:             `"w";q=3;w=1`,
	} {
		e := newEnv(t, []Rule{{Name: "w", Limit: limit, Key: Global()}}, nil)
		if got := e.get("/").header.Get("RateLimit-Policy"); got != want {
			t.Errorf("%v: RateLimit-Policy %s, want %s", limit, got, want)
		}
	}
}

// A zero Middleware has no rules: its Handler passes every request through.
func TestZeroMiddleware(t *testing.T) {
	t.Parallel()
	var m Middleware
	rec := httptest.NewRecorder()
	m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != 204 || len(rec.Header()) != 0 {
		t.Errorf("zero Middleware: %d %v, want 204 and no headers", rec.Code, rec.Header())
	}
}

// TestLease: the middleware takes a lease.Store as it takes any store. On
// a frozen clock, grants of 4 units of 10/min answer one request in four
// from the store and the others from the lease; X-RateLimit-Remaining is
// the key's figure (the store's at the grant plus what the lease has not
// spent: in one process, what an exact limiter says), Reset the grant's
// reset, and the eleventh request is refused until the next unit.
func TestLease(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	mem := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	ls, err := lease.New(mem, &lease.Options{MaxStaleness: time.Second, Size: 4, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvStore(t, clk, ls, []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: Global()}}, &Options{AllowedHeaders: AllHeaders})
	steps := []struct {
		status           int
		remaining, reset int64 // reset: seconds after t0
		retry            string
	}{
		{200, 9, 24, ""}, {200, 8, 24, ""}, {200, 7, 24, ""}, {200, 6, 24, ""},
		{200, 5, 48, ""}, {200, 4, 48, ""}, {200, 3, 48, ""}, {200, 2, 48, ""},
		{200, 1, 60, ""}, {200, 0, 60, ""}, // a partial grant: 2 units left
		{429, 0, 60, "6"},
	}
	for i, st := range steps {
		r := e.get("/")
		for k, want := range map[string]string{
			"status":         strconv.Itoa(st.status),
			HeaderLimit:      "10",
			HeaderRemaining:  strconv.FormatInt(st.remaining, 10),
			HeaderReset:      strconv.FormatInt(t0.Unix()+st.reset, 10),
			HeaderRetryAfter: st.retry,
		} {
			got := r.header.Get(k)
			if k == "status" {
				got = strconv.Itoa(r.status)
			}
			if got != want {
				t.Errorf("request %d: %s = %q, want %q", i+1, k, got, want)
			}
		}
	}
	if st := ls.Stats(); st.Local != 7 || st.Grants != 4 || st.Granted != 10 {
		t.Errorf("lease stats %+v, want 7 local decisions and 10 units in 4 grants", st)
	}
}

// TestNilNextHandler: Handler(nil) serves http.DefaultServeMux behind the
// rules, as http.Server does with a nil Handler, instead of panicking on
// every request.
func TestNilNextHandler(t *testing.T) {
	m, err := New(memory.New(nil), []Rule{{Name: "api", Limit: sluice.PerMinute(1), Key: PeerIP()}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(nil))
	defer srv.Close()
	for i, want := range []int{http.StatusNotFound, http.StatusTooManyRequests} { // the default mux has no routes here
		resp, err := http.Get(srv.URL + "/nowhere")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("request %d: status %d, want %d", i, resp.StatusCode, want)
		}
	}
}
