package resilient

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// slow is the timeout of tests that are not about timeouts: long enough
// that a busy machine never trips it.
const slow = time.Minute

// flaky wraps a real memory store and fails, or stalls, on demand: the
// breaker and the timeout are about how a backend fails, not what it
// computes. Real Redis failures are in fault_test.go.
type flaky struct {
	*memory.Store
	mode  atomic.Int32 // 0 ok, 1 fail, 2 stall (ignores its context), 3 stall until the context ends
	calls atomic.Int64
	stall chan struct{}
	delay atomic.Int64 // ns each call waits, in real time, before it is made
}

var errDown = errors.New("backend down")

// newStore is New that fails the test on an error and closes the store
// when the test ends.
func newStore(t *testing.T, backend sluice.Store, o *Options) *Store {
	t.Helper()
	s, err := New(backend, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// newMultiStore is newStore for NewMulti.
func newMultiStore(t *testing.T, backend sluice.MultiStore, o *Options) *MultiStore {
	t.Helper()
	s, err := NewMulti(backend, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func newFlaky(clock func() time.Time) *flaky {
	return &flaky{Store: memory.New(&memory.Options{Clock: clock, SweepInterval: -1}), stall: make(chan struct{})}
}

func (f *flaky) fail(ctx context.Context) error {
	f.calls.Add(1)
	time.Sleep(time.Duration(f.delay.Load()))
	switch f.mode.Load() {
	case 1:
		return errDown
	case 2:
		<-f.stall
		return errDown
	case 3:
		<-ctx.Done()
		return ctx.Err()
	}
	return nil
}

func (f *flaky) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	if err := f.fail(ctx); err != nil {
		return sluice.Decision{}, err
	}
	return f.Store.Take(ctx, key, l, cost)
}

func (f *flaky) Peek(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	if err := f.fail(ctx); err != nil {
		return sluice.Decision{}, err
	}
	return f.Store.Peek(ctx, key, l, cost)
}

func (f *flaky) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	if err := f.fail(ctx); err != nil {
		return nil, err
	}
	return f.Store.TakeAll(ctx, reqs)
}

// recorder is an Observer that counts what it sees.
type recorder struct {
	mu        sync.Mutex
	sources   map[sluice.Source]int
	errs      int
	breakers  []sluice.BreakerState // transitions' To
	initial   int                   // initial-state events
	forgotten []string              // partitions whose breakers went
}

func (r *recorder) ObserveDecision(sluice.DecisionEvent) {}
func (r *recorder) ObserveStore(e sluice.StoreEvent) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.sources == nil {
		r.sources = map[sluice.Source]int{}
	}
	r.sources[e.Source]++
	if e.Err != nil {
		r.errs++
	}
}
func (r *recorder) ObserveBreaker(e sluice.BreakerEvent) {
	r.mu.Lock()
	if e.Forgotten {
		r.forgotten = append(r.forgotten, e.Partition)
	} else if e.From == e.To {
		r.initial++ // the state at New: no transition
	} else {
		r.breakers = append(r.breakers, e.To)
	}
	r.mu.Unlock()
}
func (r *recorder) count(s sluice.Source) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.sources[s]
}

func TestPolicies(t *testing.T) {
	t.Parallel()
	lim := sluice.PerMinute(10)
	tests := []struct {
		name    string
		opts    Options
		allowed int // of 12 requests while the backend is down
		retry   time.Duration
	}{
		{"fail open", Options{Policy: FailOpen}, 12, 0},
		{"fail closed", Options{Policy: FailClosed, ProbeInterval: 3 * time.Second}, 0, 3 * time.Second},
		{"local", Options{Policy: FallbackLocal}, 10, 6 * time.Second},
		{"local over 2 nodes", Options{Policy: FallbackLocal, Nodes: 2}, 5, 12 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := storetest.NewClock(t0)
			b := newFlaky(clk.Now)
			b.mode.Store(1)
			o := tt.opts
			o.Clock = clk.Now
			o.Timeout = slow
			if o.Policy == FallbackLocal {
				fb := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
				t.Cleanup(func() { fb.Close() })
				o.Fallback = fb
			}
			s := newStore(t, b, &o)
			allowed := 0
			var last sluice.Decision
			for range 12 {
				d, err := s.Take(context.Background(), "k", lim, 1)
				if err != nil {
					t.Fatalf("Take: %v", err)
				}
				if d.Allowed {
					allowed++
				}
				last = d
			}
			if got, want := allowed, tt.allowed; got != want {
				t.Errorf("allowed %d of 12, want %d", got, want)
			}
			if got, want := last.RetryAfter, tt.retry; got != want {
				t.Errorf("last RetryAfter = %v, want %v", got, want)
			}
		})
	}
}

