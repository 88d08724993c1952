package httplimit

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/storetest"
)

func TestRedisHeadersAndRetryAfter(t *testing.T) {
	t.Parallel()
	redistest.Each(t, func(t *testing.T, client redis.UniversalClient) {
		t.Parallel()
		for _, lim := range retryLimits {
			t.Run(lim.String(), func(t *testing.T) {
				t.Parallel()
				clk := storetest.NewClock(time.Now().Truncate(time.Second))
				store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clk.Now})
				checkRetryAfter(t, newEnvStore(t, clk, store, []Rule{{Name: "p", Limit: lim, Key: PeerIP()}}, nil))
			})
		}
		t.Run("headers", func(t *testing.T) {
			t.Parallel()
			clk := storetest.NewClock(time.Now().Truncate(time.Second))
			store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clk.Now})
			e := newEnvStore(t, clk, store, []Rule{{Name: "api", Limit: sluice.PerMinute(2), Key: PeerIP()}}, nil)
			for i, want := range []string{`"api";r=1;t=30`, `"api";r=0;t=60`, `"api";r=0;t=30`} {
				r := e.get("/")
				if got := r.header.Get(HeaderRateLimit); got != want {
					t.Errorf("request %d: RateLimit %q, want %q", i, got, want)
				}
				if i == 2 && (r.status != 429 || r.header.Get(HeaderRetryAfter) != "30") {
					t.Errorf("denial: %d, Retry-After %q", r.status, r.header.Get(HeaderRetryAfter))
				}
			}
		})
	})
}

// Layered limits on Redis leak no quota under concurrency: on the cluster
// the two keys live in different slots (take in turn, refund on denial); on
// the standalone server one script takes both.
func TestRedisLayeredNoLeak(t *testing.T) {
	t.Parallel()
	redistest.Each(t, func(t *testing.T, client redis.UniversalClient) {
		t.Parallel()
		store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
		account := sluice.PerHour(1000)
		rules := []Rule{
			{Name: "account", Limit: account, Key: Header("X-Account")},
			{Name: "ip", Limit: sluice.PerHour(25).WithAlgorithm(sluice.SlidingWindowLog), Key: PeerIP()},
		}
		e := newEnvStore(t, storetest.NewClock(time.Now()), store, rules, nil)
		var ok, denied atomic.Int64
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 10 {
					req, _ := http.NewRequest("GET", e.srv.URL, nil)
					req.Header.Set("X-Account", "acme")
					resp, err := e.srv.Client().Do(req)
					if err != nil {
						t.Error(err)
						return
					}
					resp.Body.Close()
					switch resp.StatusCode {
					case 200:
						ok.Add(1)
					case 429:
						denied.Add(1)
					default:
						t.Errorf("status %d", resp.StatusCode)
					}
				}
			}()
		}
		wg.Wait()
		if got := ok.Load(); got != 25 {
			t.Errorf("admitted %d, want exactly 25", got)
		}
		d, err := store.Peek(context.Background(), "httplimit:v3:account@db7dd091:acme", account, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := d.Remaining, account.Capacity()-ok.Load(); got != want {
			t.Errorf("account remaining %d, want %d: %d denied requests leaked quota", got, want, denied.Load())
		}
	})
}

// With HashKey, no raw client identity reaches Redis.
func TestRedisHashedKeys(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	prefix := redistest.Prefix(t)
	store := redisstore.New(client, &redisstore.Options{Prefix: prefix})
	e := newEnvStore(t, storetest.NewClock(time.Now()), store, []Rule{
		{Name: "ip", Limit: sluice.PerMinute(5), Key: PeerIP()},
		{Name: "key", Limit: sluice.PerMinute(5), Key: Header("X-API-Key"), Strategy: Penalty, Penalty: time.Minute},
	}, &Options{HashKey: []byte("a secret")})
	for range 7 {
		e.get("/", "X-API-Key", "sk_live_12345")
	}
	keys, err := client.Keys(context.Background(), prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) < 3 { // ip, key and the penalty block
		t.Fatalf("keys %q: expected the limits and the block", keys)
	}
	for _, k := range keys {
		if strings.Contains(k, "127.0.0.1") || strings.Contains(k, "sk_live") {
			t.Errorf("raw identity in Redis key %q", k)
		}
	}
}

