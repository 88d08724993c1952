package httplimit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/line"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/openloop"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/memory"
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
			store := middlewaretest.Memory(t)
			checkLine(t, delayRuns(t, store, 4, tc.n, tc.maxDelay), tc.minServed, tc.maxServed, quick, tc.slow, tc.maxDelay)
		})
	}
}

// The same on a real Redis.
func TestRedisDelayLineRefusesAtOnce(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	store := middlewaretest.Redis(t, nil)
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
	store := middlewaretest.Memory(t)
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
	store := middlewaretest.Memory(t)
	checkDelayOpenLoop(t, store)
}

func TestRedisDelayLineOpenLoop(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	checkDelayOpenLoop(t, middlewaretest.Redis(t, nil))
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
// its exact wait: 2 per 10s, both units taken at T0 (a frozen clock), one
// request held in line. Both units come back at 10s, so with a MaxDelay of
// 13s the second request waits in line (it was told 20s, a Period more,
// and refused at once), and a third, whose units come back a Period after
// the first, is refused at once with Retry-After 20.
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
	checkDelaySlidingLogExact(t, middlewaretest.Redis(t, clock), clock)
}

func checkDelaySlidingLogExact(t *testing.T, store sluice.Store, clock *storetest.Clock) {
	// The line's head asks the store again once the wait it was told has
	// passed in real time, and leaves the line past MaxDelay: a Period of
	// 10s, not 1s, keeps it in line however slowly the machine runs the
	// requests behind it.
	limit := sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 2, Period: 10 * time.Second}
	m, err := New(store, []Rule{{Name: "d", Limit: limit, Key: Global(), Strategy: Delay, MaxDelay: 13 * time.Second}}, &Options{Clock: clock.Now})
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
	checks, err := m.rules.Collect(httptest.NewRequest("GET", "/", nil), nil)
	if err != nil || len(checks) != 1 {
		t.Fatalf("Collect: %v, %v", checks, err)
	}
	answered := make(chan *http.Response, 2)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for n := range 2 { // the first in line; the second behind it
		wg.Go(func() {
			if resp, err := get(); err == nil {
				answered <- resp
			}
		})
		for deadline := time.Now().Add(5 * time.Second); line.Held(store, checks[0].Key) <= n; time.Sleep(time.Millisecond) {
			select {
			case resp := <-answered:
				t.Fatalf("request %d answered %d, Retry-After %q; want it held in line", n, resp.StatusCode, resp.Header.Get(HeaderRetryAfter))
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("request %d not in line after 5s (%d held)", n, line.Held(store, checks[0].Key))
			}
		}
	}
	resp, err := get()
	if err != nil || resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get(HeaderRetryAfter) != "20" {
		t.Fatalf("third request: %v, %v; want 429 at once with Retry-After 20", resp, err)
	}
	if n := line.Held(store, checks[0].Key); n != 2 {
		t.Errorf("%d requests in line after the third, want the first two", n)
	}
}

