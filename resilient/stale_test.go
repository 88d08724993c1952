package resilient

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// held is a backend whose takes, while on is set, hang until gate is
// closed and then fail: calls sent to a master that has gone (dialling
// it, or waiting on its socket) that fail late.
type held struct {
	*flaky
	on   atomic.Bool
	n    atomic.Int64 // takes hanging
	gate chan struct{}
}

func newHeld(clock func() time.Time) *held {
	return &held{flaky: newFlaky(clock), gate: make(chan struct{})}
}

func (h *held) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	if h.on.Load() {
		h.n.Add(1)
		<-h.gate
		return sluice.Decision{}, errDown
	}
	return h.flaky.Take(ctx, key, l, cost)
}

// waitHeld waits until n takes hang.
func (h *held) waitHeld(t *testing.T, n int64) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); h.n.Load() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d takes hanging, want %d", h.n.Load(), n)
		}
	}
}

// hang starts n takes of key on s that hang in h, sent 20ms apart on clk,
// and returns them to wait for once h.gate is closed.
func hang(t *testing.T, s *Store, h *held, clk *storetest.Clock, key string, n int) *sync.WaitGroup {
	t.Helper()
	h.on.Store(true)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { s.Take(context.Background(), key, sluice.PerSecond(1000), 1) })
		h.waitHeld(t, int64(i+1))
		clk.Advance(20 * time.Millisecond)
	}
	h.on.Store(false)
	return &wg
}

// heldParted is held over a backend of partitions (parted's).
type heldParted struct {
	*held
	parts *parted
}

func (h heldParted) Partition(key string) string { return h.parts.Partition(key) }

// newHeldParted is a FailOpen store on clk over a heldParted backend,
// telling rec.
func newHeldParted(t *testing.T) (s *Store, h *held, parts *parted, clk *storetest.Clock, rec *recorder) {
	clk = storetest.NewClock(t0)
	h = newHeld(clk.Now)
	parts = &parted{flaky: h.flaky}
	rec = &recorder{}
	s = newStore(t, heldParted{h, parts}, &Options{Policy: FailOpen, Clock: clk.Now, Observer: rec, Timeout: slow, Logger: discard})
	return s, h, parts, clk, rec
}

// Calls sent while the breaker was closed that fail only after it opened,
// half-opened and closed on a good probe leave it closed: they tell of the
// backend before the probe judged it anew. A Sentinel switch did this:
// the breaker closed on the new master at once, then reopened on calls
// still dialling the old one, and closed again 1.7 s later.
func TestStaleFailuresDoNotReopen(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	h := newHeld(clk.Now)
	rec := &recorder{}
	s := newStore(t, h, &Options{Policy: FailOpen, Clock: clk.Now, Observer: rec, Timeout: slow, Logger: discard, CloseAfter: 1})
	s.br.jitter = nil
	ctx := context.Background()
	lim := sluice.PerSecond(1000)

	// 30 calls sent over 600ms hang: enough, once they fail, to open a
	// closed breaker both by rate (30 of 30) and by DeadAfter.
	wg := hang(t, s, h, clk, "k", 30)

	// Other calls fail at once and open the breaker.
	h.mode.Store(1)
	takeUntilOpen(t, s, clk, "k", lim)
	// The backend is back: a probe closes it.
	h.mode.Store(0)
	clk.Advance(time.Second)
	if d, err := s.Take(ctx, "k", lim, 1); err != nil || d.Source != sluice.SourceBackend || s.State() != sluice.BreakerClosed {
		t.Fatalf("probe: %+v, %v, state %v; want answered, closed", d, err, s.State())
	}
	// Now the calls sent before the opening fail.
	close(h.gate)
	wg.Wait()
	if got := s.State(); got != sluice.BreakerClosed {
		t.Errorf("after failures of calls sent before the opening: %v, want closed", got)
	}
	want := []sluice.BreakerState{sluice.BreakerOpen, sluice.BreakerHalfOpen, sluice.BreakerClosed}
	if got := rec.breakers; !equal(got, want) {
		t.Errorf("breaker events = %v, want %v", got, want)
	}
	// Calls sent since still count: failures over DeadAfter open it.
	h.mode.Store(1)
	for range 3 {
		clk.Advance(300 * time.Millisecond)
		s.Take(ctx, "k", lim, 1)
	}
	if got := s.State(); got != sluice.BreakerOpen {
		t.Errorf("after new calls failed for 600ms: %v, want open", got)
	}
}

