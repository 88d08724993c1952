package httplimit

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// arrival is one request as the upstream saw it.
type arrival struct {
	at   time.Time
	from string // the X-Instance header: which Transport sent it
}

// After the provider answers one request 429 with Retry-After: 2, no
// request reaches it for 2 s, from the Transport that got the 429 or from
// another instance sharing its Redis store; then traffic resumes, within
// the quota. A request whose deadline ends inside the hold fails at once.
// Over a real upstream and a real Redis.
func TestTransportHoldsOnRetryAfter(t *testing.T) {
	t.Parallel()
	var (
		mu       sync.Mutex
		arrivals []arrival
		t429     time.Time
		limited  atomic.Int64
	)
	upstream := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		mu.Lock()
		arrivals = append(arrivals, arrival{now, r.Header.Get("X-Instance")})
		first := len(arrivals) == 1
		if first {
			t429 = now
		}
		mu.Unlock()
		if first {
			limited.Add(1)
			w.Header().Set("Retry-After", "2")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	client := redistest.Client(t)
	prefix := redistest.Prefix(t)
	// Two instances of a service: each its own Store, Limiter and
	// Transport, on one Redis.
	instance := func(c redis.UniversalClient) *http.Client {
		return &http.Client{Transport: newTransport(t, redisstore.New(c, &redisstore.Options{Prefix: prefix}), sluice.PerSecond(10), nil)}
	}
	clients := map[string]*http.Client{"a": instance(client), "b": instance(client)}
	get := func(ctx context.Context, from string) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", upstream.URL, nil)
		req.Header.Set("X-Instance", from)
		resp, err := clients[from].Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}

	resp, err := get(context.Background(), "a")
	if err != nil || resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("first request: %v, %v; want the upstream's 429", resp, err)
	}
	mu.Lock()
	holdEnd := t429.Add(2 * time.Second)
	mu.Unlock()

	// Load from both instances until 1.5 s past the hold.
	var wg sync.WaitGroup
	for _, from := range []string{"a", "a", "b", "b"} {
		wg.Go(func() {
			for time.Until(holdEnd) > -1500*time.Millisecond {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				_, err := get(ctx, from)
				cancel()
				if err != nil {
					t.Errorf("%s: %v", from, err)
					return
				}
			}
		})
	}

	// Inside the hold, a deadline that ends before it fails at once, and
	// nothing is sent.
	time.Sleep(300 * time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	start := time.Now()
	_, err = get(ctx, "b")
	cancel()
	if !errors.Is(err, ErrProviderHold) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("request with a deadline inside the hold: %v, want ErrProviderHold and DeadlineExceeded", err)
	}
	if took := time.Since(start); took > 250*time.Millisecond {
		t.Errorf("request with a deadline inside the hold failed after %v, want at once", took)
	}
	wg.Wait()

	mu.Lock()
	defer mu.Unlock()
	if n := limited.Load(); n != 1 {
		t.Errorf("429s answered %d, want 1", n)
	}
	resumed := map[string]int{}
	for _, a := range arrivals[1:] {
		if a.at.Before(holdEnd) {
			t.Errorf("request from %s reached the upstream %v after the 429, inside its 2s hold", a.from, a.at.Sub(t429))
			continue
		}
		if a.at.Sub(holdEnd) <= 1500*time.Millisecond {
			resumed[a.from]++
		}
	}
	// Traffic resumes from both instances, within the quota: its burst
	// of 10 and 10/s over the 1.5 s after the hold (and one at the edge).
	if resumed["a"] == 0 || resumed["b"] == 0 {
		t.Errorf("requests after the hold: %v, want some from both instances", resumed)
	}
	if n := resumed["a"] + resumed["b"]; n > 10+15+1 {
		t.Errorf("%d requests in the 1.5s after the hold, want at most the quota's 26", n)
	}
	if first := arrivals[1].at.Sub(holdEnd); first > 500*time.Millisecond {
		t.Errorf("first request after the hold came %v after it ended, want soon after", first)
	}
}

// A 503 with an HTTP-date Retry-After holds too, read against the
// response's Date; a 429 without Retry-After holds nothing.
func TestTransportHoldsOnRetryAfterDate(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	var last atomic.Pointer[time.Time]
	upstream := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		now := time.Now()
		last.Store(&now)
		switch calls.Add(1) {
		case 1:
			// The provider's clock, an hour off ours: only the difference
			// counts.
			date := now.Add(time.Hour).UTC().Truncate(time.Second)
			w.Header().Set("Date", date.Format(http.TimeFormat))
			w.Header().Set("Retry-After", date.Add(2*time.Second).Format(http.TimeFormat))
			w.WriteHeader(http.StatusServiceUnavailable)
		case 2:
			w.WriteHeader(http.StatusTooManyRequests) // no Retry-After
		}
	}))
	store := middlewaretest.Memory(t)
	client := &http.Client{Transport: newTransport(t, store, sluice.PerSecond(100), nil)}
	var prev time.Time
	for i, want := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests, http.StatusOK} {
		resp, err := client.Get(upstream.URL)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i, resp.StatusCode, want)
		}
		at := *last.Load()
		switch gap := at.Sub(prev); i {
		case 1:
			if gap < 2*time.Second {
				t.Errorf("request after the 503 reached the upstream %v after it, want at least 2s", gap)
			}
		case 2:
			if gap > time.Second {
				t.Errorf("request after a 429 without Retry-After waited %v, want none", gap)
			}
		}
		prev = at
	}
}