// deadlineServer serves m behind a handler that gives each request the
// deadline of its "deadline" query parameter (as a server's timeout
// middleware would), and counts the requests whose context had ended by
// the time the middleware answered: those were held to their deadline.
func deadlineServer(t *testing.T, m *Middleware, expired *atomic.Int64) *httptest.Server {
	h := m.Handler(okHandler)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if d, err := time.ParseDuration(r.URL.Query().Get("deadline")); err == nil {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		h.ServeHTTP(w, r.WithContext(ctx))
		if ctx.Err() != nil {
			expired.Add(1)
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func getStatus(t *testing.T, srv *httptest.Server, query string) (int, time.Duration) {
	t.Helper()
	resp, err := srv.Client().Get(srv.URL + "/?" + query)
	if err != nil {
		t.Error(err)
		return 0, 0
	}
	resp.Body.Close()
	secs, _ := strconv.Atoi(resp.Header.Get(HeaderRetryAfter))
	return resp.StatusCode, time.Duration(secs) * time.Second
}

// A Delay rule refuses at once, with the wait it would have needed, a
// request whose context's deadline comes before its units could, as it
// refuses one past MaxDelay: first denied, and a newcomer that finds a
// line. Not parallel: it watches this process's lines.
func TestDelayDeadline(t *testing.T) {
	store := middlewaretest.Memory(t)
	checkDelayDeadline(t, store)
}

func TestRedisDelayDeadline(t *testing.T) {
	checkDelayDeadline(t, middlewaretest.Redis(t, nil))
}

func checkDelayDeadline(t *testing.T, store sluice.Store) {
	for _, tc := range []struct {
		name    string
		limit   sluice.Limit
		waiting bool // another request is held in line first
		least   time.Duration
	}{
		// One a minute: the second request needs ~60s, its deadline is 2s.
		{"first", sluice.PerMinute(1), false, 50 * time.Second},
		// One a second: behind a held request, a newcomer needs ~2s.
		{"line", sluice.PerSecond(1), true, 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, err := New(store, []Rule{{Name: "d", Limit: tc.limit, Key: Global(), Strategy: Delay, MaxDelay: time.Hour}},
				&Options{Prefix: "deadline-" + tc.name + ":"})
			if err != nil {
				t.Fatal(err)
			}
			var expired atomic.Int64
			srv := deadlineServer(t, m, &expired)
			if code, _ := getStatus(t, srv, ""); code != http.StatusOK {
				t.Fatalf("first request: %d", code)
			}
			held := make(chan int, 1)
			if tc.waiting {
				go func() { code, _ := getStatus(t, srv, "deadline=10s"); held <- code }()
				for line.Len() == 0 {
					time.Sleep(time.Millisecond)
				}
			}
			code, retry := getStatus(t, srv, "deadline=1500ms")
			if code != http.StatusTooManyRequests || retry < tc.least {
				t.Errorf("request with a 1.5s deadline: %d, Retry-After %v; want 429 with at least %v", code, retry, tc.least)
			}
			if tc.waiting {
				if code := <-held; code != http.StatusOK {
					t.Errorf("held request: %d, want 200", code)
				}
			}
			if n := expired.Load(); n != 0 {
				t.Errorf("%d requests answered after their deadline; want the refusal at once", n)
			}
		})
	}
}

// An open-loop schedule through a Delay rule with a long MaxDelay, each
// request with a 500ms deadline: the deadline, not MaxDelay, bounds the
// wait, so a request the line cannot serve by then is refused at once
// rather than held to its deadline and refused.
func TestDelayDeadlineOpenLoop(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	store := middlewaretest.Memory(t)
	limit := sluice.PerSecond(10)
	openloop.Replay(t, 3, limit, func(t *testing.T, name string) func() bool {
		m, err := New(store, []Rule{{Name: "d", Limit: limit, Key: Global(), Strategy: Delay, MaxDelay: 5 * time.Second}},
			&Options{Prefix: "deadline-" + name + ":"})
		if err != nil {
			t.Fatal(err)
		}
		var expired atomic.Int64
		srv := deadlineServer(t, m, &expired)
		srv.Client().Transport.(*http.Transport).MaxIdleConnsPerHost = 64
		t.Cleanup(func() {
			if n := expired.Load(); n > 1 {
				t.Errorf("%d requests answered after their deadline", n)
			}
		})
		return func() bool {
			code, _ := getStatus(t, srv, "deadline=500ms")
			if code != http.StatusOK && code != http.StatusTooManyRequests {
				t.Errorf("status %d", code)
			}
			return code == http.StatusOK
		}
	})
}

// wroteStatus records the status a handler wrote (0: none).
type wroteStatus struct {
	http.ResponseWriter
	code int
}

func (s *wroteStatus) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *wroteStatus) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// A request a Delay rule holds whose client gives up is no denial: the
// Observer counts none, and the middleware writes nothing to the dead
// connection (it wrote 429 and counted "denied"). One whose deadline,
// set on the server's side, passes while it waits behind another gets a
// 503, not a 429, and is no denial either. On frozen clocks (memory and a
// real Redis), so that a held request stays held: 1/s with a burst of 10,
// all taken (Redis keeps the key 10s of real time), MaxDelay 10s.
func TestDelayAbandoned(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	mem := memory.New(&memory.Options{Clock: clock.Now})
	t.Cleanup(func() { mem.Close() })
	for name, store := range map[string]sluice.Store{
		"memory": mem,
		"redis":  middlewaretest.Redis(t, clock),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obs := &middlewaretest.Decisions{}
			m, err := New(store, []Rule{{Name: "d", Limit: sluice.PerSecond(1).WithBurst(10), Key: Global(), Strategy: Delay, MaxDelay: 10 * time.Second}},
				&Options{Observer: obs, Clock: clock.Now})
			if err != nil {
				t.Fatal(err)
			}
			h := m.Handler(okHandler)
			wrote := make(chan int, 4)
			srv := serveUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/deadline" { // a server-side deadline the 2s wait fits
					ctx, cancel := context.WithTimeout(r.Context(), 2500*time.Millisecond)
					defer cancel()
					r = r.WithContext(ctx)
				}
				sw := &wroteStatus{ResponseWriter: w}
				h.ServeHTTP(sw, r)
				wrote <- sw.code
			}))
			get := func(ctx context.Context, path string) (*http.Response, error) {
				req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
				resp, err := srv.Client().Do(req)
				if err == nil {
					resp.Body.Close()
				}
				return resp, err
			}
			for i := range 10 {
				if resp, err := get(context.Background(), "/"); err != nil || resp.StatusCode != http.StatusOK {
					t.Fatalf("request %d of the burst: %v, %v", i, resp, err)
				}
				<-wrote
			}

			// Clients that give up while held.
			for i := range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				_, err := get(ctx, "/")
				cancel()
				if err == nil {
					t.Fatalf("request %d answered on a frozen clock, want held until its client gave up", i)
				}
				select {
				case code := <-wrote:
					if code != 0 {
						t.Errorf("request %d, its client gone: the middleware wrote %d, want nothing", i, code)
					}
				case <-time.After(5 * time.Second):
					t.Fatalf("request %d still held 5s after its client gave up", i)
				}
			}

			// A deadline set on the server's side, the client waiting, behind
			// a request held first (whose client then gives up).
			first, stop := context.WithCancel(context.Background())
			firstDone := make(chan struct{})
			go func() {
				defer close(firstDone)
				get(first, "/")
			}()
			probe := httptest.NewRequest("GET", "/", nil)
			checks, err := m.rules.Collect(probe, nil)
			if err != nil || len(checks) != 1 {
				t.Fatalf("Collect: %v, %v", checks, err)
			}
			for deadline := time.Now().Add(5 * time.Second); !line.Waiting(store, checks[0].Key) && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
			resp, err := get(context.Background(), "/deadline")
			if err != nil {
				t.Fatal(err)
			}
			if code := <-wrote; code != http.StatusServiceUnavailable {
				t.Errorf("request held past its server-side deadline: the middleware wrote %d, want 503", code)
			}
			stop()
			<-firstDone
			if code := <-wrote; code != 0 {
				t.Errorf("the request ahead, its client gone: the middleware wrote %d, want nothing", code)
			}
			if resp.StatusCode != http.StatusServiceUnavailable || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
				t.Errorf("request held past its server-side deadline: %d %q, want a 503 problem", resp.StatusCode, resp.Header.Get("Content-Type"))
			}
			if resp.Header.Get(HeaderRetryAfter) != "" {
				t.Errorf("request held past its deadline: Retry-After %q, want none (no denial)", resp.Header.Get(HeaderRetryAfter))
			}
			if n := obs.Get("d/denied"); n != 0 {
				t.Errorf("Observer counted %d denials, want none: no request was answered one", n)
			}
			if n := obs.Get("d/allowed"); n != 10 {
				t.Errorf("Observer counted %d admitted, want the burst's 10", n)
			}
		})
	}
}

