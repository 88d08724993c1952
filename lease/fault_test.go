package lease_test

import (
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// events counts a resilient store's backend calls by operation.
type events struct {
	mu  sync.Mutex
	ops map[string]int
}

func (e *events) ObserveDecision(sluice.DecisionEvent) {}
func (e *events) ObserveBreaker(sluice.BreakerEvent)   {}
func (e *events) ObserveStore(ev sluice.StoreEvent) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ops == nil {
		e.ops = map[string]int{}
	}
	e.ops[ev.Op]++
}

func (e *events) total() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, c := range e.ops {
		n += c
	}
	return n
}

// Leases over a failure policy over a real Redis, stopped with SIGSTOP: a
// live lease answers locally without the breaker or Redis; once it is gone
// the failure policy answers (the fallback never grants); with Redis back,
// grants resume.
func TestFaultLeaseFailurePolicy(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	ev := &events{}
	rs, err := resilient.NewMulti(redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}), &resilient.Options{
		Timeout: 100 * time.Millisecond, ProbeInterval: 100 * time.Millisecond, Observer: ev,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	const d = time.Second
	s, err := lease.New(rs, &lease.Options{MaxStaleness: d, Size: 1000})
	if err != nil {
		t.Fatal(err)
	}
	l := sluice.PerMinute(600_000)
	first := take(t, s, "k", l, 1)
	if first.Source != sluice.SourceBackend || s.Stats().Grants != 1 {
		t.Fatalf("first take = %+v, stats %+v; want a grant", first, s.Stats())
	}

	srv.Pause(t)
	paused := time.Now()
	calls := ev.total()
	for i := range 500 {
		if dec := take(t, s, "k", l, 1); dec.Source != sluice.SourceLease || !dec.Allowed {
			if time.Since(paused) >= d/2 {
				t.Skipf("the machine is too slow: the lease neared its end after %d takes", i)
			}
			t.Fatalf("take %d with Redis stopped and the lease live = %+v; want the lease", i, dec)
		}
	}
	if got := ev.total(); got != calls {
		t.Fatalf("%d store calls while the lease was live, want none", got-calls)
	}

	time.Sleep(time.Until(paused.Add(d)))
	for i := range 20 {
		dec := take(t, s, "k", l, 1)
		if dec.Source != sluice.SourceFallback || !dec.Allowed {
			t.Fatalf("take %d with Redis stopped and the lease gone = %+v; want the fallback's answer", i, dec)
		}
	}
	if st := s.Stats(); st.Granted != 1000 {
		t.Fatalf("stats %+v: the fallback granted", st)
	}
	if rs.State() == sluice.BreakerClosed {
		t.Fatalf("breaker still closed after 20 failed calls")
	}

	srv.Stop()
	srv.Start(t)
	deadline := time.Now().Add(10 * time.Second)
	for {
		dec := take(t, s, "k", l, 1)
		if dec.Source == sluice.SourceLease {
			break
		}
		if dec.Source != sluice.SourceFallback && dec.Source != sluice.SourceBackend {
			t.Fatalf("while Redis recovers: %+v", dec)
		}
		if time.Now().After(deadline) {
			t.Fatalf("no lease 10s after Redis came back: %+v, stats %+v", dec, s.Stats())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if st := s.Stats(); st.Granted <= 1000 {
		t.Fatalf("stats %+v: no grant after Redis came back", st)
	}
}
