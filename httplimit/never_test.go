package httplimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/problem"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// costHeader is the request's cost, from its X-Cost field.
func costHeader(r *http.Request) int64 {
	n, _ := strconv.ParseInt(r.Header.Get("X-Cost"), 10, 64)
	return n
}

// checkNever checks that r answers a request costing 11 units of rule big's
// 10 as one that can never be admitted: 429 problem+json with no
// Retry-After or RateLimit field (no wait admits it), RateLimit-Policy and
// X-RateLimit-Limit still sent; it returns the body.
func checkNever(t *testing.T, r response) Problem {
	t.Helper()
	if r.status != http.StatusTooManyRequests || r.header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("cost 11 of 10: %d %q %s, want 429 problem+json", r.status, r.header.Get("Content-Type"), r.body)
	}
	for _, f := range []string{HeaderRetryAfter, HeaderRateLimit} {
		if v := r.header.Get(f); v != "" {
			t.Errorf("%s: %q, want none: no wait admits the request", f, v)
		}
	}
	if got := r.header.Get(HeaderRateLimitPolicy); got != `"big";q=10;w=60` {
		t.Errorf("RateLimit-Policy %q", got)
	}
	if got := r.header.Get(HeaderLimit); got != "10" {
		t.Errorf("X-RateLimit-Limit %q, want 10", got)
	}
	var p Problem
	if err := json.Unmarshal([]byte(r.body), &p); err != nil {
		t.Fatalf("%s: %v", r.body, err)
	}
	return p
}

// A request costing more than its rule's capacity is a 429 that says it can
// never be admitted, with no Retry-After, and takes nothing: not from its
// rule, nor from a layered one, and it starts no Penalty block; a Delay rule
// does not hold it. On Redis, over a real listener.
func TestRedisCostOverCapacity(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	for _, st := range []Strategy{Reject, Delay, Penalty} {
		t.Run(st.String(), func(t *testing.T) {
			t.Parallel()
			store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
			e := newEnvStore(t, storetest.NewClock(time.Now()), store, []Rule{
				{Name: "account", Limit: sluice.PerHour(1), Key: Header("X-Account")},
				{Name: "big", Limit: sluice.PerMinute(10), Key: PeerIP(), Cost: costHeader, Strategy: st, MaxDelay: onlyFor(st, Delay), Penalty: onlyFor(st, Penalty)},
			}, nil)
			start := time.Now()
			r := e.get("/", "X-Cost", "11", "X-Account", "acme")
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("answered after %v: held", took)
			}
			p := checkNever(t, r)
			want := Problem{Type: problem.NeverType, Title: problem.NeverTitle, Status: 429, Policy: "big", Cost: 11, Capacity: 10}
			detail := p.Detail
			p.Detail = ""
			if p != want {
				t.Errorf("body %+v, want %+v", p, want)
			}
			for _, s := range []string{"costs 11 units", `"big"`, "more than 10", "never be allowed"} {
				if !strings.Contains(detail, s) {
					t.Errorf("detail %q does not say %q", detail, s)
				}
			}
			if strings.Contains(r.body, "retry_after") {
				t.Errorf("body %s has a retry_after", r.body)
			}
			if n := e.obs.Get("big/denied"); n != 1 {
				t.Errorf("observed %d denials of big, want 1", n)
			}
			// Nothing was taken: the whole capacity, and the account's one
			// unit an hour, are there, and no block stands.
			if r := e.get("/", "X-Cost", "10", "X-Account", "acme"); r.status != 200 {
				t.Errorf("cost 10 after the refusal: %d %s, want 200", r.status, r.body)
			}
			if r := e.get("/", "X-Cost", "1", "X-Account", "acme"); r.status != 429 || r.header.Get(HeaderRetryAfter) == "" {
				t.Errorf("over the limit: %d %v, want 429 with Retry-After", r.status, r.header)
			}
		})
	}
}

// A DenyHandler is told that the request can never be admitted.
func TestCostOverCapacityDenyHandler(t *testing.T) {
	t.Parallel()
	got := make(chan Denial, 1)
	e := newEnv(t, []Rule{{Name: "c", Limit: sluice.PerSecond(5).WithBurst(7), Key: PeerIP(), Cost: costHeader}}, &Options{
		DenyHandler: func(w http.ResponseWriter, _ *http.Request, d Denial) {
			got <- d
			w.WriteHeader(http.StatusTeapot)
		},
	})
	if r := e.get("/", "X-Cost", "8"); r.status != http.StatusTeapot || r.header.Get(HeaderRetryAfter) != "" {
		t.Fatalf("%d %v", r.status, r.header)
	}
	d := <-got
	if !d.Never() || d.Policy != "c" || d.Cost != 8 || d.Capacity != 7 || d.Decision.Allowed || d.Decision.RetryAfter != 0 {
		t.Errorf("Denial %+v", d)
	}
	if r := e.get("/", "X-Cost", "7"); r.status != 200 {
		t.Errorf("cost 7 after the refusal: %d", r.status)
	}
	if r := e.get("/", "X-Cost", "1"); r.status != http.StatusTeapot {
		t.Errorf("over the limit: %d", r.status)
	}
	if d := <-got; d.Never() || d.Cost != 1 || d.Decision.RetryAfter <= 0 {
		t.Errorf("a plain denial: %+v", d)
	}
}

// onlyFor is an hour under strategy want and 0 under st otherwise: a
// rule's MaxDelay and Penalty are refused under other strategies.
func onlyFor(st, want Strategy) time.Duration {
	if st == want {
		return time.Hour
	}
	return 0
}

// A request costing more than its rule's capacity is denied whatever the
// store says: with Redis down and no failure policy it still gets its 429
// saying it can never be admitted, without the figures the store would
// have given (X-RateLimit-Remaining, X-RateLimit-Reset), while a request
// the store must decide gets the 503 of a store failure.
func TestRedisDownCostOverCapacity(t *testing.T) {
	t.Parallel()
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { client.Close() })
	for _, st := range []Strategy{Reject, Delay, Penalty} {
		t.Run(st.String(), func(t *testing.T) {
			t.Parallel()
			store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
			e := newEnvStore(t, storetest.NewClock(time.Now()), store, []Rule{
				{Name: "account", Limit: sluice.PerHour(1), Key: Header("X-Account")},
				{Name: "big", Limit: sluice.PerMinute(10), Key: PeerIP(), Cost: costHeader, Strategy: st, MaxDelay: onlyFor(st, Delay), Penalty: onlyFor(st, Penalty)},
			}, &Options{AllowedHeaders: AllHeaders})
			r := e.get("/", "X-Cost", "11", "X-Account", "acme")
			p := checkNever(t, r)
			for _, f := range []string{HeaderRemaining, HeaderReset} { // the store's figures
				if v := r.header.Get(f); v != "" {
					t.Errorf("%s: %q, want none with Redis down", f, v)
				}
			}
			if p.Type != problem.NeverType || p.Policy != "big" || p.Cost != 11 || p.Capacity != 10 {
				t.Errorf("body %+v", p)
			}
			if d, n := e.obs.Get("big/denied"), e.obs.Get("big/error"); d != 1 || n != 0 {
				t.Errorf("observed %d denials and %d errors of big, want 1 and 0", d, n)
			}
			if r := e.get("/", "X-Cost", "1", "X-Account", "acme"); r.status != http.StatusServiceUnavailable {
				t.Errorf("cost 1, Redis down: %d %s, want 503", r.status, r.body)
			}
		})
	}
}
