package httplimit

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// slowHold is a Transport whose Redis turns slow (replies held by a proxy)
// and another on the same Redis reached directly, which sees what the
// first shared through it.
type slowHold struct {
	slow, direct *Transport
	setDelay     func(time.Duration)
	store        sluice.Store // direct, under the Transports' prefix
	upstream     string
	key          string
}

// newSlowHold serves an upstream whose /limited answers 429 with
// Retry-After: 5, after turning Redis slow by delay; wrap, if not nil,
// wraps the slow Transport's store.
func newSlowHold(t *testing.T, delay time.Duration, wrap func(sluice.Store) sluice.Store) *slowHold {
	t.Helper()
	var h slowHold
	proxy, set := slowProxy(t, redistest.Addr(t))
	h.setDelay = set
	upstream := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/limited" {
			set(delay)
			w.Header().Set("Retry-After", "5")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	h.upstream, h.key = upstream.URL, hostKey(mustURL(t, upstream.URL))
	prefix := redistest.Prefix(t)
	// ContextTimeoutEnabled: the client's reads end with their context, as
	// the hold's write bound needs.
	rc := redis.NewClient(&redis.Options{Addr: proxy, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rc.Close() })
	var slow sluice.Store = redisstore.New(rc, &redisstore.Options{Prefix: prefix})
	if wrap != nil {
		slow = wrap(slow)
	}
	h.slow = newTransport(t, slow, sluice.PerSecond(1000), nil)
	h.store = redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: prefix})
	h.direct = newTransport(t, h.store, sluice.PerSecond(1000), nil)
	return &h
}

// get sends a GET for path through tr within d.
func (h *slowHold) get(tr *Transport, path string, d time.Duration) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", h.upstream+path, nil)
	resp, err := tr.RoundTrip(req)
	if err == nil {
		resp.Body.Close()
	}
	return resp, err
}

// storeHold reports how long the store holds the key.
func (h *slowHold) storeHold(t *testing.T) time.Duration {
	t.Helper()
	d, err := h.store.Peek(context.Background(), h.slow.holds.storeKey(h.key), holdLook, holdLook.Capacity())
	if err != nil {
		t.Fatal(err)
	}
	if d.Allowed {
		return 0
	}
	return d.RetryAfter
}

// A 429 with Retry-After comes back to its caller by the request's
// deadline though Redis turned slow as the provider answered (each reply
// 400ms, so sharing the hold takes 800ms): the hold holds this process at
// once, and the store's write goes on in the background, reaching the
// fleet, until Close has waited for it. Over a real Redis behind a
// delaying proxy and a real upstream.
func TestRedisTransportHoldWriteWithinDeadline(t *testing.T) {
	t.Parallel()
	h := newSlowHold(t, 400*time.Millisecond, nil)
	const deadline = 100 * time.Millisecond
	start := time.Now()
	resp, err := h.get(h.slow, "/limited", deadline)
	took := time.Since(start)
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("%v, %v; want the upstream's 429", resp, err)
	}
	if took > deadline+250*time.Millisecond {
		t.Errorf("RoundTrip returned %v after it started, past its %v deadline", took, deadline)
	}
	// Held here at once, before the store has it.
	if _, err := h.get(h.slow, "/", time.Second); !errors.Is(err, ErrProviderHold) {
		t.Errorf("request right after the 429: %v, want ErrProviderHold", err)
	}
	start = time.Now()
	h.slow.Close()
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("Close took %v, want at most the write's second and a little", took)
	}
	h.slow.holds.mu.Lock()
	writing := len(h.slow.holds.writes)
	h.slow.holds.mu.Unlock()
	if writing != 0 {
		t.Errorf("%d writers left after Close", writing)
	}
	if left := h.storeHold(t); left < 3*time.Second {
		t.Errorf("store's hold after Close: %v, want the 5s Retry-After less its write", left)
	}
	if _, err := h.direct.RoundTrip(mustRequest(t, h.upstream, 200*time.Millisecond)); !errors.Is(err, ErrProviderHold) {
		t.Errorf("another Transport on the store: %v, want ErrProviderHold", err)
	}
}

// mustRequest is a GET of url whose context ends after d (at cleanup at
// the latest).
func mustRequest(t *testing.T, url string, d time.Duration) *http.Request {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	req, err := http.NewRequestWithContext(ctx, "GET", url, nil)
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// takeCounter counts the takes on the provider's hold keys that run at
// once.
type takeCounter struct {
	sluice.Store
	now, most atomic.Int64
}

func (c *takeCounter) Take(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	if strings.HasSuffix(key, "\x00hold") {
		n := c.now.Add(1)
		defer c.now.Add(-1)
		for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
		}
	}
	return c.Store.Take(ctx, key, limit, cost)
}

// 16 requests getting their 429s at once, on a Redis that answers in
// 50ms, share the hold one write at a time, not 16 at once; each returns
// once the store holds (its context allows it).
func TestRedisTransportHoldWritesOneAtATime(t *testing.T) {
	t.Parallel()
	const n = 16
	var arrived sync.WaitGroup
	arrived.Add(n)
	all := make(chan struct{})
	go func() { arrived.Wait(); close(all) }()
	counter := &takeCounter{}
	h := newSlowHold(t, 50*time.Millisecond, func(s sluice.Store) sluice.Store { counter.Store = s; return counter })
	// Every request reaches the upstream before any 429 comes back.
	barrier := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived.Done()
		select {
		case <-all:
		case <-time.After(5 * time.Second):
		}
		h.setDelay(50 * time.Millisecond)
		w.Header().Set("Retry-After", "5")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			resp, err := h.slow.RoundTrip(mustRequest(t, barrier.URL, 10*time.Second))
			if err != nil || resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("%v, %v; want the upstream's 429", resp, err)
				return
			}
			resp.Body.Close()
			ctx := context.Background()
			key := h.slow.holds.storeKey(hostKey(mustURL(t, barrier.URL)))
			if d, err := h.store.Peek(ctx, key, holdLook, holdLook.Capacity()); err != nil || d.Allowed {
				t.Errorf("store's hold once the 429 came back: %+v, %v; want held", d, err)
			}
		})
	}
	wg.Wait()
	h.slow.Close()
	if most := counter.most.Load(); most != 1 {
		t.Errorf("takes on the hold key at once: at most %d, want 1", most)
	}
}

// ClearHold while the hold is being written (Redis slow, the 429's caller
// gone at its deadline) waits for the write, so that it does not set the
// hold again after the clear: the store and both Transports send at once.
func TestRedisTransportClearHoldDuringWrite(t *testing.T) {
	t.Parallel()
	h := newSlowHold(t, 300*time.Millisecond, nil)
	if resp, err := h.get(h.slow, "/limited", 50*time.Millisecond); err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("%v, %v; want the upstream's 429", resp, err)
	}
	if err := h.slow.ClearHold(context.Background(), h.key); err != nil {
		t.Fatal(err)
	}
	h.setDelay(0)
	h.slow.Close()
	if left := h.storeHold(t); left != 0 {
		t.Errorf("store holds %v after ClearHold", left)
	}
	for name, tr := range map[string]*Transport{"slow": h.slow, "direct": h.direct} {
		if _, err := h.get(tr, "/", time.Second); err != nil {
			t.Errorf("%s after ClearHold: %v", name, err)
		}
	}
}
