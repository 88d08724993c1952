package httplimit

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// TestLease: the middleware takes a lease.Store as it takes any store. On
// a frozen clock, grants of 4 units of 10/min answer one request in four
// from the store and the others from the lease; X-RateLimit-Remaining is
// what is left in the lease, Reset the grant's reset, and the eleventh
// request is refused until the next unit.
func TestLease(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	mem := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	ls, err := lease.New(mem, &lease.Options{MaxStaleness: time.Second, Size: 4, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvStore(t, clk, ls, []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: Global()}}, &Options{AllowedHeaders: AllHeaders})
	steps := []struct {
		status           int
		remaining, reset int64 // reset: seconds after t0
		retry            string
	}{
		{200, 3, 24, ""}, {200, 2, 24, ""}, {200, 1, 24, ""}, {200, 0, 24, ""},
		{200, 3, 48, ""}, {200, 2, 48, ""}, {200, 1, 48, ""}, {200, 0, 48, ""},
		{200, 1, 60, ""}, {200, 0, 60, ""}, // a partial grant: 2 units left
		{429, 0, 60, "6"},
	}
	for i, st := range steps {
		r := e.get("/")
		for k, want := range map[string]string{
			"status":         strconv.Itoa(st.status),
			HeaderLimit:      "10",
			HeaderRemaining:  strconv.FormatInt(st.remaining, 10),
			HeaderReset:      strconv.FormatInt(t0.Unix()+st.reset, 10),
			HeaderRetryAfter: st.retry,
		} {
			got := r.header.Get(k)
			if k == "status" {
				got = strconv.Itoa(r.status)
			}
			if got != want {
				t.Errorf("request %d: %s = %q, want %q", i+1, k, got, want)
			}
		}
	}
	if st := ls.Stats(); st.Local != 7 || st.Grants != 4 || st.Granted != 10 {
		t.Errorf("lease stats %+v, want 7 local decisions and 10 units in 4 grants", st)
	}
}
