package httplimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/openloop"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// quick bounds the 90th percentile of refusals "at once": generous, for
// a busy machine and the race detector; a request held to MaxDelay takes
// far longer.
const quick = 250 * time.Millisecond

// outcome is one of a burst of concurrent requests: served or refused, and
// how long it took.
type outcome struct {
	served bool
	took   time.Duration
	retry  time.Duration // a refusal's Retry-After
}

// burst runs n requests at once and returns their outcomes.
func burst(n int, do func() outcome) []outcome {
	out := make([]outcome, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range out {
		wg.Go(func() {
			<-start
			t := time.Now()
			out[i] = do()
			out[i].took = time.Since(t)
		})
	}
	close(start)
	wg.Wait()
	return out
}

// checkLine checks runs of a burst against a line's promise: between
// minServed and maxServed served, and every other refused at once (90% of
// refusals within quick, none later than slow, well before anyone held to
// MaxDelay would be), each refused at once told to retry after at least
// least: a wait just under MaxDelay is refused too once the store's round
// trip has used the rest, and Retry-After's whole seconds round it up to
// MaxDelay. A waiter a starved machine wakes late may find its unit gone
// at its turn and be refused then, told the store's shorter wait.
func checkLine(t *testing.T, runs [][]outcome, minServed, maxServed int, quick, slow, least time.Duration) {
	t.Helper()
	var refused []time.Duration
	for r, out := range runs {
		served := 0
		for _, o := range out {
			if o.served {
				served++
				continue
			}
			refused = append(refused, o.took)
			if o.retry < least && o.took <= quick {
				t.Errorf("run %d: refused with Retry-After %v, want at least %v", r, o.retry, least)
			}
		}
		if served < minServed || served > maxServed {
			t.Errorf("run %d: served %d, want %d to %d", r, served, minServed, maxServed)
		}
	}
	if len(refused) == 0 {
		t.Fatal("nothing refused")
	}
	slices.Sort(refused)
	p90, most := refused[len(refused)*9/10], refused[len(refused)-1]
	t.Logf("%d refusals: p90 %v, max %v", len(refused), p90, most)
	if p90 > quick || most > slow {
		t.Errorf("refusals took p90 %v, max %v; want at once (p90 at most %v, max %v)", p90, most, quick, slow)
	}
}

// Contention on a Delay rule: waiters form a line, so a
// request the rate cannot serve within MaxDelay is refused at once instead
// of being held to MaxDelay and then refused.
func TestDelayLineRefusesAtOnce(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	for _, tc := range []struct {
		maxDelay                time.Duration
		n, minServed, maxServed int
		slow                    time.Duration
	}{
		// 2 at once, then 0.5s, 1s, 1.5s and 2s; 14 refused.
		{2 * time.Second, 20, 5, 6, 1800 * time.Millisecond},
		// 2 at once, then 0.5s; 5 refused, none held 500ms first.
		{600 * time.Millisecond, 8, 3, 3, 400 * time.Millisecond},
	} {
		t.Run(fmt.Sprint(tc.maxDelay, "/", tc.n), func(t *testing.T) {
			t.Parallel()
			store := memory.New(nil)
			t.Cleanup(func() { store.Close() })
			checkLine(t, delayRuns(t, store, 4, tc.n, tc.maxDelay), tc.minServed, tc.maxServed, quick, tc.slow, tc.maxDelay)
		})
	}
}

// The same on a real Redis.
func TestRedisDelayLineRefusesAtOnce(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	store := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	checkLine(t, delayRuns(t, store, 3, 20, 2*time.Second), 5, 6, quick, 1800*time.Millisecond, 2*time.Second)
}

// delayRuns runs bursts of n requests at once on runs servers, each with
// its own PerSecond(2) Delay rule (so its own line), and returns their
// outcomes, timed in the server: the middleware's hold, not the dial.
func delayRuns(t *testing.T, store sluice.Store, runs, n int, maxDelay time.Duration) [][]outcome {
	out := make([][]outcome, runs)
	var wg sync.WaitGroup
	for r := range out {
		m, err := New(store, []Rule{{Name: "d", Limit: sluice.PerSecond(2), Key: Global(), Strategy: Delay, MaxDelay: maxDelay}},
			&Options{Prefix: fmt.Sprintf("line%d:", r)})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		h := m.Handler(okHandler)
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			rec := httptest.NewRecorder()
			start := time.Now()
			h.ServeHTTP(rec, req)
			took := time.Since(start)
			secs, _ := strconv.Atoi(rec.Header().Get(HeaderRetryAfter))
			mu.Lock()
			out[r] = append(out[r], outcome{served: rec.Code == http.StatusOK, took: took, retry: time.Duration(secs) * time.Second})
			mu.Unlock()
		}))
		t.Cleanup(srv.Close)
		client := srv.Client()
		client.Transport.(*http.Transport).MaxIdleConnsPerHost = n
		wg.Go(func() {
			burst(n, func() outcome {
				resp, err := client.Get(srv.URL)
				if err != nil {
					t.Error(err)
					return outcome{}
				}
				resp.Body.Close()
				return outcome{}
			})
		})
	}
	wg.Wait()
	return out
}

