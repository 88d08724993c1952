package bench

import (
	"net/http"
	"testing"

	"github.com/sluicehq/sluice"
)

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
// "bare" is the handler alone. Besides ns/op it reports cpu-ns/op, the
// process's CPU time per request. Summarise 10 runs with benchstat (see
// BENCHMARKS.md).
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
		cpu := ProcessCPU()
		for range b.N {
			w.reset()
			h.ServeHTTP(w, req)
			if w.code != want {
				b.Fatalf("status %d, want %d", w.code, want)
			}
		}
		// CPU time, which other processes on a busy machine inflate far
		// less than the wall time of ns/op.
		b.ReportMetric(float64(ProcessCPU()-cpu)/float64(b.N), "cpu-ns/op")
	}
	b.Run("allowed/bare", func(b *testing.B) { run(b, okHandler, http.StatusOK) })
	wrap := func(b *testing.B, m Middleware, rate int64) http.Handler {
		h, stop, err := m.Wrap(rate, okHandler)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(stop)
		return h
	}
	for _, m := range Middlewares() {
		b.Run("allowed/"+m.Name, func(b *testing.B) {
			run(b, wrap(b, m, sluice.MaxRate), http.StatusOK)
		})
	}
	for _, m := range Middlewares() {
		b.Run("denied/"+m.Name, func(b *testing.B) {
			h := wrap(b, m, 1)
			h.ServeHTTP(&sink{h: http.Header{}}, req) // the one allowed request
			run(b, h, http.StatusTooManyRequests)
		})
	}
}
