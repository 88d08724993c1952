package httplimit

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/promsluice"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// heldGaugeEnv is a middleware with an in-flight rule "mw" over resilient
// over Redis, one collector observing both, serving a handler of 400ms to
// 16 clients until stop is called.
type heldGaugeEnv struct {
	redis *redistest.Server
	reg   *prometheus.Registry
	srv   *http.Server
	stop  func()
}

func startHeldGauge(t *testing.T, hold time.Duration) *heldGaugeEnv {
	t.Helper()
	e := &heldGaugeEnv{redis: redistest.StartServer(t)}
	client := redis.NewClient(&redis.Options{Addr: e.redis.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	col := promsluice.New(nil)
	e.reg = prometheus.NewRegistry()
	e.reg.MustRegister(col)
	store, err := resilient.NewMulti(redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}), &resilient.Options{Nodes: 1, Observer: col})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	m, err := New(store, []Rule{{Name: "rate", Limit: sluice.PerSecond(100000), Key: PeerIP()}}, &Options{Observer: col,
		InFlight: []InFlightRule{{Name: "mw", Limit: sluice.Concurrent(1000, hold), Key: Header("X-Key")}}})
	if err != nil {
		t.Fatal(err)
	}
	ln := redistest.Listen(t)
	e.srv = &http.Server{Handler: m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		time.Sleep(400 * time.Millisecond)
	}))}
	go e.srv.Serve(ln)
	t.Cleanup(func() { e.srv.Close() })
	done := make(chan struct{})
	var wg sync.WaitGroup
	hc := &http.Client{Timeout: 10 * time.Second}
	for i := range 16 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				req, _ := http.NewRequest("GET", "http://"+ln.Addr().String(), nil)
				req.Header.Set("X-Key", fmt.Sprint(i%2))
				if resp, err := hc.Do(req); err == nil {
					resp.Body.Close()
				} else {
					time.Sleep(10 * time.Millisecond)
				}
			}
		})
	}
	var once sync.Once
	e.stop = func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			// A connection dialed and never used holds Shutdown 5s.
			hc.CloseIdleConnections()
		})
	}
	t.Cleanup(e.stop)
	return e
}

func (e *heldGaugeEnv) value(t *testing.T, name string, labels map[string]string) float64 {
	t.Helper()
	v, _ := promtest.Value(t, e.reg, name, labels)
	return v
}

// sluice_inflight_held comes back to 0 once the releases that failed while
// Redis stalled have gone through: 16 clients hold requests, Redis stops
// (SIGSTOP), the server shuts down, and Redis comes back. Before
// resilient's breaker closed on release probes alone, the retries drained
// one per 3s, most giving up a backoff short of their 20s hold:
// WaitReleases returned after 15s with the gauge at 8 to 12 until the
// holds ended. Not parallel: WaitReleases counts the process's background
// releases.
func TestInFlightHeldGaugeAfterStall(t *testing.T) {
	const hold = 20 * time.Second
	e := startHeldGauge(t, hold)
	time.Sleep(time.Second)
	e.redis.Pause(t)
	paused := true
	defer func() {
		if paused {
			e.redis.Resume(t)
		}
	}()
	time.Sleep(600 * time.Millisecond) // handlers return, their releases fail
	e.stop()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	failed := e.value(t, "sluice_inflight_calls_total", map[string]string{"policy": "mw", "call": "release", "outcome": "error"})
	if failed == 0 {
		t.Fatal("no release failed while Redis was stopped")
	}
	wctx, wcancel := context.WithTimeout(context.Background(), 2*time.Second)
	pending := sluice.WaitReleases(wctx)
	wcancel()
	e.redis.Resume(t)
	paused = false
	back := time.Now()
	// Long enough for a store back, far short of the holds.
	wctx, wcancel = context.WithTimeout(context.Background(), 6*time.Second)
	left := sluice.WaitReleases(wctx)
	wcancel()
	took := time.Since(back)
	held := e.value(t, "sluice_inflight_held", map[string]string{"policy": "mw"})
	t.Logf("%v failed releases, %d pending with Redis stopped; %v to send them after it came back, %d left; held %v",
		failed, pending, took.Round(time.Millisecond), left, held)
	if left != 0 {
		t.Errorf("%d releases still pending %v after Redis came back (holds of %v)", left, took.Round(time.Millisecond), hold)
	}
	if held != 0 {
		t.Errorf("sluice_inflight_held{policy=mw} = %v once the releases were waited for, want 0", held)
	}
}

// Releases that fail while Redis stays stopped past the slots' holds are
// given up, and the slots reported expired at their holds' end:
// sluice_inflight_held is 0 then, with Redis still stopped, and stays 0
// once it is back (no late answer counts a slot twice). The gauge is read
// as held once the clients are done, before the server's Shutdown, whose
// time (long under -race) once ran past holds of 1.5s: the slots whose
// releases failed were acquired at most a request (400ms) before the
// pause, so each is held until at least hold-400ms after it, and the read
// is checked when it came a second before the hold's end (about 0.9s
// after the pause under -race, of 3s).
func TestInFlightHeldGaugeHoldsPassWhileStalled(t *testing.T) {
	t.Parallel()
	const hold = 3 * time.Second
	e := startHeldGauge(t, hold)
	time.Sleep(time.Second)
	e.redis.Pause(t)
	paused := time.Now()
	resumed := false
	defer func() {
		if !resumed {
			e.redis.Resume(t)
		}
	}()
	time.Sleep(600 * time.Millisecond)
	e.stop() // no request in flight: the fallback's slots are released
	failed := e.value(t, "sluice_inflight_calls_total", map[string]string{"policy": "mw", "call": "release", "outcome": "error"})
	held := e.value(t, "sluice_inflight_held", map[string]string{"policy": "mw"})
	read := time.Since(paused)
	if failed == 0 {
		t.Fatal("no release failed while Redis was stopped")
	}
	switch {
	case read >= hold-time.Second:
		t.Logf("the gauge read %v after the pause, too late to require the slots held", read.Round(time.Millisecond))
	case held == 0:
		t.Errorf("sluice_inflight_held{policy=mw} = 0 %v after the pause, with %v failed releases before their holds passed, want them held", read.Round(time.Millisecond), failed)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := e.srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	// Every slot Redis granted was acquired or extended before the pause.
	time.Sleep(time.Until(paused.Add(hold + 500*time.Millisecond)))
	if held := e.value(t, "sluice_inflight_held", map[string]string{"policy": "mw"}); held != 0 {
		t.Errorf("sluice_inflight_held{policy=mw} = %v with every hold past, Redis stopped, want 0", held)
	}
	e.redis.Resume(t)
	resumed = true
	time.Sleep(time.Second)
	if held := e.value(t, "sluice_inflight_held", map[string]string{"policy": "mw"}); held != 0 {
		t.Errorf("sluice_inflight_held{policy=mw} = %v a second after Redis came back, want 0", held)
	}
}
