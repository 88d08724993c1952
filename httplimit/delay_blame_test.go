package httplimit

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

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
				store = redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
			} else {
				m := memory.New(nil)
				t.Cleanup(func() { m.Close() })
				store = m
			}
			obs := &recorder{}
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
			if n := obs.get("slow/denied"); n != 0 {
				t.Errorf("observer: slow denied %d, want 0 (its wait fits MaxDelay)", n)
			}
			if n := obs.get("cap/denied"); n != refused {
				t.Errorf("observer: cap denied %d, want %d", n, refused)
			}
		})
	}
}
