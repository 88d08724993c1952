package promsluice_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/promsluice"
)

// releaseFails is a memory store whose Release fails while down is set
// (Redis unreachable at the moment the handler returns).
type releaseFails struct {
	*memory.Store
	down atomic.Bool
}

func (s *releaseFails) Release(ctx context.Context, key, holder string) (bool, error) {
	if s.down.Load() {
		return false, errors.New("redis: connection refused")
	}
	return s.Store.Release(ctx, key, holder)
}

// A release that fails leaves the slot held in the store until its hold
// timeout: sluice_inflight_held keeps it until then (README, Metrics).
func TestHeldAfterFailedRelease(t *testing.T) {
	c := promsluice.New(nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mem := memory.New(nil)
	defer mem.Close()
	store := &releaseFails{Store: mem}
	mw, err := httplimit.New(store, nil, &httplimit.Options{
		Observer: c,
		InFlight: []httplimit.InFlightRule{{Name: "if", Limit: sluice.Concurrent(1, time.Hour), Key: httplimit.Global()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	store.down.Store(true)
	h.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil)) // release fails
	store.down.Store(false)
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/", nil))
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("second request: %d; the slot should still be held in the store", rec.Code)
	}
	held, _ := promtest.Value(t, reg, "sluice_inflight_held", map[string]string{"policy": "if"})
	relErr, _ := promtest.Value(t, reg, "sluice_inflight_calls_total", map[string]string{"policy": "if", "call": "release", "outcome": "error"})
	if held != 1 {
		t.Errorf("sluice_inflight_held = %v while the store still holds the slot (release error count %v), want 1 until its hold passes", held, relErr)
	}
}

// A nil *Collector (say, metrics disabled by config) passed as the
// Observer observes nothing, as a nil Observer does.
func TestNilCollector(t *testing.T) {
	var c *promsluice.Collector // e.g. only built when metrics are enabled
	mw, err := httplimit.New(memory.New(nil), []httplimit.Rule{{Name: "r", Limit: sluice.PerHour(2), Key: httplimit.Global()}}, &httplimit.Options{Observer: c})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if r := recover(); r != nil {
			t.Errorf("a nil *promsluice.Collector as Observer panicked: %v", r)
		}
	}()
	mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
}

// A request whose client has gone away is no store failure: it is not
// counted as an error.
func TestCanceledIsNoError(t *testing.T) {
	c := promsluice.New(nil)
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	mem := memory.New(nil)
	defer mem.Close()
	mw, err := httplimit.New(mem, []httplimit.Rule{{Name: "r", Limit: sluice.PerHour(100), Key: httplimit.Global()}}, &httplimit.Options{
		Observer: c,
		InFlight: []httplimit.InFlightRule{{Name: "if", Limit: sluice.Concurrent(5, time.Minute), Key: httplimit.Global()}},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	rec := httptest.NewRecorder()
	mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(rec, httptest.NewRequest("GET", "/", nil).WithContext(ctx))
	e, _ := promtest.Value(t, reg, "sluice_inflight_acquires_total", map[string]string{"policy": "if", "outcome": "error"})
	if e != 0 {
		t.Errorf("a canceled request counted as a store error (status %d)", rec.Code)
	}
}