// A dead Redis without a failure policy is an error response, at once;
// wrapped by resilient it is the policy's answer.
func TestRedisUnavailable(t *testing.T) {
	t.Parallel()
	client := downClient(t)
	rule := []Rule{{Name: "api", Limit: sluice.PerMinute(5), Key: PeerIP()}}
	clk := storetest.NewClock(time.Now())

	bare := newEnvStore(t, clk, redisstore.New(client, nil), rule, nil)
	if r := bare.get("/"); r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "unavailable") {
		t.Errorf("bare store: %d %q", r.status, r.body)
	}

	for _, tt := range []struct {
		policy resilient.Policy
		want   []int
	}{
		{resilient.FailOpen, []int{200, 200, 200, 200, 200, 200, 200}},
		{resilient.FailClosed, []int{429}},
		{resilient.FallbackLocal, []int{200, 200, 200, 200, 200, 429}},
	} {
		t.Run(tt.policy.String(), func(t *testing.T) {
			rs, err := resilient.NewMulti(redisstore.New(client, nil), &resilient.Options{Policy: tt.policy})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { rs.Close() })
			e := newEnvStore(t, clk, rs, rule, nil)
			for i, want := range tt.want {
				if r := e.get("/"); r.status != want {
					t.Errorf("request %d: %d, want %d", i, r.status, want)
				}
			}
		})
	}
}

// With Redis down and resilient's FailOpen answering, the rate-limit
// headers say what a fresh key's first request would: the unit taken
// comes back in 6s (t=6, X-RateLimit-Reset 6s on), not at once (t=0).
func TestRedisFailOpenHeaders(t *testing.T) {
	t.Parallel()
	client := downClient(t)
	clk := storetest.NewClock(t0)
	rs, err := resilient.NewMulti(redisstore.New(client, nil), &resilient.Options{Policy: resilient.FailOpen, Clock: clk.Now, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	e := newEnvStore(t, clk, rs, []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: PeerIP()}}, &Options{AllowedHeaders: AllHeaders})
	r := e.get("/")
	if r.status != http.StatusOK {
		t.Fatalf("status %d, want 200", r.status)
	}
	if got, want := r.header.Get(HeaderRateLimit), `"api";r=9;t=6`; got != want {
		t.Errorf("RateLimit %q, want %q", got, want)
	}
	if got, want := r.header.Get(HeaderReset), strconv.FormatInt(t0.Add(6*time.Second).Unix(), 10); got != want {
		t.Errorf("X-RateLimit-Reset %q, want %q", got, want)
	}
}

// A penalty started on one node blocks the key on every node sharing the
// Redis store: two middlewares stand for two processes of a fleet.
func TestRedisPenaltyAcrossFleet(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	prefix := redistest.Prefix(t)
	rule := []Rule{{Name: "otp", Limit: sluice.PerMinute(2), Key: Header("X-Phone"), Strategy: Penalty, Penalty: 10 * time.Minute}}
	var nodes [2]*env
	for i := range nodes {
		rs, err := resilient.NewMulti(redisstore.New(client, &redisstore.Options{Prefix: prefix, Clock: clk.Now}), &resilient.Options{Clock: clk.Now, Timeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { rs.Close() })
		nodes[i] = newEnvStore(t, clk, rs, rule, nil)
	}
	steps := []struct {
		node    int
		advance time.Duration
		status  int
		retry   string
	}{
		{0, 0, 200, ""},
		{1, 0, 200, ""},
		{0, 0, 429, "600"}, // the violation starts the block
		{1, 0, 429, "600"}, // seen by the other node
		{1, 2 * time.Minute, 429, "480"},
		{0, 8 * time.Minute, 200, ""},
	}
	for i, st := range steps {
		clk.Advance(st.advance)
		r := nodes[st.node].get("/otp", "X-Phone", "+15550100")
		if r.status != st.status || r.header.Get(HeaderRetryAfter) != st.retry {
			t.Errorf("step %d (node %d): %d Retry-After %q, want %d %q", i, st.node, r.status, r.header.Get(HeaderRetryAfter), st.status, st.retry)
		}
	}
}

// A store that fails is answered as for rate rules: 503 through the
// ErrorHandler, the request not served.
func TestInFlightStoreDown(t *testing.T) {
	t.Parallel()
	client := downClient(t)
	var served atomic.Bool
	e := slotEnv(t, redisstore.New(client, nil), nil, &Options{InFlight: oneAtATime},
		http.HandlerFunc(func(http.ResponseWriter, *http.Request) { served.Store(true) }))
	r := e.get("/")
	if r.status != http.StatusServiceUnavailable || !strings.Contains(r.body, "unavailable") || served.Load() {
		t.Errorf("Redis down: %d %q, served %v", r.status, r.body, served.Load())
	}
}

// downClient returns a client of a Redis server that has stopped.
func downClient(t *testing.T) *redis.Client {
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	srv.Stop()
	return client
}

// countHook counts the commands a go-redis client sends.
type countHook struct{ n *atomic.Int64 }

func (h countHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}
func (h countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(int64(len(cmds)))
		return next(ctx, cmds)
	}
}

