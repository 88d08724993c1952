package httplimit

import (
	"net/http"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/timercount"
	"github.com/sluicehq/sluice/memory"
)

// BenchmarkInFlightHeld holds 10,000 requests at once under an in-flight
// rule (memory store, a key per client) and reports per request held: the
// bytes and allocations of its acquire, hold and release (B/req,
// allocs/req), the goroutines beside its own while all are held
// (goroutines/req), and the runtime timers made for it (timers/req,
// counted from a memory profile of one round). "bare" is the same round
// without the middleware; "observer" reports slot events (as metrics do),
// "no-observer" does not; "extending" holds each request 2.5 s under a
// 3 s hold, extended 2 or 3 times (with an observer).
//
//	go test -run '^$' -bench InFlightHeld -benchtime 5x ./httplimit/
func BenchmarkInFlightHeld(b *testing.B) {
	for _, tt := range []struct {
		name    string
		limited bool
		obs     bool
		hold    time.Duration
		held    time.Duration
	}{
		{"bare", false, false, time.Minute, 0},
		{"no-observer", true, false, time.Minute, 0},
		{"observer", true, true, time.Minute, 0},
		{"extending", true, true, 3 * time.Second, 2500 * time.Millisecond},
	} {
		b.Run(tt.name, func(b *testing.B) {
			store := memory.New(nil)
			defer store.Close()
			leave := make(chan struct{})
			var entered sync.WaitGroup
			var h http.Handler = http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
				entered.Done()
				<-leave
			})
			if tt.limited {
				var obs sluice.Observer
				if tt.obs {
					obs = slotObserverFunc(func(sluice.SlotEvent) {})
				}
				m, err := New(store, nil, &Options{Observer: obs, InFlight: []InFlightRule{{
					Name: "held", Limit: sluice.Concurrent(1, tt.hold), Key: Header("X-Client")}}})
				if err != nil {
					b.Fatal(err)
				}
				h = m.Handler(h)
			}
			ids := clientIDs()
			reqs := make([]*http.Request, benchKeys)
			for i, id := range ids {
				reqs[i] = newBenchRequest(id)
			}
			// round holds every request at once, then lets them go; it
			// returns the goroutines beside the requests' own while held.
			round := func() int {
				leave = make(chan struct{})
				var done sync.WaitGroup
				entered.Add(benchKeys)
				done.Add(benchKeys)
				before := runtime.NumGoroutine()
				for _, r := range reqs {
					go func() {
						defer done.Done()
						w := &discardWriter{h: http.Header{}}
						h.ServeHTTP(w, r)
						if w.h.Get(HeaderRetryAfter) != "" {
							b.Error("refused")
						}
					}()
				}
				entered.Wait()
				time.Sleep(tt.held)
				extra := runtime.NumGoroutine() - before - benchKeys
				close(leave)
				done.Wait()
				return extra
			}
			round() // warm: the keys exist, the pools are full
			timers := timercount.Of(func() { round() })
			runtime.GC()
			var m0, m1 runtime.MemStats
			runtime.ReadMemStats(&m0)
			b.ResetTimer()
			goroutines := 0
			for range b.N {
				goroutines += round()
			}
			b.StopTimer()
			runtime.ReadMemStats(&m1)
			n := float64(b.N * benchKeys)
			b.ReportMetric(float64(m1.TotalAlloc-m0.TotalAlloc)/n, "B/req")
			b.ReportMetric(float64(m1.Mallocs-m0.Mallocs)/n, "allocs/req")
			b.ReportMetric(float64(goroutines)/n, "goroutines/req")
			b.ReportMetric(float64(timers)/benchKeys, "timers/req")
		})
	}
}

// BenchmarkInFlightShort is requests that end at once under an observed
// in-flight rule (memory store, 10,000 clients, 8 goroutines a core): the
// cost of a hold that is never extended, with its timers.
//
//	go test -run '^$' -bench InFlightShort -benchtime 300000x ./httplimit/
func BenchmarkInFlightShort(b *testing.B) {
	store := memory.New(nil)
	defer store.Close()
	m, err := New(store, nil, &Options{Observer: slotObserverFunc(func(sluice.SlotEvent) {}), InFlight: []InFlightRule{{
		Name: "held", Limit: sluice.Concurrent(1000, time.Minute), Key: Header("X-Client")}}})
	if err != nil {
		b.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	reqs := make([]*http.Request, benchKeys)
	for i, id := range clientIDs() {
		reqs[i] = newBenchRequest(id)
	}
	b.ReportAllocs()
	b.SetParallelism(8)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := &discardWriter{h: http.Header{}}
		for i := 0; pb.Next(); i += 7 {
			h.ServeHTTP(w, reqs[i%benchKeys])
		}
	})
}
