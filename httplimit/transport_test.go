package httplimit

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

func TestTransport(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.WriteString(w, "pong")
	}))
	t.Cleanup(upstream.Close)
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
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
