package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// While a penalty block runs, Retry-After is the longer of the block's
// rest and the limit's own wait: a client that waits as told is admitted,
// not refused and blocked again.
func TestPenaltyRetryAfterWhileBlocked(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	store := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	defer store.Close()
	mw, err := httplimit.New(store, []httplimit.Rule{{
		Name: "login", Limit: sluice.PerMinute(1), Key: httplimit.PeerIP(),
		Strategy: httplimit.Penalty, Penalty: 2 * time.Second,
	}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	get := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest("GET", "/", nil)
		r.RemoteAddr = "192.0.2.1:1"
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	get()      // admitted
	get()      // the violation: the block starts
	w := get() // blocked
	ra, _ := strconv.Atoi(w.Header().Get("Retry-After"))
	if w.Code != http.StatusTooManyRequests || ra < 59 {
		t.Fatalf("blocked: %d, Retry-After %d; want 429 and the limit's wait (about 60s)", w.Code, ra)
	}
	clock.Advance(time.Duration(ra) * time.Second)
	if w := get(); w.Code != http.StatusOK {
		t.Errorf("after waiting the %ds told: %d, Retry-After %s", ra, w.Code, w.Header().Get("Retry-After"))
	}
}