func equal[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// A stalled backend is abandoned at the timeout: in its own goroutine even
// if it ignores its context; in the caller's (TrustContext) when it does not.
func TestTimeoutStalledBackend(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		mode  int32
		trust bool
	}{{"ignores context", 2, false}, {"honours context, inline", 3, true}, {"honours context", 3, false}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testStalled(t, tt.mode, tt.trust)
		})
	}
}

func testStalled(t *testing.T, mode int32, trust bool) {
	b := newFlaky(time.Now)
	b.mode.Store(mode)
	t.Cleanup(func() { close(b.stall) })
	rec := &recorder{}
	const timeout = 30 * time.Millisecond
	// DeadAfter 1ns: three timeouts in a row open the breaker.
	s, err := New(b, &Options{Policy: FailClosed, Timeout: timeout, Observer: rec, TrustContext: trust, DeadAfter: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		start := time.Now()
		d, err := s.Take(context.Background(), "k", sluice.PerSecond(10), 1)
		if err != nil {
			t.Fatal(err)
		}
		// A wide margin: this bounds a stall, it does not measure speed.
		if el := time.Since(start); el > timeout+2*time.Second {
			t.Errorf("call %d took %v with a %v timeout", i, el, timeout)
		}
		if d.Allowed {
			t.Errorf("call %d allowed under FailClosed", i)
		}
	}
	if got, want := b.calls.Load(), int64(3); got != want {
		t.Errorf("backend calls = %d, want %d (breaker opens after 3)", got, want)
	}
	if rec.errs < 3 {
		t.Errorf("observed %d errors, want >= 3", rec.errs)
	}
}

func TestDenyCache(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	b := newFlaky(clk.Now)
	s := newStore(t, b, &Options{Clock: clk.Now, Timeout: slow})
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			lim := sluice.Limit{Algorithm: a, Rate: 2, Period: time.Second}
			key := "k-" + a.String()
			calls := func() int64 { return b.calls.Load() }
			for range 2 {
				if d, _ := s.Take(context.Background(), key, lim, 1); !d.Allowed {
					t.Fatal("fresh key denied")
				}
			}
			d, err := s.Take(context.Background(), key, lim, 1)
			if err != nil || d.Allowed {
				t.Fatalf("third take: %+v, %v", d, err)
			}
			T := d.RetryAfter
			n := calls()
			// Until T every Take (and Peek) of cost 1 is answered locally,
			// with a RetryAfter that counts down to the same instant.
			for _, at := range []time.Duration{0, T / 3, T - time.Microsecond} {
				clk.Set(t0.Add(at))
				for _, take := range []bool{true, false} {
					op := s.Peek
					if take {
						op = s.Take
					}
					d, err := op(context.Background(), key, lim, 1)
					if err != nil || d.Allowed {
						t.Fatalf("at %v: %+v, %v", at, d, err)
					}
					if got, want := d.RetryAfter, T-at; got != want {
						t.Errorf("at %v: RetryAfter = %v, want %v", at, got, want)
					}
				}
			}
			if got := calls(); got != n {
				t.Errorf("backend called %d times while cached", got-n)
			}
			// A different cost is not answered from the cache.
			if _, err := s.Take(context.Background(), key, lim, 2); err != nil {
				t.Fatal(err)
			}
			if got := calls(); got != n+1 {
				t.Errorf("cost 2: backend calls %d, want 1", got-n)
			}
			// At T the backend is asked again, and admits.
			clk.Set(t0.Add(T))
			d, err = s.Take(context.Background(), key, lim, 1)
			if err != nil || !d.Allowed {
				t.Fatalf("at T: %+v, %v", d, err)
			}
			if got := calls(); got != n+2 {
				t.Errorf("at T: backend calls %d, want 2", got-n)
			}
			clk.Set(t0)
			if err := s.Reset(context.Background(), key, lim); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The cached answer is exactly the backend's: a store without the cache,
// stepped through the same trace, gives the same denials.
func TestDenyCacheMatchesBackend(t *testing.T) {
	t.Parallel()
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			clk := storetest.NewClock(t0)
			cached, err := New(memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1}), &Options{Clock: clk.Now, Timeout: slow})
			if err != nil {
				t.Fatal(err)
			}
			plain := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
			lim := sluice.Limit{Algorithm: a, Rate: 5, Period: 700 * time.Millisecond}
			if a == sluice.GCRA || a == sluice.TokenBucket {
				lim.Burst = 3
			}
			seq := uint64(1)
			for i := range 3000 {
				seq = seq*6364136223846793005 + 1442695040888963407
				clk.Advance(time.Duration(seq>>40%40_000) * time.Microsecond)
				cost := int64(seq>>20%3) + 1
				cost = min(cost, lim.Capacity())
				want, err1 := plain.Take(context.Background(), "k", lim, cost)
				// the plain store took; mirror it only when it admitted
				got, err2 := cached.Peek(context.Background(), "k", lim, cost)
				if err1 != nil || err2 != nil {
					t.Fatal(err1, err2)
				}
				if want.Allowed {
					if _, err := cached.Take(context.Background(), "k", lim, cost); err != nil {
						t.Fatal(err)
					}
				}
				if got.Allowed != want.Allowed || (!want.Allowed && got.RetryAfter != want.RetryAfter) {
					t.Fatalf("step %d (cost %d): cached %+v, backend %+v", i, cost, got, want)
				}
			}
		})
	}
}

