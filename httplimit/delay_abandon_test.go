package httplimit

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/line"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

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
		"redis":  redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now}),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			obs := &recorder{}
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
			if n := obs.get("d/denied"); n != 0 {
				t.Errorf("Observer counted %d denials, want none: no request was answered one", n)
			}
			if n := obs.get("d/allowed"); n != 10 {
				t.Errorf("Observer counted %d admitted, want the burst's 10", n)
			}
		})
	}
}