// A Delay rule layered with a Reject rule: requests refused because the
// Reject rule would need 20 s blame it, in the headers, the body and the
// observer, and never the Delay rule, whose wait would have fit its
// MaxDelay. On Redis the refusal used to name the Delay rule with the
// Reject rule's wait, and on memory the observer counted both.
func TestDelayRejectBlame(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"memory", "redis", "memory/sequential", "redis/sequential"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// Sequential: no line forms; the third request waits its 0.5 s
			// and the later ones are refused by cap at once.
			sequential := strings.HasSuffix(name, "/sequential")
			var store sluice.Store
			if strings.HasPrefix(name, "redis") {
				store = middlewaretest.Redis(t, nil)
			} else {
				m := middlewaretest.Memory(t)
				store = m
			}
			obs := &middlewaretest.Decisions{}
			mw, err := New(store, []Rule{
				{Name: "slow", Limit: sluice.PerSecond(2), Key: Global(), Strategy: Delay, MaxDelay: 3 * time.Second},
				{Name: "cap", Limit: sluice.PerMinute(3), Key: Global()},
			}, &Options{Observer: obs})
			if err != nil {
				t.Fatal(err)
			}
			srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
			t.Cleanup(srv.Close)
			var (
				wg       sync.WaitGroup
				mu       sync.Mutex
				refused  int
				problems []string
			)
			for range 6 {
				wg.Add(1)
				request := func() {
					defer wg.Done()
					resp, err := http.Get(srv.URL)
					if err != nil {
						t.Error(err)
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusTooManyRequests {
						return
					}
					mu.Lock()
					defer mu.Unlock()
					refused++
					h := resp.Header
					if !strings.HasPrefix(h.Get(HeaderRateLimit), `"cap";`) || !strings.HasPrefix(h.Get(HeaderRateLimitPolicy), `"cap";`) ||
						!strings.Contains(string(b), `"policy":"cap"`) || h.Get(HeaderRetryAfter) != "20" {
						problems = append(problems, fmt.Sprintf("RateLimit %q, Policy %q, Retry-After %q, body %s",
							h.Get(HeaderRateLimit), h.Get(HeaderRateLimitPolicy), h.Get(HeaderRetryAfter), b))
					}
				}
				if sequential {
					request()
				} else {
					go request()
				}
			}
			wg.Wait()
			for _, p := range problems {
				t.Errorf("a refusal not blaming cap: %s", p)
			}
			if refused != 3 {
				t.Errorf("%d refused, want 3 (cap is 3 a minute)", refused)
			}
			if n := obs.Get("slow/denied"); n != 0 {
				t.Errorf("observer: slow denied %d, want 0 (its wait fits MaxDelay)", n)
			}
			if n := obs.Get("cap/denied"); n != refused {
				t.Errorf("observer: cap denied %d, want %d", n, refused)
			}
		})
	}
}

