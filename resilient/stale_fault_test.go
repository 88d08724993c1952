package resilient

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// failedAfter counts the takes that failed after a time set later.
type failedAfter struct {
	recorder
	after atomic.Int64 // UnixNano; 0: not set
	n     atomic.Int64
}

func (f *failedAfter) ObserveStore(e sluice.StoreEvent) {
	f.recorder.ObserveStore(e)
	if at := f.after.Load(); e.Err != nil && at != 0 && time.Now().UnixNano() > at {
		f.n.Add(1)
	}
}

// A switch of master as a Sentinel's: the client's master is an address
// that accepts connections and never answers, then a real Redis. Calls
// sent to the old one open the breaker as they time out; the switch has
// ProbeNow close it at once on the new one, and the calls still out to
// the old one, failing after that, leave it closed.
func TestFaultStaleCallsAfterSwitch(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	old := redistest.Listen(t) // a master gone silent: nothing answers
	var master atomic.Value
	master.Store(old.Addr().String())
	// Each call on a connection of its own (MaxBatch 1), as calls still
	// dialling the old master are: none of them holds up the probe.
	c := redis.NewClient(&redis.Options{
		Addr: "master",
		Dialer: func(ctx context.Context, network, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, network, master.Load().(string))
		},
		ContextTimeoutEnabled: true,
		MaxRetries:            -1,
		PoolSize:              1000, // the probe must not queue behind the calls out to the old master
	})
	t.Cleanup(func() { c.Close() })
	rec := &failedAfter{}
	const timeout = time.Second
	s, err := New(redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), MaxBatch: 1}), &Options{
		Policy: FailOpen, Timeout: timeout, DeadAfter: 200 * time.Millisecond, CloseAfter: 1,
		ProbeInterval: time.Hour, Observer: rec, Logger: discard,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	lim := sluice.PerSecond(100_000)

	var wg sync.WaitGroup
	for start := time.Now(); s.State() == sluice.BreakerClosed; time.Sleep(10 * time.Millisecond) {
		if time.Since(start) > 10*timeout {
			t.Fatal("the breaker never opened")
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.Take(ctx, "k", lim, 1)
		}()
	}
	master.Store(srv.Addr)
	if err := s.ProbeNow(ctx); err != nil || s.State() != sluice.BreakerClosed {
		t.Fatalf("after the switch: ProbeNow = %v, state %v; want closed", err, s.State())
	}
	rec.after.Store(time.Now().UnixNano())
	wg.Wait()
	if n := rec.n.Load(); n < 10 {
		t.Fatalf("%d calls sent to the old master failed after the breaker closed, want at least 10", n)
	}
	want := []sluice.BreakerState{sluice.BreakerOpen, sluice.BreakerHalfOpen, sluice.BreakerClosed}
	if got := rec.breakers; !equal(got, want) {
		t.Errorf("breaker events = %v, want %v: reopened by the calls still out to the old master", got, want)
	}
	if d, err := s.Take(ctx, "k", lim, 1); err != nil || d.Source != sluice.SourceBackend {
		t.Errorf("after: %+v, %v; want decided on the new master", d, err)
	}
}