func TestDenyCacheBounded(t *testing.T) {
	t.Parallel()
	c := newDenyCache(64, nil)
	d := sluice.Decision{Limit: sluice.PerSecond(1), RetryAfter: time.Hour}
	for i := range 10_000 {
		c.put(string(rune('a'+i%26))+string(rune(i)), d.Limit, 1, d, t0)
	}
	if got := c.len(); got > 64 {
		t.Errorf("cache holds %d entries, bound 64", got)
	}
}

func TestBadInputIsNotAFailure(t *testing.T) {
	t.Parallel()
	b := newFlaky(time.Now)
	s, err := New(b, &Options{Policy: FailClosed, FailureThreshold: 1, Timeout: slow})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		key  string
		lim  sluice.Limit
		cost int64
		want error
	}{
		{"empty key", "", sluice.PerSecond(1), 1, sluice.ErrInvalidKey},
		{"long key", string(make([]byte, sluice.MaxKeyLen+1)), sluice.PerSecond(1), 1, sluice.ErrInvalidKey},
		{"bad limit", "k", sluice.Limit{}, 1, sluice.ErrInvalidLimit},
		{"zero cost", "k", sluice.PerSecond(1), 0, sluice.ErrInvalidCost},
		{"cost over burst", "k", sluice.PerSecond(1), 2, sluice.ErrCostExceedsBurst},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := s.Take(context.Background(), tt.key, tt.lim, tt.cost)
			if !errors.Is(err, tt.want) {
				t.Errorf("Take: %v, want %v", err, tt.want)
			}
		})
	}
	if got := b.calls.Load(); got != 0 {
		t.Errorf("backend called %d times for bad input", got)
	}
	if got := s.State(); got != sluice.BreakerClosed {
		t.Errorf("bad input changed the breaker to %v", got)
	}
}

