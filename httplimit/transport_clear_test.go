package httplimit

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"sync"
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
		return newTransport(t, redisstore.New(client, &redisstore.Options{Prefix: prefix}), sluice.PerSecond(100), nil)
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

// MaxHold bounds a hold another Transport wrote to the store from when
// this Transport first saw it: looking at the store again, while waiting
// or for a new request, does not restart it. A later, longer hold is a
// new one. Transport a (no MaxHold) gets an hour's 429; b (MaxHold 1s),
// on the same Redis, sends about a second after it first sees the hold.
func TestRedisTransportMaxHoldOfSharedHold(t *testing.T) {
	t.Parallel()
	var fromB atomic.Int64
	upstream := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/limited" {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		if r.Header.Get("X-From") == "b" {
			fromB.Add(1)
		}
	}))
	prefix := redistest.Prefix(t)
	client := redistest.Client(t)
	transport := func(maxHold time.Duration) *Transport {
		return newTransport(t, redisstore.New(client, &redisstore.Options{Prefix: prefix}), sluice.PerSecond(100), &TransportOptions{MaxHold: maxHold})
	}
	const maxHold = time.Second
	a, b := transport(0), transport(maxHold)
	get := func(tr *Transport, path string, within time.Duration) error {
		ctx, cancel := context.WithTimeout(context.Background(), within)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", upstream.URL+path, nil)
		if tr == b {
			req.Header.Set("X-From", "b")
		}
		resp, err := tr.RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		return err
	}
	for round := range 2 {
		if err := get(a, "/limited", 5*time.Second); err != nil {
			t.Fatalf("round %d: a's 429: %v", round, err)
		}
		// b sees the hour's hold, capped.
		seen := time.Now()
		if err := get(b, "/", 200*time.Millisecond); !errors.Is(err, ErrProviderHold) {
			t.Fatalf("round %d: b inside the hold: %v, want ErrProviderHold", round, err)
		}
		// A waiter, and new requests arriving while it waits (each looks
		// at the store), all go once MaxHold has passed since b first saw
		// the hold.
		var wg sync.WaitGroup
		took := make([]time.Duration, 3)
		for i := range took {
			wg.Go(func() {
				time.Sleep(time.Duration(i) * 400 * time.Millisecond)
				if err := get(b, "/", 10*time.Second); err != nil {
					t.Errorf("round %d: b's request %d: %v", round, i, err)
				}
				took[i] = time.Since(seen)
			})
		}
		wg.Wait()
		for i, d := range took {
			if d < maxHold-100*time.Millisecond || d > maxHold+700*time.Millisecond {
				t.Errorf("round %d: b's request %d sent %v after b first saw the hold, want about MaxHold (%v)", round, i, d, maxHold)
			}
		}
		// b is no longer held by it; a still is.
		start := time.Now()
		if err := get(b, "/", 5*time.Second); err != nil || time.Since(start) > 300*time.Millisecond {
			t.Errorf("round %d: b after MaxHold: %v after %v, want sent at once", round, err, time.Since(start))
		}
		if err := get(a, "/", 200*time.Millisecond); !errors.Is(err, ErrProviderHold) {
			t.Errorf("round %d: a after b's MaxHold: %v, want ErrProviderHold", round, err)
		}
		// Round 1: a later 429 sets a longer hold, which holds b anew.
		time.Sleep(100 * time.Millisecond)
		if err := a.ClearHold(context.Background(), hostKey(mustURL(t, upstream.URL))); err != nil {
			t.Fatal(err)
		}
	}
	if n := fromB.Load(); n != 2*4 {
		t.Errorf("b sent %d requests, want 8", n)
	}
}
