package resilient_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/promsluice"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// leaseOver returns a resilient store falling back locally around a lease
// store over Redis.
func leaseOver(t *testing.T, o *lease.Options) *resilient.MultiStore {
	t.Helper()
	rs := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	ls, err := lease.New(rs, o)
	if err != nil {
		t.Fatal(err)
	}
	s, err := resilient.NewMulti(ls, &resilient.Options{Policy: resilient.FallbackLocal, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// takeBackend takes one unit of key under limit and wants the backend's
// answer, not the failure policy's.
func takeBackend(t *testing.T, s sluice.Store, key string, limit sluice.Limit) {
	t.Helper()
	d, err := s.Take(context.Background(), key, limit, 1)
	if err != nil {
		t.Fatalf("valid limit %v: %v", limit, err)
	}
	if d.Source == sluice.SourceFallback || !d.Allowed {
		t.Fatalf("valid limit %v: %+v, want allowed by the backend (lease or store)", limit, d)
	}
}

// A limit the lease store refuses for every key is refused when a Limiter
// is built on the resilient store around it; one that gets past (a Store
// call made directly) is the caller's error, and never opens the breaker
// for the limits that are valid.
func TestRedisLeaseRefusedLimit(t *testing.T) {
	t.Parallel()
	s := leaseOver(t, &lease.Options{MaxStaleness: time.Second})
	fast := sluice.Limit{Rate: 5, Period: 500 * time.Millisecond}
	if _, err := sluice.NewLimiter(s, fast, nil); !errors.Is(err, lease.ErrInvalidStaleness) {
		t.Fatalf("NewLimiter(%v) err = %v, want lease.ErrInvalidStaleness", fast, err)
	}
	if _, err := sluice.NewLimiter(s, sluice.PerMinute(100), nil); err != nil {
		t.Fatalf("NewLimiter(100/min): %v", err)
	}
	for i := range 40 {
		d, err := s.Take(context.Background(), "fast", fast, 1)
		if !errors.Is(err, lease.ErrInvalidStaleness) {
			t.Fatalf("take %d under %v: %+v, %v; want lease.ErrInvalidStaleness", i+1, fast, d, err)
		}
	}
	if st := s.State(); st != sluice.BreakerClosed {
		t.Fatalf("after 40 refused limits the breaker is %v, want closed", st)
	}
	takeBackend(t, s, "slow", sluice.PerMinute(100))
}

// A lease Options.For asks for of a sliding window log is refused with
// sluice.ErrGrantUnsupported: the caller's error, not the backend's.
func TestRedisLeaseGrantUnsupportedNotAFailure(t *testing.T) {
	t.Parallel()
	s := leaseOver(t, &lease.Options{For: func(string, sluice.Limit) time.Duration { return time.Second }})
	logLimit := sluice.PerMinute(10).WithAlgorithm(sluice.SlidingWindowLog)
	for i := range 40 {
		d, err := s.Take(context.Background(), "log", logLimit, 1)
		if !errors.Is(err, sluice.ErrGrantUnsupported) {
			t.Fatalf("take %d under %v: %+v, %v; want sluice.ErrGrantUnsupported", i+1, logLimit, d, err)
		}
	}
	if st := s.State(); st != sluice.BreakerClosed {
		t.Fatalf("after 40 refused limits the breaker is %v, want closed", st)
	}
	takeBackend(t, s, "api", sluice.PerMinute(100))
}

// refusingLease is a lease store (Size 10, D 50 ms) over a resilient
// store named "redis" over a Redis of its own, as a user whose keys acl
// sets (keys to begin with). The resilient store's events go to rec and to
// a collector registered in reg.
type refusingLease struct {
	acl func(keys string)
	rec *resilient.StoreEvents
	reg *prometheus.Registry
	res *resilient.MultiStore
	ls  *lease.Store
}

func newRefusingLease(t *testing.T, keys string) *refusingLease {
	t.Helper()
	r := redistest.StartServer(t)
	admin := r.Client(t)
	rl := &refusingLease{rec: &resilient.StoreEvents{}, reg: prometheus.NewRegistry()}
	rl.acl = func(keys string) {
		t.Helper()
		if err := admin.Do(context.Background(), "acl", "setuser", "leaser", "on", ">pw", "resetkeys", keys, "&*", "+@all").Err(); err != nil {
			t.Fatal(err)
		}
	}
	rl.acl(keys)
	c := redis.NewClient(&redis.Options{Addr: r.Addr, Username: "leaser", Password: "pw"})
	t.Cleanup(func() { c.Close() })
	col := promsluice.New(nil)
	rl.reg.MustRegister(col)
	var err error
	rl.res, err = resilient.NewMulti(redisstore.New(c, &redisstore.Options{Prefix: "t:"}), &resilient.Options{
		Name: "redis", Policy: resilient.FallbackLocal, Logger: slog.New(slog.DiscardHandler), Observer: multiObserver{rl.rec, col}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rl.res.Close() })
	rl.ls, err = lease.New(rl.res, &lease.Options{Size: 10, For: func(string, sluice.Limit) time.Duration { return 50 * time.Millisecond }})
	if err != nil {
		t.Fatal(err)
	}
	return rl
}

// A decision the failure policy answers for a lease call that failed
// (TakeByPolicy after a grant, PeekByPolicy after a return) is reported
// with that call's error, marked Reported, so that observers count the
// decision as answered for a failed call, and the failure once: Redis
// refuses the keys (an ACL) while the breaker stays closed.
func TestRedisByPolicyCarriesLeaseError(t *testing.T) {
	t.Parallel()
	rl := newRefusingLease(t, "~*")
	rec, reg, res, ls := rl.rec, rl.reg, rl.res, rl.ls
	limit := sluice.PerSecond(1000)
	if d, err := ls.Take(context.Background(), "peeked", limit, 1); err != nil || d.Source == sluice.SourceFallback {
		t.Fatalf("take with every key allowed: %+v, %v; want Redis's lease", d, err)
	}
	rl.acl("~t:*good*")
	rec.Take()

	d, err := ls.Take(context.Background(), "bad", limit, 1)
	if err != nil || d.Source != sluice.SourceFallback {
		t.Fatalf("take of a refused key: %+v, %v; want the failure policy's answer", d, err)
	}
	time.Sleep(60 * time.Millisecond) // the lease of "peeked" ends, holding units
	if d, err := ls.Peek(context.Background(), "peeked", limit, 1); err != nil || d.Source != sluice.SourceFallback {
		t.Fatalf("peek of a refused key whose lease ended: %+v, %v; want the failure policy's answer", d, err)
	}
	var grant, ret error
	answered := 0
	for _, e := range rec.Take() {
		switch {
		case e.Source == sluice.SourceBackend && e.Op == "grant":
			grant = e.Err
		case e.Source == sluice.SourceBackend && e.Op == "return":
			ret = e.Err
		case e.Source == sluice.SourceFallback && (e.Op == "take" || e.Op == "peek"):
			answered++
			want := grant
			if e.Op == "peek" {
				want = ret
			}
			if !e.Reported || e.Err == nil || e.Err != want {
				t.Errorf("%s answered by the policy: Err %v, Reported %v; want the failed lease call's error (%v), reported", e.Op, e.Err, e.Reported, want)
			}
		default:
			t.Errorf("unexpected event %+v", e)
		}
	}
	noperm := func(err error) bool { return err != nil && strings.Contains(err.Error(), "NOPERM") }
	if !noperm(grant) || !noperm(ret) || answered != 2 {
		t.Fatalf("grant %v, return %v, %d decisions by the policy; want both refused (NOPERM), 2 decisions", grant, ret, answered)
	}
	if st := res.State(); st != sluice.BreakerClosed {
		t.Fatalf("breaker %v, want closed", st)
	}
	// The failures are counted once, with their own calls.
	for op, want := range map[string]float64{"grant": 1, "return": 1, "take": 0, "peek": 0} {
		got, _ := promtest.Value(t, reg, "sluice_store_errors_total", map[string]string{"store": "redis", "op": op})
		if got != want {
			t.Errorf("sluice_store_errors_total{op=%q} = %v, want %v", op, got, want)
		}
	}
}

// A lease TakeAll whose grants Redis refuses (an ACL, the breaker closed)
// has its checks answered by the failure policy in one TakeAllByPolicy:
// one "take" event per check, carrying the first check's grant's error
// (its grants go out together, one event each), and no "peek", as for one
// check. Before, each of several checks was Peeked by the policy first, an
// extra sluice_store_calls_total{op="peek"} each.
func TestRedisLeaseTakeAllByPolicyEvents(t *testing.T) {
	t.Parallel()
	rl := newRefusingLease(t, "~t:*good*")
	rec, reg, ls := rl.rec, rl.reg, rl.ls
	limit := sluice.PerSecond(1000)
	rec.Take()
	for _, keys := range [][]string{{"one"}, {"b1", "b2", "b3"}} {
		reqs := make([]sluice.Request, len(keys))
		for i, k := range keys {
			reqs[i] = sluice.Request{Key: k, Limit: limit, Cost: 1}
		}
		ds, err := ls.TakeAll(context.Background(), reqs)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range ds {
			if !d.Allowed || d.Source != sluice.SourceFallback {
				t.Errorf("%s: %+v; want the failure policy's admission", keys[i], d)
			}
		}
		grants := map[string]error{}
		var taken []string
		for _, e := range rec.Take() {
			switch {
			case e.Source == sluice.SourceBackend && e.Op == "grant" && slices.Contains(keys, e.Key) && grants[e.Key] == nil:
				grants[e.Key] = e.Err
			case e.Source == sluice.SourceFallback && e.Op == "take":
				taken = append(taken, e.Key)
				if grant := grants[keys[0]]; !e.Reported || e.Err == nil || e.Err != grant {
					t.Errorf("%s answered by the policy: Err %v, Reported %v; want the first check's failed grant's error (%v), reported", e.Key, e.Err, e.Reported, grant)
				}
			default:
				t.Errorf("%d checks: unexpected event %+v", len(keys), e)
			}
		}
		if len(grants) != len(keys) {
			t.Errorf("%d checks: grants of %v; want one each, sent together", len(keys), grants)
		}
		if !slices.Equal(taken, keys) {
			t.Errorf("%d checks: policy takes of %v; want one each, %v", len(keys), taken, keys)
		}
	}
	for op, want := range map[string]float64{"take": 4, "peek": 0} {
		got, _ := promtest.Value(t, reg, "sluice_store_calls_total", map[string]string{"store": "redis", "op": op, "source": "fallback"})
		if got != want {
			t.Errorf(`sluice_store_calls_total{op=%q,source="fallback"} = %v, want %v`, op, got, want)
		}
	}
}

// multiObserver passes events to each of its observers.
type multiObserver []sluice.Observer

func (m multiObserver) ObserveDecision(e sluice.DecisionEvent) {
	for _, o := range m {
		o.ObserveDecision(e)
	}
}

func (m multiObserver) ObserveStore(e sluice.StoreEvent) {
	for _, o := range m {
		o.ObserveStore(e)
	}
}

func (m multiObserver) ObserveBreaker(e sluice.BreakerEvent) {
	for _, o := range m {
		o.ObserveBreaker(e)
	}
}

// A zero lease.Store as the fallback is refused by New: it used to be
// accepted, and then every decision of an outage failed.
func TestNewRefusesZeroLeaseFallback(t *testing.T) {
	t.Parallel()
	backend := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	if _, err := resilient.New(backend, &resilient.Options{Fallback: &lease.Store{}}); !errors.Is(err, resilient.ErrInvalidOptions) || !errors.Is(err, lease.ErrNoGranter) {
		t.Errorf("New with a zero lease.Store fallback: %v, want ErrInvalidOptions (lease.ErrNoGranter)", err)
	}
	if _, err := resilient.New(backend, &resilient.Options{Fallback: (*lease.Store)(nil)}); !errors.Is(err, resilient.ErrInvalidOptions) {
		t.Errorf("New with a nil *lease.Store fallback: %v, want ErrInvalidOptions", err)
	}
}
