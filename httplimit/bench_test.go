package httplimit

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
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

// TestMiddlewareAllocs: an allowed request on the memory store allocates
// what BenchmarkMiddlewareOverhead reports, no more: the key, and the two
// header values written. A check's request once escaped to the heap (a
// fourth allocation) because layered checks pass theirs to an interface.
func TestMiddlewareAllocs(t *testing.T) {
	store := memory.New(nil)
	defer store.Close()
	m, err := New(store, []Rule{{Name: "per-client", Limit: sluice.PerHour(1_000_000_000), Key: Header("X-Client")}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	r := newBenchRequest("client-1")
	w := &discardWriter{h: http.Header{}}
	h.ServeHTTP(w, r)
	if n := testing.AllocsPerRun(200, func() { clear(w.h); h.ServeHTTP(w, r) }); n > 3 {
		t.Errorf("%v allocations a request, want at most 3", n)
	}
}