// The Transport's equivalent: with a 2s deadline, the requests the rate
// cannot send by then fail at once; the provider sees only those sent.
func TestTransportLineRefusesAtOnce(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	var calls atomic.Int64
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
	}))
	t.Cleanup(upstream.Close)
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	const runs, n = 4, 20
	out := make([][]outcome, runs)
	var wg sync.WaitGroup
	for r := range out {
		lim, err := sluice.NewLimiter(store, sluice.PerSecond(2), &sluice.Options{Prefix: fmt.Sprintf("t%d:", r)})
		if err != nil {
			t.Fatal(err)
		}
		tr, err := NewTransport(lim, &TransportOptions{Base: upstream.Client().Transport})
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: tr}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		t.Cleanup(cancel)
		wg.Go(func() {
			out[r] = burst(n, func() outcome {
				req, _ := http.NewRequestWithContext(ctx, "GET", upstream.URL, nil)
				resp, err := client.Do(req)
				if err != nil {
					if !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("refusal %v, want DeadlineExceeded", err)
					}
					return outcome{retry: time.Hour} // the error carries no Retry-After
				}
				resp.Body.Close()
				return outcome{served: true}
			})
		})
	}
	wg.Wait()
	// 2 at once, then 0.5s, 1s and 1.5s; the next, at 2s, is past the deadline.
	checkLine(t, out, 5, 5, quick, 1500*time.Millisecond, 0)
	if got := calls.Load(); got != runs*5 {
		t.Errorf("provider called %d times, want %d", got, runs*5)
	}
}

// An open-loop schedule through the Delay middleware on a real
// listener: requests arriving at twice the rate (periodic, and seeded
// Poisson), MaxDelay 1s. A newcomer that finds a line joins it instead of
// taking the unit its head waits for, so no request is held to MaxDelay
// and then refused (429 after ~1s): it is served, or refused at once.
func TestDelayLineOpenLoop(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	checkDelayOpenLoop(t, store)
}

func TestRedisDelayLineOpenLoop(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	checkDelayOpenLoop(t, redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)}))
}

func checkDelayOpenLoop(t *testing.T, store sluice.Store) {
	limit := sluice.PerSecond(10)
	openloop.Replay(t, 2, limit, func(t *testing.T, name string) func() bool {
		m, err := New(store, []Rule{{Name: "d", Limit: limit, Key: Global(), Strategy: Delay, MaxDelay: time.Second}},
			&Options{Prefix: name + ":"})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(m.Handler(okHandler))
		t.Cleanup(srv.Close)
		client := srv.Client()
		client.Transport.(*http.Transport).MaxIdleConnsPerHost = 64
		return func() bool {
			resp, err := client.Get(srv.URL)
			if err != nil {
				t.Error(err)
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusTooManyRequests {
				t.Errorf("status %d", resp.StatusCode)
			}
			return resp.StatusCode == http.StatusOK
		}
	})
}

// A Delay rule on a sliding window log tells a request behind the line
// its exact wait: 2/s, both units taken at T0 (a frozen clock), one
// request held in line. Both units come back at 1s, so with a MaxDelay of
// 1.3s the second request waits in line (it was told 2s, a Period more,
// and refused at once), and a third, whose units come back a Period after
// the first, is refused at once with Retry-After 2.
func TestDelayLineSlidingLogExact(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	store := memory.New(&memory.Options{Clock: clock.Now})
	t.Cleanup(func() { store.Close() })
	checkDelaySlidingLogExact(t, store, clock)
}

func TestRedisDelayLineSlidingLogExact(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	checkDelaySlidingLogExact(t, redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now}), clock)
}

func checkDelaySlidingLogExact(t *testing.T, store sluice.Store, clock *storetest.Clock) {
	limit := sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 2, Period: time.Second}
	m, err := New(store, []Rule{{Name: "d", Limit: limit, Key: Global(), Strategy: Delay, MaxDelay: 1300 * time.Millisecond}}, &Options{Clock: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(m.Handler(okHandler))
	t.Cleanup(srv.Close)
	// The clock never moves: the requests in line stay there until
	// cancelled.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	get := func() (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL, nil)
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		return resp, err
	}
	for i := range 2 {
		if resp, err := get(); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("request %d: %v, %v", i, resp, err)
		}
	}
	answered := make(chan *http.Response, 2)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range 2 { // the first in line; the second behind it
		wg.Go(func() {
			if resp, err := get(); err == nil {
				answered <- resp
			}
		})
		time.Sleep(200 * time.Millisecond)
	}
	select {
	case resp := <-answered:
		t.Fatalf("a request in line answered %d, Retry-After %q; want both held", resp.StatusCode, resp.Header.Get(HeaderRetryAfter))
	default:
	}
	resp, err := get()
	if err != nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get(HeaderRetryAfter) != "2" {
		t.Fatalf("third request: %v, %v; want 429 at once with Retry-After 2", resp, err)
	}
}