// A flood on a Delay rule holds at most MaxWaiting requests; every other
// request is refused at once, so goroutines and memory stay bounded however
// many arrive, and the held ones leave when their callers give up, with
// nothing written (no 429: nobody is there to read it).
//
// Not parallel: it counts the process's goroutines, so it runs alone.
func TestDelayFloodBounded(t *testing.T) {
	const (
		maxWaiting = 64
		wave       = 5000
		waves      = 3
		slack      = 50 // goroutines of the runtime and the test itself
	)
	clk := storetest.NewClock(t0) // stands still: nothing held is ever admitted
	store := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { store.Close() })
	m, err := New(store, []Rule{{
		Name: "d", Limit: sluice.PerSecond(1), Key: Global(), Strategy: Delay,
		MaxDelay: time.Hour, MaxWaiting: maxWaiting,
	}}, &Options{Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(okHandler)

	ctx, giveUp := context.WithCancel(context.Background())
	defer giveUp()
	var (
		wg       sync.WaitGroup
		finished atomic.Int64
		statusMu sync.Mutex
		status   = map[int]int{}
	)
	serve := func() {
		defer wg.Done()
		rec := &wroteStatus{ResponseWriter: httptest.NewRecorder()}
		h.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, "GET", "/", nil))
		statusMu.Lock()
		status[rec.code]++
		statusMu.Unlock()
		finished.Add(1)
	}
	// settle waits until cond holds, polling; the flood's goroutines take
	// a moment to exit after they finish.
	settle := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: timed out (goroutines %d)", what, runtime.NumGoroutine())
			}
		}
	}
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapInuse
	}

	base := runtime.NumGoroutine()
	heapBase := heap()
	for w := 1; w <= waves; w++ {
		for range wave {
			wg.Add(1)
			go serve()
		}
		// All but the held ones finish: one admitted, the rest refused.
		settle("the refused requests to return", func() bool { return finished.Load() == int64(w*wave-maxWaiting) })
		settle("their goroutines to exit", func() bool { return runtime.NumGoroutine() <= base+maxWaiting+slack })
		if grown := int64(heap()) - int64(heapBase); grown > 8<<20 {
			t.Errorf("wave %d: heap grew %d bytes holding %d requests", w, grown, maxWaiting)
		}
	}
	statusMu.Lock()
	if got, want := status[http.StatusOK], 1; got != want {
		t.Errorf("admitted %d, want %d", got, want)
	}
	if got, want := status[http.StatusTooManyRequests], waves*wave-maxWaiting-1; got != want {
		t.Errorf("refused %d at once, want %d", got, want)
	}
	statusMu.Unlock()

	giveUp()
	wg.Wait()
	settle("the held requests' goroutines to exit", func() bool { return runtime.NumGoroutine() <= base+slack })
	if got, want := status[http.StatusTooManyRequests], waves*wave-maxWaiting-1; got != want {
		t.Errorf("refused %d in all, want %d", got, want)
	}
	if got := status[0]; got != maxWaiting {
		t.Errorf("%d answered nothing, want the %d held ones, given up", got, maxWaiting)
	}
}
