package httplimit

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// A lease store whose MaxStaleness applies to every limit serves a sliding
// window log rule exactly, layered with a leased rule: the log's limit
// holds to the request, and no request fails.
func TestLeaseLogRule(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	mem := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	testLeaseLogRule(t, clk, mem)
}

func TestRedisLeaseLogRule(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	rs := middlewaretest.Redis(t, clk)
	testLeaseLogRule(t, clk, rs)
}

func testLeaseLogRule(t *testing.T, clk *storetest.Clock, g sluice.Granter) {
	t.Helper()
	ls, err := lease.New(g, &lease.Options{MaxStaleness: time.Second, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvStore(t, clk, ls, []Rule{
		{Name: "log", Limit: sluice.PerMinute(3).WithAlgorithm(sluice.SlidingWindowLog), Key: Global()},
		{Name: "api", Limit: sluice.PerMinute(1000), Key: Global()},
	}, &Options{AllowedHeaders: AllHeaders})
	for i, want := range []int{200, 200, 200, 429, 429} {
		if r := e.get("/"); r.status != want {
			t.Fatalf("request %d: %d %q, want %d", i+1, r.status, r.body, want)
		}
	}
	clk.Advance(time.Minute)
	if r := e.get("/"); r.status != 200 {
		t.Fatalf("a minute later: %d %q, want 200", r.status, r.body)
	}
}

// A rule the lease store refuses for every key fails New, not every
// request.
func TestLeaseRefusedAtNew(t *testing.T) {
	t.Parallel()
	mem := middlewaretest.Memory(t)
	ls, err := lease.New(mem, &lease.Options{MaxStaleness: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rules := []Rule{{Name: "fast", Limit: sluice.PerSecond(10), Key: Global()}}
	if _, err := New(ls, rules, nil); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, lease.ErrInvalidStaleness) {
		t.Errorf("MaxStaleness above a rule's period: New err = %v, want ErrInvalidConfig and lease.ErrInvalidStaleness", err)
	}
	if _, err := New(&lease.Store{}, []Rule{{Name: "api", Limit: sluice.PerMinute(10), Key: Global()}}, nil); !errors.Is(err, lease.ErrNoGranter) {
		t.Errorf("zero lease.Store: New err = %v, want lease.ErrNoGranter", err)
	}
}

// A Penalty rule's block key has a limit of its own, one unit per Penalty:
// a lease store whose staleness is longer than the Penalty refuses it for
// every key, so New refuses the rule rather than every request failing.
// A Penalty the staleness fits is leased and blocks as it should.
func TestRedisLeasePenaltyCheckedAtNew(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(time.Now().Truncate(time.Second))
	rs := middlewaretest.Redis(t, clk)
	ls, err := lease.New(rs, &lease.Options{MaxStaleness: time.Second, Clock: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	rule := Rule{Name: "login", Limit: sluice.Limit{Rate: 2, Period: 10 * time.Second}, Key: Global(), Strategy: Penalty, Penalty: 200 * time.Millisecond}
	if _, err := New(ls, []Rule{rule}, nil); !errors.Is(err, ErrInvalidConfig) || !errors.Is(err, lease.ErrInvalidStaleness) {
		t.Fatalf("Penalty shorter than MaxStaleness: New err = %v, want ErrInvalidConfig and lease.ErrInvalidStaleness", err)
	}
	rule.Penalty = 2 * time.Second
	e := newEnvStore(t, clk, ls, []Rule{rule}, nil)
	for i, want := range []int{200, 200, 429} {
		if r := e.get("/"); r.status != want {
			t.Fatalf("request %d: %d %q, want %d", i+1, r.status, r.body, want)
		}
	}
	clk.Advance(5 * time.Second) // the limit would admit one again
	if r := e.get("/"); r.status != 200 {
		t.Fatalf("after the penalty: %d %q, want 200", r.status, r.body)
	}
}
