package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/redistest"
)

func TestTransport(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.WriteString(w, "pong")
	}))
	t.Cleanup(upstream.Close)
	store := middlewaretest.Memory(t)
	// Two at once, then one per 20ms: short real waits.
	lim, err := sluice.NewLimiter(store, sluice.Limit{Rate: 50, Period: time.Second, Burst: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTransport(lim, &TransportOptions{Base: upstream.Client().Transport})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	for i := range 4 { // the last two wait for quota, then go through
		resp, err := client.Get(upstream.URL)
		if err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		resp.Body.Close()
	}
	if got := calls.Load(); got != 4 {
		t.Fatalf("upstream calls %d, want 4", got)
	}

	// A deadline shorter than the wait fails at once; the provider is not
	// called and the body is closed.
	slow, err := sluice.NewLimiter(store, sluice.PerHour(1), &sluice.Options{Prefix: "slow:"})
	if err != nil {
		t.Fatal(err)
	}
	tr, err = NewTransport(slow, &TransportOptions{Base: upstream.Client().Transport, Key: func(*http.Request) string { return "provider" }})
	if err != nil {
		t.Fatal(err)
	}
	client = &http.Client{Transport: tr}
	if resp, err := client.Get(upstream.URL); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	body := &closeRecorder{Reader: strings.NewReader("payload")}
	req, _ := http.NewRequestWithContext(ctx, "POST", upstream.URL, body)
	_, err = client.Do(req)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do = %v, want DeadlineExceeded", err)
	}
	if !body.closed.Load() {
		t.Error("request body not closed")
	}
	if got := calls.Load(); got != 5 {
		t.Errorf("upstream calls %d, want 5", got)
	}
}

type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (c *closeRecorder) Close() error { c.closed.Store(true); return nil }

func TestNewTransportNil(t *testing.T) {
	t.Parallel()
	if _, err := NewTransport(nil, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewTransport(nil) = %v", err)
	}
}

// The default key normalizes the host, so that one provider has one quota
// however its URLs spell it; names are not resolved.
func TestTransportHostKey(t *testing.T) {
	t.Parallel()
	for raw, want := range map[string]string{
		"http://example.com/x":            "example.com",
		"http://EXAMPLE.com./x":           "example.com",
		"http://example.com:80/x":         "example.com",
		"https://example.com:443/x":       "example.com",
		"HTTPS://example.com:0443/x":      "example.com",
		"https://example.com:80/x":        "example.com:80",
		"http://example.com:443/x":        "example.com:443",
		"http://example.com:8080/x":       "example.com:8080",
		"http://127.0.0.1:8080/x":         "127.0.0.1:8080",
		"http://[::ffff:127.0.0.1]:8080/": "127.0.0.1:8080",
		"http://[::FFFF:7f00:1]/":         "127.0.0.1",
		"http://[0:0::1]:8080/":           "[::1]:8080",
		"https://[2001:DB8::1]:443/":      "[2001:db8::1]",
		"http://LocalHost:8080/":          "localhost:8080",
		"http://localhost/":               "localhost", // not 127.0.0.1: names are not resolved
		"http:///path":                    "",
		"http://bücher.example/":          "xn--bcher-kva.example",
		"http://BÜCHER.example:80/":       "xn--bcher-kva.example",
		"http://xn--bcher-kva.example/":   "xn--bcher-kva.example",
	} {
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		if got := hostKey(u); got != want {
			t.Errorf("hostKey(%s) = %q, want %q", raw, got, want)
		}
	}
}

// Over a real upstream: the spellings of one address draw on one quota,
// and a URL without a host fails with ErrKey before anything is taken.
func TestTransportOneQuotaPerHost(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	upstream := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
	}))
	port := upstream.Listener.Addr().(*net.TCPAddr).Port
	store := middlewaretest.Memory(t)
	lim, err := sluice.NewLimiter(store, sluice.PerHour(3), nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTransport(lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	get := func(host string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://%s:%d/", host, port), nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	for _, host := range []string{"127.0.0.1", "[::ffff:127.0.0.1]", "[::FFFF:7F00:1]"} {
		if err := get(host); err != nil {
			t.Fatalf("%s: %v", host, err)
		}
	}
	// The quota of 3 is spent, whatever the spelling: the next request
	// would wait an hour, past its deadline.
	if err := get("127.0.0.1"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("fourth request: %v, want DeadlineExceeded", err)
	}
	if got := calls.Load(); got != 3 {
		t.Errorf("upstream calls %d, want 3", got)
	}
	// localhost is a quota of its own, shared by its spellings.
	for _, host := range []string{"localhost", "LOCALHOST", "LocalHost"} {
		if err := get(host); err != nil {
			t.Fatalf("%s: %v", host, err)
		}
	}
	if err := get("localhost"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("fourth localhost request: %v, want DeadlineExceeded", err)
	}
	if d, err := lim.Peek(context.Background(), fmt.Sprintf("localhost:%d", port)); err != nil || d.Allowed {
		t.Errorf("Peek(localhost:%d) = %+v, %v: want its quota spent", port, d, err)
	}

	body := &closeRecorder{Reader: strings.NewReader("payload")}
	req, _ := http.NewRequest("POST", "http:///path", body)
	if _, err := tr.RoundTrip(req); !errors.Is(err, ErrKey) {
		t.Errorf("URL without a host: %v, want ErrKey", err)
	}
	if !body.closed.Load() {
		t.Error("request body not closed")
	}
}

// serveUpstream serves h on a port of redistest.Listen's until the test
// ends: a real provider.
func serveUpstream(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = redistest.Listen(t)
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}

// newTransport is a Transport over a Limiter of limit on store, closed at
// cleanup.
func newTransport(t testing.TB, store sluice.Store, limit sluice.Limit, opts *TransportOptions) *Transport {
	t.Helper()
	lim, err := sluice.NewLimiter(store, limit, nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTransport(lim, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() }) // no write of a hold outlives the test
	return tr
}