func TestCallerContextEnded(t *testing.T) {
	t.Parallel()
	b := newFlaky(time.Now)
	b.mode.Store(2)
	t.Cleanup(func() { close(b.stall) })
	s, err := New(b, &Options{Policy: FailOpen, FailureThreshold: 1, Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go cancel()
	_, err = s.Take(ctx, "k", sluice.PerSecond(1), 1)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Take = %v, want context.Canceled", err)
	}
	if got := s.State(); got != sluice.BreakerClosed {
		t.Errorf("a caller giving up opened the breaker: %v", got)
	}
}

func TestTakeAll(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	b := newFlaky(clk.Now)
	rec := &recorder{}
	s := newMultiStore(t, b, &Options{Clock: clk.Now, Observer: rec, Timeout: slow})
	ip := sluice.PerMinute(2)
	user := sluice.PerMinute(100)
	reqs := []sluice.Request{{Key: "ip", Limit: ip, Cost: 1}, {Key: "user", Limit: user, Cost: 1}}
	for i, want := range []bool{true, true, false, false} {
		ds, err := s.TakeAll(context.Background(), reqs)
		if err != nil {
			t.Fatal(err)
		}
		if ds[0].Allowed != want || !ds[1].Allowed {
			t.Fatalf("request %d: %+v", i, ds)
		}
	}
	// The second denial came from the cache: the backend saw 3 calls.
	if got := b.calls.Load(); got != 3 {
		t.Errorf("backend calls = %d, want 3", got)
	}
	// Nothing leaked from the user limit: 2 taken, 98 left.
	d, err := b.Store.Peek(context.Background(), "user", user, 1)
	if err != nil || d.Remaining != 98 {
		t.Errorf("user limit: %+v, %v; want 98 remaining", d, err)
	}
	// Backend down: the local fallback checks all-or-nothing too.
	b.mode.Store(1)
	clk.Advance(time.Hour)
	for i, want := range []bool{true, true, false} {
		ds, err := s.TakeAll(context.Background(), reqs)
		if err != nil {
			t.Fatal(err)
		}
		if ds[0].Allowed != want {
			t.Fatalf("fallback request %d: %+v", i, ds)
		}
	}
	if rec.count(sluice.SourceFallback) != 3 {
		t.Errorf("fallback answered %d, want 3", rec.count(sluice.SourceFallback))
	}
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	m := memory.New(nil)
	t.Cleanup(func() { m.Close() })
	tests := []struct {
		name    string
		backend sluice.Store
		opts    *Options
	}{
		{"nil backend", nil, nil},
		{"bad policy", m, &Options{Policy: 9}},
		{"negative timeout", m, &Options{Timeout: -1}},
		{"negative nodes", m, &Options{Nodes: -1}},
		{"negative threshold", m, &Options{FailureThreshold: -1}},
		{"negative probe", m, &Options{ProbeInterval: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.backend, tt.opts); !errors.Is(err, ErrInvalidOptions) {
				t.Errorf("New = %v, want ErrInvalidOptions", err)
			}
		})
	}
	if _, err := NewMulti(nil, nil); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("NewMulti(nil) = %v", err)
	}
	if _, err := NewMulti(m, &Options{Fallback: onlyStore{m}}); !errors.Is(err, ErrInvalidOptions) {
		t.Errorf("NewMulti with a non-multi fallback = %v", err)
	}
	s, err := New(m, nil)
	if err != nil {
		t.Fatalf("nil options: %v", err)
	}
	s.Close()
}

type onlyStore struct{ sluice.Store }

