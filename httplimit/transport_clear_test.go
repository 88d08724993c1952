package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// A day-long hold (429, Retry-After: 86400) is lifted fleet-wide by
// ClearHold on either Transport: requests waiting on both go, and new
// ones are sent at once. Two Transports, each with its own store, on a
// real Redis and a real upstream.
func TestRedisTransportClearHold(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	upstream := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/limited" {
			w.Header().Set("Retry-After", "86400")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		calls.Add(1)
	}))
	prefix := redistest.Prefix(t)
	client := redistest.Client(t)
	transport := func() *Transport {
		lim, err := sluice.NewLimiter(redisstore.New(client, &redisstore.Options{Prefix: prefix}), sluice.PerSecond(100), nil)
		if err != nil {
			t.Fatal(err)
		}
		tr, err := NewTransport(lim, nil)
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
	a, b := transport(), transport()
	key := hostKey(mustURL(t, upstream.URL))
	get := func(tr *Transport, path string, within time.Duration) (*http.Response, error) {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", upstream.URL+path, nil)
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	for _, round := range []struct {
		name          string
		limited, lift *Transport
	}{{"cleared by the held", a, a}, {"cleared by the other", a, b}} {
		if resp, err := get(round.limited, "/limited", 5*time.Second); err != nil || resp.StatusCode != http.StatusTooManyRequests {
			t.Fatalf("%s: %v, %v; want the upstream's 429", round.name, resp, err)
		}
		for name, tr := range map[string]*Transport{"a": a, "b": b} {
			if _, err := get(tr, "/", 200*time.Millisecond); !errors.Is(err, ErrProviderHold) {
				t.Fatalf("%s: %s inside the hold: %v, want ErrProviderHold", round.name, name, err)
			}
		}
		// Waiters on both, without deadlines.
		done := make(chan error, 2)
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		for _, tr := range []*Transport{a, b} {
			go func() {
				req, _ := http.NewRequestWithContext(ctx, "GET", upstream.URL, nil)
				resp, err := tr.RoundTrip(req)
				if err == nil {
					resp.Body.Close()
				}
				done <- err
			}()
		}
		time.Sleep(100 * time.Millisecond)
		start := time.Now()
		if err := round.lift.ClearHold(context.Background(), key); err != nil {
			t.Fatalf("%s: ClearHold: %v", round.name, err)
		}
		for range 2 {
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("%s: waiter: %v", round.name, err)
				}
			case <-time.After(3 * time.Second):
				t.Fatalf("%s: a waiter still held 3s after ClearHold", round.name)
			}
		}
		if took := time.Since(start); took > 1500*time.Millisecond {
			t.Errorf("%s: waiters went %v after ClearHold, want within about a second", round.name, took)
		}
		for name, tr := range map[string]*Transport{"a": a, "b": b} {
			if _, err := get(tr, "/", time.Second); err != nil {
				t.Errorf("%s: %s after ClearHold: %v", round.name, name, err)
			}
		}
	}
}

// MaxHold caps every hold; a negative one, or one above MaxProviderHold,
// is refused.
func TestRedisTransportMaxHold(t *testing.T) {
	t.Parallel()
	upstream := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/limited" {
			w.Header().Set("Retry-After", "86400")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	lim, err := sluice.NewLimiter(redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)}), sluice.PerSecond(100), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []time.Duration{-time.Second, MaxProviderHold + time.Second} {
		if _, err := NewTransport(lim, &TransportOptions{MaxHold: bad}); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("MaxHold %v: %v, want ErrInvalidConfig", bad, err)
		}
	}
	tr, err := NewTransport(lim, &TransportOptions{MaxHold: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	client := &http.Client{Transport: tr}
	resp, err := client.Get(upstream.URL + "/limited")
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("%v, %v; want the upstream's 429", resp, err)
	}
	resp.Body.Close()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", upstream.URL, nil)
	resp, err = client.Do(req)
	if err != nil {
		t.Fatalf("after a day's Retry-After under MaxHold 500ms: %v", err)
	}
	resp.Body.Close()
	if took := time.Since(start); took < 300*time.Millisecond || took > 1500*time.Millisecond {
		t.Errorf("next request sent %v after the 429, want about MaxHold (500ms)", took)
	}
}

func mustURL(t *testing.T, raw string) *url.URL {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}
