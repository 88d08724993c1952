package httplimit

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/unbuilt"
	"github.com/sluicehq/sluice/memory"
)

// New refuses a store that was never built, and NewTransport a zero
// Limiter: both used to be accepted and then answer every request with a
// 500 (or every round trip with an error).
func TestNewRefusesUnbuiltStore(t *testing.T) {
	t.Parallel()
	rules := []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: Global()}}
	for _, u := range unbuilt.Stores() {
		if m, err := New(u.Store, rules, nil); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
			t.Errorf("New(%s): %v, %v; want ErrInvalidConfig and ErrStoreNotBuilt", u.Name, m, err)
		}
		inflight := &Options{InFlight: []InFlightRule{{Name: "f", Limit: sluice.Concurrent(1, time.Second), Key: Global()}}}
		if m, err := New(u.Store, nil, inflight); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("New(%s) with in-flight rules only: %v, %v; want ErrInvalidConfig", u.Name, m, err)
		}
	}
	if tr, err := NewTransport(&sluice.Limiter{}, nil); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("NewTransport(zero Limiter): %v, %v; want ErrInvalidConfig", tr, err)
	}
	// A built limiter is accepted, and a round trip over a real listener
	// goes through.
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	lim, err := sluice.NewLimiter(store, sluice.PerMinute(10), nil)
	if err != nil {
		t.Fatal(err)
	}
	tr, err := NewTransport(lim, nil)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(srv.Close)
	resp, err := (&http.Client{Transport: tr}).Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}