func TestLocalLimit(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		l     sluice.Limit
		nodes int64
		cost  int64
		want  sluice.Limit
	}{
		{"one node", sluice.PerMinute(100), 1, 1, sluice.PerMinute(100)},
		{"divided", sluice.PerMinute(100), 4, 1, sluice.PerMinute(25)},
		{"at least one", sluice.PerMinute(3), 10, 1, sluice.PerMinute(1)},
		{"burst divided", sluice.PerSecond(10).WithBurst(40), 4, 1, sluice.PerSecond(2).WithBurst(10)},
		{"capacity covers cost", sluice.PerSecond(10), 4, 5, sluice.PerSecond(2).WithBurst(5)},
		{"window covers cost", sluice.PerMinute(10).WithAlgorithm(sluice.FixedWindow), 4, 5, sluice.PerMinute(5).WithAlgorithm(sluice.FixedWindow)},
		{"window keeps burst == rate", sluice.PerMinute(10).WithAlgorithm(sluice.SlidingWindowLog).WithBurst(10), 2, 1, sluice.PerMinute(5).WithAlgorithm(sluice.SlidingWindowLog).WithBurst(5)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := localLimit(tt.l, tt.nodes, tt.cost); got != tt.want {
				t.Errorf("localLimit(%v, %d, %d) = %v, want %v", tt.l, tt.nodes, tt.cost, got, tt.want)
			}
		})
	}
}

func TestParsePolicy(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		in   string
		want Policy
	}{{"local", FallbackLocal}, {"Fail-Open", FailOpen}, {"fail_closed", FailClosed}, {"closed", FailClosed}} {
		got, err := ParsePolicy(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParsePolicy(%q) = %v, %v", tt.in, got, err)
		}
	}
	if _, err := ParsePolicy("maybe"); !errors.Is(err, ErrUnknownPolicy) {
		t.Errorf("ParsePolicy(maybe) = %v", err)
	}
	var p Policy
	if err := p.UnmarshalText([]byte("open")); err != nil || p != FailOpen {
		t.Errorf("UnmarshalText: %v, %v", p, err)
	}
}

// Decisions say who answered, so that callers can tell a made-up denial
// (FailClosed) from a limit's own.
func TestDecisionSource(t *testing.T) {
	t.Parallel()
	lim := sluice.PerMinute(1)
	for _, p := range []Policy{FallbackLocal, FailOpen, FailClosed} {
		t.Run(p.String(), func(t *testing.T) {
			t.Parallel()
			clk := storetest.NewClock(t0)
			b := newFlaky(clk.Now)
			s := newMultiStore(t, b, &Options{Policy: p, Clock: clk.Now, Timeout: slow, FailureThreshold: 100})
			ctx := context.Background()
			check := func(what string, d sluice.Decision, want sluice.Source) {
				t.Helper()
				if d.Source != want {
					t.Errorf("%s: Source = %v, want %v", what, d.Source, want)
				}
			}
			d, _ := s.Take(ctx, "k", lim, 1)
			check("backend take", d, sluice.SourceBackend)
			d, _ = s.Take(ctx, "k", lim, 1)
			check("backend denial", d, sluice.SourceBackend)
			d, _ = s.Peek(ctx, "k", lim, 1)
			check("cached denial", d, sluice.SourceDenyCache)
			ds, _ := s.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: lim, Cost: 1}, {Key: "u", Limit: lim, Cost: 1}})
			for i := range ds {
				check("cached TakeAll", ds[i], sluice.SourceDenyCache)
			}
			b.mode.Store(1)
			want := map[Policy]sluice.Source{FallbackLocal: sluice.SourceFallback, FailOpen: sluice.SourceFailOpen, FailClosed: sluice.SourceFailClosed}[p]
			d, _ = s.Take(ctx, "x", lim, 1)
			check("take while down", d, want)
			d, _ = s.Peek(ctx, "x", lim, 1)
			check("peek while down", d, want)
			ds, _ = s.TakeAll(ctx, []sluice.Request{{Key: "y", Limit: lim, Cost: 1}, {Key: "z", Limit: lim, Cost: 1}})
			for i := range ds {
				check("TakeAll while down", ds[i], want)
			}
		})
	}
}

