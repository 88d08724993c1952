package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// A flood on a Delay rule holds at most MaxWaiting requests; every other
// request is refused at once, so goroutines and memory stay bounded however
// many arrive, and the held ones leave when their callers give up, with
// nothing written (no 429: nobody is there to read it).
//
// Not parallel: it counts the process's goroutines, so it runs alone.
func TestDelayFloodBounded(t *testing.T) {
	const (
		maxWaiting = 64
		wave       = 5000
		waves      = 3
		slack      = 50 // goroutines of the runtime and the test itself
	)
	clk := storetest.NewClock(t0) // stands still: nothing held is ever admitted
	store := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	m, err := New(store, []Rule{{
		Name: "d", Limit: sluice.PerSecond(1), Key: Global(), Strategy: Delay,
		MaxDelay: time.Hour, MaxWaiting: maxWaiting,
	}}, &Options{Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(okHandler)

	ctx, giveUp := context.WithCancel(context.Background())
	defer giveUp()
	var (
		wg       sync.WaitGroup
		finished atomic.Int64
		statusMu sync.Mutex
		status   = map[int]int{}
	)
	serve := func() {
		defer wg.Done()
		rec := &wroteStatus{ResponseWriter: httptest.NewRecorder()}
		h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, "GET", "/", nil))
		statusMu.Lock()
		status[rec.code]++
		statusMu.Unlock()
		finished.Add(1)
	}
	// settle waits until cond holds, polling; the flood's goroutines take
	// a moment to exit after they finish.
	settle := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: timed out (goroutines %d)", what, runtime.NumGoroutine())
			}
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}

	base := runtime.NumGoroutine()
	heapBase := heap()
	for w := 1; w <= waves; w++ {
		for range wave {
			wg.Add(1)
			go serve()
		}
		// All but the held ones finish: one admitted, the rest refused.
		settle("the refused requests to return", func() bool { return finished.Load() == int64(w*wave-maxWaiting) })
		settle("their goroutines to exit", func() bool { return runtime.NumGoroutine() <= base+maxWaiting+slack })
		if grown := int64(heap()) - int64(heapBase); grown > 8<<20 {
			t.Errorf("wave %d: heap grew %d bytes holding %d requests", w, grown, maxWaiting)
		}
	}
	statusMu.Lock()
	if got, want := status[http.StatusOK], 1; got != want {
		t.Errorf("admitted %d, want %d", got, want)
	}
	if got, want := status[http.StatusTooManyRequests], waves*wave-maxWaiting-1; got != want {
		t.Errorf("refused %d at once, want %d", got, want)
	}
	statusMu.Unlock()

	giveUp()
	wg.Wait()
	settle("the held requests' goroutines to exit", func() bool { return runtime.NumGoroutine() <= base+slack })
	if got, want := status[http.StatusTooManyRequests], waves*wave-maxWaiting-1; got != want {
		t.Errorf("refused %d in all, want %d", got, want)
	}
	if got := status[0]; got != maxWaiting {
		t.Errorf("%d answered nothing, want the %d held ones, given up", got, maxWaiting)
	}
}