// BenchmarkDenyCacheRedisCalls hammers one hot key (10/s) through the
// middleware on Redis wrapped by resilient, and reports Redis commands per
// denied request: the deny cache answers denials until the key's
// RetryAfter passes.
//
//	go test -run '^$' -bench DenyCacheRedisCalls ./httplimit/
func BenchmarkDenyCacheRedisCalls(b *testing.B) {
	client := redis.NewClient(&redis.Options{Addr: redistest.Addr(b)})
	defer client.Close()
	var calls atomic.Int64
	client.AddHook(countHook{&calls})
	rs, err := resilient.NewMulti(redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(b)}), &resilient.Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer rs.Close()
	m, err := New(rs, []Rule{{Name: "hot", Limit: sluice.PerSecond(10), Key: Global()}}, nil)
	if err != nil {
		b.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	req := httptest.NewRequest("GET", "/", nil)
	for { // exhaust the key, so that even b.N = 1 measures a denial
		w := &statusWriter{discardWriter: discardWriter{h: http.Header{}}, status: 200}
		if h.ServeHTTP(w, req); w.status == 429 {
			break
		}
	}
	calls.Store(0)
	var denied, allowed atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &statusWriter{discardWriter: discardWriter{h: http.Header{}}}
		for pb.Next() {
			clear(w.h)
			w.status = 200
			h.ServeHTTP(w, req)
			if w.status == 429 {
				denied.Add(1)
			} else {
				allowed.Add(1)
			}
		}
	})
	b.StopTimer()
	if denied.Load() == 0 {
		b.Fatal("nothing denied: the benchmark proves nothing")
	}
	b.ReportMetric(float64(calls.Load())/float64(denied.Load()), "redis-calls/denied")
	b.ReportMetric(float64(denied.Load())/float64(b.N), "denied/op")
}

type statusWriter struct {
	discardWriter
	status int
}

func (w *statusWriter) WriteHeader(s int) { w.status = s }

// While FallbackLocal answers (a real Redis server stopped), a response
// states one limit, this process's share: X-RateLimit-Limit and
// RateLimit-Policy's q agree. RateLimit-Policy used to keep the rule's 100
// beside a limit of 25. While Redis is up both say 100.
func TestFallbackHeadersStateTheShare(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	st, err := resilient.NewMulti(redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}),
		// A generous Timeout: on a loaded machine a first call (a dial, a
		// script load) may take longer than the default 50ms, and the
		// fallback would answer while Redis is up.
		&resilient.Options{Nodes: 4, Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, set := range []HeaderSet{AllHeaders, StandardHeaders} {
		t.Run(set.String(), func(t *testing.T) {
			mw, err := New(st, []Rule{{Name: "api", Limit: sluice.PerMinute(100), Key: Global()}}, &Options{AllowedHeaders: set, Prefix: set.String() + ":"})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
			t.Cleanup(ts.Close)
			get := func() http.Header {
				resp, err := http.Get(ts.URL)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.Header
			}
			if h := get(); h.Get(HeaderRateLimitPolicy) != `"api";q=100;w=60` || set == AllHeaders && h.Get(HeaderLimit) != "100" {
				t.Errorf("Redis up: Limit %q, Policy %q; want 100 in both", h.Get(HeaderLimit), h.Get(HeaderRateLimitPolicy))
			}
		})
	}
	srv.Stop()
	for _, set := range []HeaderSet{AllHeaders, StandardHeaders} {
		t.Run(set.String()+"/down", func(t *testing.T) {
			mw, err := New(st, []Rule{{Name: "api", Limit: sluice.PerMinute(100), Key: Global()}}, &Options{AllowedHeaders: set, Prefix: set.String() + "-down:"})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
			t.Cleanup(ts.Close)
			for i := range 27 { // the share is 25: two denials too
				resp, err := http.Get(ts.URL)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				h := resp.Header
				if h.Get(HeaderRateLimitPolicy) != `"api";q=25;w=60` {
					t.Errorf("request %d (%d), Redis down: Policy %q, want the share's q=25", i, resp.StatusCode, h.Get(HeaderRateLimitPolicy))
				}
				if l := h.Get(HeaderLimit); (set == AllHeaders || resp.StatusCode == http.StatusTooManyRequests) && l != "25" {
					t.Errorf("request %d (%d), Redis down: X-RateLimit-Limit %q, want 25", i, resp.StatusCode, l)
				}
			}
		})
	}
}
