package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/line"
	"github.com/sluicehq/sluice/internal/openloop"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

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
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	checkDelayDeadline(t, store)
}

func TestRedisDelayDeadline(t *testing.T) {
	checkDelayDeadline(t, redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)}))
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
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
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