// The store's hold only grows: a longer Retry-After extends it, a shorter
// one leaves it, and holds set at once by many requests do not add up.
// On memory and on a real Redis.
func TestTransportHoldShare(t *testing.T) {
	t.Parallel()
	mem := middlewaretest.Memory(t)
	for name, store := range map[string]sluice.Store{
		"memory": mem,
		"redis":  middlewaretest.Redis(t, nil),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			h := &holds{store: store, prefix: "p:"}
			left := func(key string) time.Duration {
				t.Helper()
				d, err := store.Peek(ctx, h.storeKey(key), holdLook, holdLook.Capacity())
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					return 0
				}
				return d.RetryAfter
			}
			near := func(what string, got, want time.Duration) {
				t.Helper()
				// The hold is kept in milliseconds: a millisecond's rounding below.
				if got < want-time.Millisecond || got > want+200*time.Millisecond {
					t.Errorf("%s: hold %v, want %v (and a little)", what, got, want)
				}
			}
			var setAt time.Time // when the hold kept was shared
			for _, step := range []struct {
				what       string
				hold, want time.Duration
			}{
				{"first", time.Second, time.Second},
				{"longer", 3 * time.Second, 3 * time.Second},
				{"shorter", 2 * time.Second, 3 * time.Second},
			} {
				start := time.Now()
				if _, err := h.share(ctx, h.storeKey("k"), step.hold); err != nil {
					t.Fatal(err)
				}
				if step.hold == step.want {
					setAt = start // this step's hold is the one kept
				}
				near(step.what, left("k")+time.Since(setAt), step.want)
			}
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					if _, err := h.share(ctx, h.storeKey("together"), 2*time.Second); err != nil {
						t.Error(err)
					}
				})
			}
			wg.Wait()
			near("8 at once", left("together"), 2*time.Second-100*time.Millisecond)
		})
	}
}

func TestRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	date := func(d time.Duration) string { return now.Add(d).Format(http.TimeFormat) }
	for _, tt := range []struct {
		retry, date string
		want        time.Duration
	}{
		{"2", "", 2 * time.Second},
		{" 120 ", "", 2 * time.Minute},
		{"0", "", 0},
		{"-1", "", 0},
		{"1.5", "", 0},
		{"soon", "", 0},
		{"", "", 0},
		{"99999999999999999999999", "", MaxProviderHold},
		{"100000", "", MaxProviderHold},
		{date(3 * time.Second), "", 3 * time.Second},
		{date(3 * time.Second), date(time.Second), 2 * time.Second}, // against the provider's Date
		{date(3 * time.Second), "garbage", 3 * time.Second},
		{date(-3 * time.Second), "", 0},
		{date(48 * time.Hour), "", MaxProviderHold},
	} {
		h := http.Header{}
		if tt.retry != "" {
			h.Set("Retry-After", tt.retry)
		}
		if tt.date != "" {
			h.Set("Date", tt.date)
		}
		if got := retryAfter(h, now); got != tt.want {
			t.Errorf("Retry-After %q, Date %q: %v, want %v", tt.retry, tt.date, got, tt.want)
		}
	}
}

// The holds' store failures are logged per kind, one line at once, and the
// failures held back are counted when the period ends though none
// follows: 20 failed look-ups are two lines accounting for all 20, and a
// failed share within the period has a line of its own at once. Over a
// real Redis store whose server is down.
func TestTransportHoldLogPaced(t *testing.T) {
	t.Parallel()
	const every = time.Second
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	var logs logtest.Log
	h := &holds{
		store:  redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}),
		logger: logs.Logger(),
	}
	h.pace.Every = every
	ctx := context.Background()
	start := time.Now()
	for range 20 {
		if h.held(ctx, "api.example") {
			t.Fatal("held with a store down and no hold here")
		}
	}
	h.hold(ctx, "api.example", time.Second)
	inOne := time.Since(start) < every/2
	if lines := logs.Records(t); inOne && len(lines) != 2 {
		t.Errorf("lines at once %v, want one per kind", lines)
	}
	time.Sleep(every + every/2)
	lines := logs.Records(t)
	counted := map[string]int64{}
	for _, l := range lines {
		msg, _ := l["msg"].(string)
		n, _ := l["failures_not_logged"].(float64)
		counted[msg] += 1 + int64(n)
	}
	if inOne && len(lines) != 3 {
		t.Errorf("lines %v, want 3: one per kind at once, then one for 19 look-ups held back", lines)
	}
	for msg, want := range map[string]int64{
		"httplimit: could not look up the provider's hold in the store":                              20,
		"httplimit: could not share the provider's hold through the store; this process holds alone": 1,
	} {
		if counted[msg] != want {
			t.Errorf("%q: lines account for %d failures, want %d", msg, counted[msg], want)
		}
	}
}

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
	lim, err := sluice.NewLimiter(middlewaretest.Redis(t, nil), sluice.PerSecond(100), nil)
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

