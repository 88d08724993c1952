package httplimit

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/storetest"
)

// unicodeName is a rule name with printable non-ASCII characters and
// quotes: details quote it as strconv.Quote does, é and α as written.
const unicodeName = `connexion-réseau "α"`

// A rule's name reaches every problem detail as written, printable
// Unicode as is and quotes escaped (strconv.Quote), never as a Go escape
// such as \u00e9, in the JSON text itself: a rate denial, a request no
// wait admits, an in-flight refusal, a shed request and a rule the store
// refuses. Over a real listener, the last on Redis.
func TestNamesInProblemDetails(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, what string, r response, status int, policy bool) {
		t.Helper()
		if r.status != status {
			t.Fatalf("%s: %d %s, want %d", what, r.status, r.body, status)
		}
		if strings.Contains(r.body, `\u`) || !strings.Contains(r.body, "réseau") || !strings.Contains(r.body, "α") {
			t.Errorf("%s: body %s: the name is not as written", what, r.body)
		}
		var p Problem
		if err := json.Unmarshal([]byte(r.body), &p); err != nil {
			t.Fatalf("%s: %s: %v", what, r.body, err)
		}
		if want := strconv.Quote(unicodeName); !strings.Contains(p.Detail, want) {
			t.Errorf("%s: detail %q does not name the rule as %s", what, p.Detail, want)
		}
		if policy && p.Policy != unicodeName {
			t.Errorf("%s: policy %q, want %q", what, p.Policy, unicodeName)
		}
	}

	rate := newEnv(t, []Rule{{Name: unicodeName, Limit: sluice.PerMinute(1), Key: Global()}}, nil)
	rate.get("/")
	check(t, "rate denial", rate.get("/"), http.StatusTooManyRequests, true)

	never := newEnv(t, []Rule{{Name: unicodeName, Limit: sluice.PerMinute(1), Key: Global(), Cost: func(*http.Request) int64 { return 2 }}}, nil)
	check(t, "never", never.get("/"), http.StatusTooManyRequests, true)

	for _, tt := range []struct {
		what   string
		opts   Options
		status int
	}{
		{"in-flight", Options{InFlight: []InFlightRule{{Name: unicodeName, Limit: sluice.Concurrent(1, time.Hour), Key: Global()}}}, http.StatusTooManyRequests},
		{"shed", Options{Shed: []ShedRule{{Name: unicodeName, Capacity: sluice.Concurrent(1, time.Hour)}}}, http.StatusServiceUnavailable},
		{"workers", Options{Shed: []ShedRule{{Name: unicodeName, Workers: 1}}}, http.StatusServiceUnavailable},
	} {
		g := newGate()
		e := slotEnv(t, fakeSlots(t), nil, &tt.opts, g)
		done := e.background()
		<-g.entered
		check(t, tt.what, e.get("/"), tt.status, true)
		close(g.leave)
		<-done
	}

	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	refused := newEnvStore(t, clk, leaseEveryKey(t, clk), []Rule{
		{Name: unicodeName, Limit: sluice.PerMinute(3).WithAlgorithm(sluice.SlidingWindowLog), Key: Global()},
	}, nil)
	check(t, "store refuses", refused.get("/"), http.StatusInternalServerError, false)
}
