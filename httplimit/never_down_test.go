package httplimit

import (
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/problem"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

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
			if d, n := e.obs.get("big/denied"), e.obs.get("big/error"); d != 1 || n != 0 {
				t.Errorf("observed %d denials and %d errors of big, want 1 and 0", d, n)
			}
			if r := e.get("/", "X-Cost", "1", "X-Account", "acme"); r.status != http.StatusServiceUnavailable {
				t.Errorf("cost 1, Redis down: %d %s, want 503", r.status, r.body)
			}
		})
	}
}