// A probe sent before its breaker last changed state says nothing of the
// breaker's state now: a partition's breaker that Probe closed and forgot
// (its keys moved to another master) while a request's probe was out to
// the old master is not reopened when that probe fails.
func TestStaleProbeDoesNotReopen(t *testing.T) {
	t.Parallel()
	s, h, parts, clk, rec := newHeldParted(t)
	ctx := context.Background()
	lim := sluice.PerSecond(1000)
	h.mode.Store(1)
	takeUntilOpen(t, s, clk, "a1", lim)
	h.mode.Store(0)
	clk.Advance(2 * time.Second) // past the probe interval and its jitter
	h.on.Store(true)
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Take(ctx, "a1", lim, 1) // the probe, out to A
	}()
	h.waitHeld(t, 1)
	h.on.Store(false)
	parts.mu.Lock()
	parts.moved = "B" // a failover: A's keys live on B now
	parts.mu.Unlock()
	if _, err := s.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	close(h.gate) // the probe out to A fails
	<-done
	want := []sluice.BreakerState{sluice.BreakerOpen, sluice.BreakerHalfOpen, sluice.BreakerClosed}
	if got := rec.breakers; !equal(got, want) {
		t.Errorf("breaker events = %v, want %v (A's, closed and forgotten, not reopened)", got, want)
	}
	if got := s.State(); got != sluice.BreakerClosed {
		t.Errorf("state %v, want closed", got)
	}
}

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

// The default fallback keeps time by Options.Clock, as the breaker and the
// deny cache do: with Redis refusing connections, a key the fallback
// denied for an hour is admitted again once the injected clock has moved
// an hour, while the real clock has not.
func TestDefaultFallbackUsesClock(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	clk := storetest.NewClock(t0)
	s := newStore(t, redisstore.New(c, nil), &Options{Clock: clk.Now, Logger: discard})
	lim := sluice.PerHour(1)
	take := func(what string, want bool) {
		t.Helper()
		d, err := s.Take(context.Background(), "k", lim, 1)
		if err != nil || d.Allowed != want || d.Source != sluice.SourceFallback {
			t.Fatalf("%s: %+v, %v; want allowed=%v by the fallback", what, d, err, want)
		}
	}
	take("first take", true)
	take("second take", false)
	clk.Advance(time.Hour)
	take("an hour later by the injected clock", true)
}

// evictionRecorder is a recorder that also adds up EvictionEvents.
type evictionRecorder struct {
	recorder
	keys atomic.Uint64
}

func (e *evictionRecorder) ObserveEvictions(ev sluice.EvictionEvent) { e.keys.Add(ev.Keys) }

// The default fallback that evicts keys during an outage says so as
// sluice serve's memory store does: one WARN line when it starts, an
// EvictionEvent per growth, FallbackEvictions reporting it, and one INFO
// line once it has stopped for a minute.
func TestDefaultFallbackEvictionsTold(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	clk := storetest.NewClock(t0)
	log, obs := &lines{}, &evictionRecorder{}
	s := newStore(t, redisstore.New(c, nil), &Options{Clock: clk.Now, Logger: slog.New(log), Observer: obs, FallbackMaxKeys: 64})
	flood := func(from int) {
		for i := range 200 {
			if d, err := s.Take(context.Background(), fmt.Sprint("k", from+i), sluice.PerHour(10), 1); err != nil || d.Source != sluice.SourceFallback {
				t.Fatalf("take: %+v, %v; want a fallback decision", d, err)
			}
		}
	}
	count := func(msg string) (n int) {
		for _, l := range log.all() {
			if strings.HasPrefix(l, msg) {
				n++
			}
		}
		return n
	}
	const on, off = "resilient: fallback store evicting keys", "resilient: fallback store no longer evicting keys"
	flood(0)
	clk.Advance(2 * time.Second)
	flood(1000)
	ev, evicting := s.FallbackEvictions()
	if ev.Keys == 0 || !evicting {
		t.Fatalf("FallbackEvictions = %+v, %v after 400 keys into 64: want evictions, evicting", ev, evicting)
	}
	if got := obs.keys.Load(); got != ev.Keys {
		t.Errorf("EvictionEvents add up to %d keys, FallbackEvictions says %d", got, ev.Keys)
	}
	if count(on) != 1 || count(off) != 0 {
		t.Errorf("lines %q: want one %q and no %q", log.all(), on, off)
	}
	clk.Advance(evictQuiet + 2*time.Second)
	if _, evicting := s.FallbackEvictions(); evicting {
		t.Error("still evicting after a quiet minute")
	}
	if count(on) != 1 || count(off) != 1 {
		t.Errorf("lines %q: want one %q and one %q", log.all(), on, off)
	}
}
