package httplimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
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
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
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
	mem := memory.New(nil)
	t.Cleanup(func() { mem.Close() })
	for name, store := range map[string]sluice.Store{
		"memory": mem,
		"redis":  redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)}),
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
	var logs syncBuffer
	h := &holds{
		store:  redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}),
		logger: slog.New(slog.NewJSONHandler(&logs, nil)),
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
	if lines := logs.records(t); inOne && len(lines) != 2 {
		t.Errorf("lines at once %v, want one per kind", lines)
	}
	time.Sleep(every + every/2)
	lines := logs.records(t)
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

// syncBuffer is a slog JSON sink safe for timers' goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// records returns the records written so far.
func (b *syncBuffer) records(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for l := range strings.Lines(b.buf.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}
