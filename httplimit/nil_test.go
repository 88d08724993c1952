package httplimit

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
)

// A nil *Middleware (New's error ignored) answers every request 500 with
// a problem naming the cause: it neither panics nor lets traffic through
// unlimited.
func TestNilMiddleware(t *testing.T) {
	t.Parallel()
	var m *Middleware
	var called atomic.Bool
	srv := httptest.NewServer(m.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { called.Store(true) })))
	t.Cleanup(srv.Close)
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var p Problem
	if err := json.NewDecoder(resp.Body).Decode(&p); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusInternalServerError || resp.Header.Get("Content-Type") != "application/problem+json" ||
		p.Status != 500 || !strings.Contains(p.Detail, "nil *httplimit.Middleware") {
		t.Errorf("nil Middleware: %d %q %+v; want 500 problem+json naming the nil Middleware", resp.StatusCode, resp.Header.Get("Content-Type"), p)
	}
	if called.Load() {
		t.Error("nil Middleware passed the request to its handler")
	}
}

// Requests the Transport cannot key, and a nil *Transport, fail with typed
// errors (and the body closed), as net/http's own transport does, rather
// than panicking.
func TestTransportBadInput(t *testing.T) {
	t.Parallel()
	store := middlewaretest.Memory(t)
	lim, err := sluice.NewLimiter(store, sluice.PerSecond(10), nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTransport(lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	body := &closeRecorder{Reader: strings.NewReader("payload")}
	if _, err := tr.RoundTrip(&http.Request{Body: body}); !errors.Is(err, ErrKey) {
		t.Errorf("RoundTrip with a nil URL = %v, want ErrKey", err)
	}
	if !body.closed.Load() {
		t.Error("request body not closed")
	}
	if _, err := tr.RoundTrip(nil); !errors.Is(err, ErrKey) {
		t.Errorf("RoundTrip(nil) = %v, want ErrKey", err)
	}
	var none *Transport
	if _, err := none.RoundTrip(&http.Request{URL: &url.URL{Scheme: "http", Host: "example.com"}}); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("nil Transport's RoundTrip = %v, want ErrInvalidConfig", err)
	}
	var zero Transport
	if _, err := zero.RoundTrip(&http.Request{URL: &url.URL{Scheme: "http", Host: "example.com"}}); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("zero Transport's RoundTrip = %v, want ErrInvalidLimit", err)
	}
}
