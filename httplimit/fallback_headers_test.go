package httplimit

import (
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// While FallbackLocal answers (a real Redis server stopped), a response
// states one limit, this process's share: X-RateLimit-Limit and
// RateLimit-Policy's q agree. RateLimit-Policy used to keep the rule's 100
// beside a limit of 25. While Redis is up both say 100.
func TestFallbackHeadersStateTheShare(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	st, err := resilient.NewMulti(redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}),
		// A generous Timeout: on a loaded machine a first call (a dial, a
		// script load) may take longer than the default 50ms, and the
		// fallback would answer while Redis is up.
		&resilient.Options{Nodes: 4, Timeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	for _, set := range []HeaderSet{AllHeaders, StandardHeaders} {
		t.Run(set.String(), func(t *testing.T) {
			mw, err := New(st, []Rule{{Name: "api", Limit: sluice.PerMinute(100), Key: Global()}}, &Options{AllowedHeaders: set, Prefix: set.String() + ":"})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
			t.Cleanup(ts.Close)
			get := func() http.Header {
				resp, err := http.Get(ts.URL)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.Header
			}
			if h := get(); h.Get(HeaderRateLimitPolicy) != `"api";q=100;w=60` || set == AllHeaders && h.Get(HeaderLimit) != "100" {
				t.Errorf("Redis up: Limit %q, Policy %q; want 100 in both", h.Get(HeaderLimit), h.Get(HeaderRateLimitPolicy))
			}
		})
	}
	srv.Stop()
	for _, set := range []HeaderSet{AllHeaders, StandardHeaders} {
		t.Run(set.String()+"/down", func(t *testing.T) {
			mw, err := New(st, []Rule{{Name: "api", Limit: sluice.PerMinute(100), Key: Global()}}, &Options{AllowedHeaders: set, Prefix: set.String() + "-down:"})
			if err != nil {
				t.Fatal(err)
			}
			ts := httptest.NewServer(mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})))
			t.Cleanup(ts.Close)
			for i := range 27 { // the share is 25: two denials too
				resp, err := http.Get(ts.URL)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				h := resp.Header
				if h.Get(HeaderRateLimitPolicy) != `"api";q=25;w=60` {
					t.Errorf("request %d (%d), Redis down: Policy %q, want the share's q=25", i, resp.StatusCode, h.Get(HeaderRateLimitPolicy))
				}
				if l := h.Get(HeaderLimit); (set == AllHeaders || resp.StatusCode == http.StatusTooManyRequests) && l != "25" {
					t.Errorf("request %d (%d), Redis down: X-RateLimit-Limit %q, want 25", i, resp.StatusCode, l)
				}
			}
		})
	}
}
