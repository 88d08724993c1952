package httplimit

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// benchKeys is the number of distinct clients in the middleware benchmarks.
const benchKeys = 10_000

func benchMiddleware(b *testing.B, store *memory.Store, opts *Options) *Middleware {
	b.Helper()
	m, err := New(store, []Rule{{
		Name:  "per-client",
		Limit: sluice.PerHour(1_000_000_000), // never denies: the cost of a check is measured
		Key:   Header("X-Client"),
	}}, opts)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

func clientIDs() []string {
	ids := make([]string, benchKeys)
	for i := range ids {
		ids[i] = fmt.Sprintf("client-%05d", i)
	}
	return ids
}

// checkKeySet asserts the store holds exactly the keys the benchmark claims.
func checkKeySet(b *testing.B, store *memory.Store, want int) {
	b.Helper()
	if got := store.Len(); got != want {
		b.Fatalf("store holds %d keys, the benchmark claims %d", got, want)
	}
}

// BenchmarkMiddlewareRatio serves the same trivial handler bare and behind
// the middleware (memory store, 10,000 clients, one rule) over loopback
// HTTP with keep-alive, from 8 goroutines, and reports limited/bare
// requests per second as "ratio". The two alternate in 20 rounds of b.N/10
// requests each, so that a change in the machine's load affects both.
//
// "default" sends the two standard rate-limit fields on allowed responses,
// "all-headers" all five, "no-allowed-headers" none. The differences are
// the cost of the fields, written by the server and parsed by the client on
// the same machine.
//
//	go test -run '^$' -bench MiddlewareRatio -benchtime 20000x ./httplimit/
func BenchmarkMiddlewareRatio(b *testing.B) {
	b.Run("default", func(b *testing.B) { benchRatio(b, nil) })
	b.Run("all-headers", func(b *testing.B) { benchRatio(b, &Options{AllowedHeaders: AllHeaders}) })
	b.Run("no-allowed-headers", func(b *testing.B) { benchRatio(b, &Options{AllowedHeaders: NoHeaders}) })
}

func benchRatio(b *testing.B, opts *Options) {
	store := memory.New(nil)
	defer store.Close()
	m := benchMiddleware(b, store, opts)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	bare := httptest.NewServer(ok)
	defer bare.Close()
	limited := httptest.NewServer(m.Handler(ok))
	defer limited.Close()
	ids := clientIDs()
	const workers = 8
	transport := &http.Transport{MaxIdleConnsPerHost: workers}
	defer transport.CloseIdleConnections()
	client := &http.Client{Transport: transport}

	run := func(url string, n int) time.Duration {
		var next atomic.Int64
		var wg sync.WaitGroup
		start := time.Now()
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := next.Add(1) - 1
					if i >= int64(n) {
						return
					}
					req, _ := http.NewRequest("GET", url, nil)
					req.Header.Set("X-Client", ids[i%benchKeys])
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 {
						b.Errorf("status %d", resp.StatusCode)
						return
					}
				}
			}()
		}
		wg.Wait()
		return time.Since(start)
	}
	run(bare.URL, 2*workers) // open the connections
	run(limited.URL, benchKeys)
	b.ReportAllocs()
	b.ResetTimer()
	const rounds = 20
	chunk := max(b.N/10, 1)
	var tBare, tLimited time.Duration
	for i := range rounds {
		if i%2 == 0 { // alternate which goes first
			tBare += run(bare.URL, chunk)
			tLimited += run(limited.URL, chunk)
		} else {
			tLimited += run(limited.URL, chunk)
			tBare += run(bare.URL, chunk)
		}
	}
	b.StopTimer()
	checkKeySet(b, store, benchKeys)
	n := float64(rounds * chunk)
	b.ReportMetric(float64(tBare)/float64(tLimited), "ratio")
	b.ReportMetric(n/tBare.Seconds(), "bare-req/s")
	b.ReportMetric(n/tLimited.Seconds(), "limited-req/s")
	b.ReportMetric(float64(tLimited)/n, "ns/op")
}

// BenchmarkMiddlewareOverhead is the middleware's own cost per request,
// without a network: ServeHTTP on a recorder, 10,000 clients.
func BenchmarkMiddlewareOverhead(b *testing.B) {
	ids := clientIDs()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {})
	for _, tt := range []struct {
		name    string
		limited bool
	}{{"bare", false}, {"limited", true}} {
		b.Run(tt.name, func(b *testing.B) {
			store := memory.New(nil)
			defer store.Close()
			var h http.Handler = ok
			if tt.limited {
				h = benchMiddleware(b, store, nil).Handler(ok)
				for _, id := range ids { // every key exists before timing
					h.ServeHTTP(httptest.NewRecorder(), newBenchRequest(id))
				}
			}
			reqs := make([]*http.Request, benchKeys)
			for i, id := range ids {
				reqs[i] = newBenchRequest(id)
			}
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				w := &discardWriter{h: http.Header{}}
				i := 0
				for pb.Next() {
					clear(w.h)
					h.ServeHTTP(w, reqs[i%benchKeys])
					i += 7
				}
			})
			b.StopTimer()
			if tt.limited {
				checkKeySet(b, store, benchKeys)
			}
		})
	}
}

func newBenchRequest(id string) *http.Request {
	r := httptest.NewRequest("GET", "/", nil)
	r.Header.Set("X-Client", id)
	return r
}

type discardWriter struct{ h http.Header }

func (w *discardWriter) Header() http.Header         { return w.h }
func (w *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (w *discardWriter) WriteHeader(int)             {}

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