// sendLog records when each request is handed to the wrapped transport.
type sendLog struct {
	base http.RoundTripper
	mu   sync.Mutex
	at   []time.Time
}

func (s *sendLog) RoundTrip(req *http.Request) (*http.Response, error) {
	now := time.Now()
	s.mu.Lock()
	s.at = append(s.at, now)
	s.mu.Unlock()
	return s.base.RoundTrip(req)
}

// delayProxy forwards TCP connections to target, holding each chunk of
// the replies for delay: a Redis a little farther away than loopback.
func delayProxy(t *testing.T, target string, delay time.Duration) string {
	t.Helper()
	addr, set := slowProxy(t, target)
	set(delay)
	return addr
}

// slowProxy is delayProxy with a delay set, from none, by set: a Redis
// that turns slow.
func slowProxy(t *testing.T, target string) (addr string, set func(time.Duration)) {
	t.Helper()
	var delay atomic.Int64
	l := redistest.Listen(t)
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	pipe := func(dst, src net.Conn, slow bool) {
		defer dst.Close()
		defer src.Close()
		buf := make([]byte, 64<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				if slow {
					time.Sleep(time.Duration(delay.Load()))
				}
				if _, werr := dst.Write(buf[:n]); werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			wg.Go(func() { pipe(out, in, false) })
			wg.Go(func() { pipe(in, out, true) })
		}
	})
	return l.Addr().String(), func(d time.Duration) { delay.Store(int64(d)) }
}

// No request is handed to the base transport once a 429 with Retry-After
// has come back to its caller, until the hold ends, however many requests
// were between their quota and their send when it arrived: 64 goroutines
// against a real upstream and a real Redis, reached directly and through
// a proxy adding a millisecond to each reply.
func TestRedisTransportNoSendDuringHold(t *testing.T) {
	t.Parallel()
	for _, delay := range []time.Duration{0, time.Millisecond} {
		t.Run(delay.String(), func(t *testing.T) {
			addr := redistest.Addr(t)
			if delay > 0 {
				addr = delayProxy(t, addr, delay)
			}
			for run := range 3 {
				if n := sendsDuringHold(t, addr); n > 0 {
					t.Errorf("run %d: %d requests handed to the base transport after the 429 came back, inside its hold", run, n)
				}
			}
		})
	}
}

// sendsDuringHold runs one 429 under load and returns how many requests
// were handed on after the 429 was returned and before its hold ended.
func sendsDuringHold(t *testing.T, redisAddr string) int {
	t.Helper()
	const hold = time.Second
	var served atomic.Int64
	upstream := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if served.Add(1) == 200 { // once the load runs
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	rc := redis.NewClient(&redis.Options{Addr: redisAddr})
	t.Cleanup(func() { rc.Close() })
	log := &sendLog{base: &http.Transport{MaxIdleConnsPerHost: 64}}
	t.Cleanup(log.base.(*http.Transport).CloseIdleConnections)
	tr := newTransport(t, redisstore.New(rc, &redisstore.Options{Prefix: redistest.Prefix(t)}), sluice.PerSecond(1_000_000), &TransportOptions{Base: log})
	var returned atomic.Pointer[time.Time]
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				if r := returned.Load(); r != nil && time.Since(*r) > hold/2 {
					return
				}
				req, _ := http.NewRequestWithContext(ctx, "GET", upstream.URL, nil)
				resp, err := tr.RoundTrip(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode == http.StatusTooManyRequests {
					now := time.Now()
					returned.Store(&now)
				}
			}
		})
	}
	wg.Wait()
	r := returned.Load()
	if r == nil {
		t.Fatal("the upstream's 429 never came back")
	}
	log.mu.Lock()
	defer log.mu.Unlock()
	n := 0
	for _, at := range log.at {
		if at.After(*r) && at.Before(r.Add(hold-100*time.Millisecond)) {
			n++
		}
	}
	return n
}
