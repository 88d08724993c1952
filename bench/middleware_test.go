package bench

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/didip/tollbooth/v8"
	tblimiter "github.com/didip/tollbooth/v8/limiter"
	"github.com/go-chi/httprate"
	vargohttp "github.com/sethvargo/go-limiter/httplimit"
	"github.com/sethvargo/go-limiter/memorystore"
	ulule "github.com/ulule/limiter/v3"
	ulstdlib "github.com/ulule/limiter/v3/drivers/middleware/stdlib"
	ulmemory "github.com/ulule/limiter/v3/drivers/store/memory"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memory"
)

// A middleware contender: wrap returns next behind a limiter of rate
// requests per hour, keyed by the client address, on an in-memory store.
type middleware struct {
	name string
	wrap func(tb testing.TB, rate int64, next http.Handler) http.Handler
}

func middlewares() []middleware {
	return []middleware{
		{"sluice-httplimit", func(tb testing.TB, rate int64, next http.Handler) http.Handler {
			store := memory.New(nil)
			tb.Cleanup(func() { store.Close() })
			m, err := httplimit.New(store, []httplimit.Rule{{Name: "api", Limit: sluice.PerHour(rate), Key: httplimit.PeerIP()}}, nil)
			if err != nil {
				tb.Fatal(err)
			}
			return m.Handler(next)
		}},
		{"go-chi-httprate", func(tb testing.TB, rate int64, next http.Handler) http.Handler {
			byIP := func(r *http.Request) (string, error) {
				host, _, err := net.SplitHostPort(r.RemoteAddr)
				return httprate.CanonicalizeIP(host), err
			}
			return httprate.LimitBy(int(rate), time.Hour, byIP)(next)
		}},
		{"ulule-limiter", func(tb testing.TB, rate int64, next http.Handler) http.Handler {
			l := ulule.New(ulmemory.NewStore(), ulule.Rate{Period: time.Hour, Limit: rate})
			return ulstdlib.NewMiddleware(l).Handler(next)
		}},
		{"sethvargo-go-limiter", func(tb testing.TB, rate int64, next http.Handler) http.Handler {
			store, err := memorystore.New(&memorystore.Config{Tokens: uint64(rate), Interval: time.Hour})
			if err != nil {
				tb.Fatal(err)
			}
			m, err := vargohttp.NewMiddleware(store, vargohttp.IPKeyFunc())
			if err != nil {
				tb.Fatal(err)
			}
			return m.Handle(next)
		}},
		{"tollbooth", func(tb testing.TB, rate int64, next http.Handler) http.Handler {
			l := tollbooth.NewLimiter(float64(rate)/3600, &tblimiter.ExpirableOptions{DefaultExpirationTTL: time.Hour})
			l.SetBurst(int(rate))
			l.SetIPLookup(tblimiter.IPLookup{Name: "RemoteAddr"})
			return tollbooth.LimitHandler(l, next)
		}},
	}
}

// sink is a ResponseWriter that keeps nothing but the status, reused by
// every iteration so that the benchmark measures the middleware, not a
// recorder.
type sink struct {
	h    http.Header
	code int
}

func (s *sink) Header() http.Header { return s.h }
func (s *sink) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
}
func (s *sink) Write(p []byte) (int, error) {
	s.WriteHeader(http.StatusOK)
	return len(p), nil
}

func (s *sink) reset() {
	clear(s.h)
	s.code = 0
}

var okHandler = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })

// BenchmarkMiddleware serves one request through each middleware, over and
// over, from one client: "allowed" under a limit that the run never
// reaches, "denied" under a limit exhausted before the run. Each case
// checks that every response it measured had the status it claims.
// "bare" is the handler alone. Summarise -count 10 runs with benchstat
// (see BENCHMARKS.md).
func BenchmarkMiddleware(b *testing.B) {
	req, err := http.NewRequest(http.MethodGet, "http://example.com/api", nil)
	if err != nil {
		b.Fatal(err)
	}
	req.RemoteAddr = "192.0.2.1:40000"
	run := func(b *testing.B, h http.Handler, want int) {
		w := &sink{h: http.Header{}}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			w.reset()
			h.ServeHTTP(w, req)
			if w.code != want {
				b.Fatalf("status %d, want %d", w.code, want)
			}
		}
	}
	b.Run("allowed/bare", func(b *testing.B) { run(b, okHandler, http.StatusOK) })
	for _, m := range middlewares() {
		b.Run("allowed/"+m.name, func(b *testing.B) {
			run(b, m.wrap(b, sluice.MaxRate, okHandler), http.StatusOK)
		})
	}
	for _, m := range middlewares() {
		b.Run("denied/"+m.name, func(b *testing.B) {
			h := m.wrap(b, 1, okHandler)
			h.ServeHTTP(&sink{h: http.Header{}}, req) // the one allowed request
			run(b, h, http.StatusTooManyRequests)
		})
	}
}
