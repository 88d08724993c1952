package enforce

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// On Redis, one event per policy per request that decided it: an admitted
// layered request observes every rule, a denied one only the rules that
// denied it (the others took nothing), and a request whose store fails
// after a rule denied it (a blocked Penalty rule, a counter over its
// capacity) observes that rule once, as denied, and the others as errors.
func TestObserveOncePerPolicy(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	var obs events
	e := New(s, &obs)
	run := func(name string, checks []Check, all bool, want string) {
		t.Helper()
		obs = nil
		if all {
			e.EnforceAll(ctx, checks)
		} else {
			e.Enforce(ctx, checks)
		}
		if got := obs.String(); got != want {
			t.Errorf("%s: observed %q, want %q", name, got, want)
		}
	}
	// A foreign value under a key: the store fails every call on it.
	poison := func(key string, l sluice.Limit) {
		t.Helper()
		k := s.Keys(key, l)[0]
		if err := c.RPush(ctx, k, "x").Err(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Del(context.Background(), k) })
	}

	a := &Rule{Name: "a", Limit: sluice.PerMinute(3)}
	b := &Rule{Name: "b", Limit: sluice.PerMinute(5).WithAlgorithm(sluice.FixedWindow)}
	layered := func() []Check { return []Check{{Rule: a, Key: "a", Cost: 1}, {Rule: b, Key: "b", Cost: 1}} }
	for range 3 {
		run("admitted", layered(), false, "a=allowed b=allowed")
	}
	run("denied by a", layered(), false, "a=denied")

	p := &Rule{Name: "p", Limit: sluice.PerMinute(1), Strategy: Penalty, Penalty: time.Minute}
	q := &Rule{Name: "q", Limit: sluice.PerMinute(1), Strategy: Penalty, Penalty: time.Minute}
	pc := Check{Rule: p, Key: "p", PenaltyKey: "p!", Cost: 1}
	run("p admitted", []Check{pc}, false, "p=allowed")
	run("p denied, blocked", []Check{pc}, false, "p=denied")
	poison("q!", q.PenaltyLimit())
	run("p blocked, q's block unreadable", []Check{pc, {Rule: q, Key: "q", PenaltyKey: "q!", Cost: 1}}, false, "p=denied q=error")

	o := &Rule{Name: "o", Limit: sluice.PerMinute(4)}
	poison("r", a.Limit)
	run("o over capacity, r unreadable", []Check{{Rule: o, Key: "o", Cost: 5}, {Rule: a, Key: "r", Cost: 1}}, true, "o=denied a=error")
}