// Zero values refuse every call with ErrZeroStore instead of panicking.
func TestZeroStore(t *testing.T) {
	t.Parallel()
	var s Store
	var m MultiStore
	storetest.Refuses(t, &s, ErrZeroStore)
	storetest.Refuses(t, &m, ErrZeroStore)
	if got := s.State(); got != sluice.BreakerClosed {
		t.Errorf("State = %v, want closed", got)
	}
	if got := m.State(); got != sluice.BreakerClosed {
		t.Errorf("MultiStore.State = %v, want closed", got)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
	if err := m.Close(); err != nil {
		t.Errorf("MultiStore.Close = %v", err)
	}
}

// The conformance suite over a healthy memory backend: resilient answers
// as its backend does (without the deny cache, whose answers name their
// own Source).
func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) sluice.Store {
		m := memory.New(&memory.Options{Clock: now})
		t.Cleanup(func() { m.Close() })
		return conformanceStore(t, m, now)
	})
}

// conformanceStore is the Store TestConformance runs the suite on. Its
// Timeout is slow: the suite's clock is fake, but the timeout runs on the
// real one, and a call the race detector on a busy machine holds past the
// default 50ms would be answered by the fallback, a local store of its
// own, which admits what the backend has already denied.
func conformanceStore(t *testing.T, backend sluice.MultiStore, now func() time.Time) *MultiStore {
	t.Helper()
	s := newMultiStore(t, backend, &Options{Logger: discard, Clock: now, DenyCacheSize: -1, Timeout: slow})
	return s
}

// A backend call held up in real time, as a goroutine the scheduler or
// the race detector keeps waiting, is still the backend's answer in the
// conformance suite, whose fake clock does not move meanwhile.
func TestConformanceStoreOutlastsStalls(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	b := newFlaky(clk.Now)
	t.Cleanup(func() { b.Close() })
	s := conformanceStore(t, b, clk.Now)
	lim := sluice.PerHour(1)
	if d, err := s.Take(context.Background(), "k", lim, 1); err != nil || !d.Allowed {
		t.Fatalf("first take = %+v, %v; want allowed", d, err)
	}
	b.delay.Store(int64(2 * DefaultTimeout))
	d, err := s.Take(context.Background(), "k", lim, 1)
	if err != nil || d.Allowed || d.Source != sluice.SourceBackend {
		t.Fatalf("second take, held up %v = %+v, %v; want the backend's denial", 2*DefaultTimeout, d, err)
	}
}

// DenyCacheFor bounds how long a denial is kept (a Reset elsewhere reaches
// the key then), while the cached answer still tells the backend's own
// RetryAfter; a key it gives no bound keeps its denial until then.
func TestDenyCacheFor(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	b := newFlaky(clk.Now)
	const keep = 5 * time.Second
	s, err := New(b, &Options{Clock: clk.Now, Timeout: slow, DenyCacheFor: func(key string, _ sluice.Limit) time.Duration {
		if key == "leased" {
			return keep
		}
		return 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	lim := sluice.PerMinute(2).WithAlgorithm(sluice.FixedWindow)
	for _, key := range []string{"leased", "other"} {
		clk.Set(t0)
		for range 2 {
			s.Take(context.Background(), key, lim, 1)
		}
		d, _ := s.Take(context.Background(), key, lim, 1)
		if d.Allowed || d.RetryAfter <= keep {
			t.Fatalf("%s: third take %+v; want denied for over %v", key, d, keep)
		}
		T := d.RetryAfter
		clk.Advance(keep - time.Microsecond)
		if d, _ := s.Take(context.Background(), key, lim, 1); d.Source != sluice.SourceDenyCache || d.RetryAfter != T-keep+time.Microsecond {
			t.Errorf("%s: just before %v: %+v; want the cached denial, RetryAfter the backend's", key, keep, d)
		}
		if err := b.Reset(context.Background(), key, lim); err != nil { // another process's Reset
			t.Fatal(err)
		}
		clk.Advance(time.Microsecond)
		d, _ = s.Take(context.Background(), key, lim, 1)
		if want := key == "leased"; d.Allowed != want {
			t.Errorf("%s: %v after the denial, the key reset elsewhere: %+v; want allowed %v", key, keep, d, want)
		}
	}
}
