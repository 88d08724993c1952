package resilient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/storetest"
)

// breakerStep is one call in a breaker step table.
type breakerStep struct {
	name      string
	advance   time.Duration
	mode      int32 // backend mode before the call
	wantCalls int64 // backend calls so far, after the call
	wantState sluice.BreakerState
	wantSrc   sluice.Source
}

func TestBreaker(t *testing.T) {
	t.Parallel()
	const (
		closed = sluice.BreakerClosed
		half   = sluice.BreakerHalfOpen
		open   = sluice.BreakerOpen
		be     = sluice.SourceBackend
		fo     = sluice.SourceFailOpen
	)
	tests := []struct {
		name  string
		opts  Options
		steps []breakerStep
		want  []sluice.BreakerState
	}{{
		name: "failure rate",
		opts: Options{MinCalls: 4, CloseAfter: 2},
		steps: []breakerStep{
			{"healthy", 0, 0, 1, closed, be},
			{"1 of 2 failed: too few calls", 0, 1, 2, closed, fo},
			{"healthy again", 0, 0, 3, closed, be},
			{"2 of 4 failed opens", 0, 1, 4, open, fo},
			{"open: backend not called", 0, 0, 4, open, fo},
			{"still open at 999ms", 999 * time.Millisecond, 0, 4, open, fo},
			{"probe fails, reopens", time.Millisecond, 1, 5, open, fo},
			{"open again", 500 * time.Millisecond, 0, 5, open, fo},
			{"probe 1 succeeds: still half-open", 500 * time.Millisecond, 0, 6, half, be},
			{"probe 2 succeeds: closes", 0, 0, 7, closed, be},
			{"closing cleared the window", 0, 1, 8, closed, fo},
			{"healthy after reopening", 0, 0, 9, closed, be},
			{"2 of 3 failed", 0, 1, 10, closed, fo},
			{"the older failure slides out of the window", 10 * time.Second, 1, 11, closed, fo},
		},
		want: []sluice.BreakerState{open, half, open, half, closed},
	}, {
		name: "dead backend",
		opts: Options{CloseAfter: 1},
		steps: []breakerStep{
			{"failure 1", 0, 1, 1, closed, fo},
			{"failure 2", 100 * time.Millisecond, 1, 2, closed, fo},
			{"3 in a row, over 499ms", 399 * time.Millisecond, 1, 3, closed, fo},
			{"failing for 500ms opens", time.Millisecond, 1, 4, open, fo},
			{"probe succeeds, closes", time.Second, 0, 5, closed, be},
			{"failure 1 again", 0, 1, 6, closed, fo},
			{"a success breaks the run", 400 * time.Millisecond, 0, 7, closed, be},
			{"failure after the break", 100 * time.Millisecond, 1, 8, closed, fo},
			{"2 in a row", 400 * time.Millisecond, 1, 9, closed, fo},
			{"3 in a row, over 500ms", 400 * time.Millisecond, 1, 10, open, fo},
		},
		want: []sluice.BreakerState{open, half, closed, open},
	}, {
		name: "slow backend: long runs of few failures",
		opts: Options{},
		steps: []breakerStep{
			{"failure 1", 0, 1, 1, closed, fo},
			{"failure 2, a second later", time.Second, 1, 2, closed, fo},
			{"success", 0, 0, 3, closed, be},
			{"failure 1", time.Second, 1, 4, closed, fo},
			{"failure 2 ends 2s run, but only 2 calls", 2 * time.Second, 1, 5, closed, fo},
		},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			clk := storetest.NewClock(t0)
			b := newFlaky(clk.Now)
			rec := &recorder{}
			o := tt.opts
			o.Policy, o.Clock, o.Observer, o.Timeout, o.Logger = FailOpen, clk.Now, rec, slow, discard
			s, err := New(b, &o)
			if err != nil {
				t.Fatal(err)
			}
			s.br.jitter = nil // probes exactly every ProbeInterval
			runSteps(t, s, b, clk, rec, tt.steps)
			if got := rec.breakers; !equal(got, tt.want) {
				t.Errorf("breaker events = %v, want %v", got, tt.want)
			}
		})
	}
}

func runSteps(t *testing.T, s *Store, b *flaky, clk *storetest.Clock, rec *recorder, steps []breakerStep) {
	t.Helper()
	lim := sluice.PerSecond(1000)
	for _, st := range steps {
		clk.Advance(st.advance)
		b.mode.Store(st.mode)
		before := rec.count(st.wantSrc)
		if _, err := s.Take(context.Background(), "k", lim, 1); err != nil {
			t.Fatalf("%s: %v", st.name, err)
		}
		if got, want := b.calls.Load(), st.wantCalls; got != want {
			t.Errorf("%s: backend calls = %d, want %d", st.name, got, want)
		}
		if got, want := s.State(), st.wantState; got != want {
			t.Errorf("%s: state = %v, want %v", st.name, got, want)
		}
		if rec.count(st.wantSrc) != before+1 {
			t.Errorf("%s: not answered by %v", st.name, st.wantSrc)
		}
	}
}

var discard = slog.New(slog.DiscardHandler)

// takeUntilOpen takes key on s, 100ms apart on clk, until s's breaker
// opens: the test's backend fails them.
func takeUntilOpen(t *testing.T, s *Store, clk *storetest.Clock, key string, lim sluice.Limit) {
	t.Helper()
	for i := 0; s.State() != sluice.BreakerOpen; i++ {
		if i > 100 {
			t.Fatalf("the breaker never opened taking %q", key)
		}
		s.Take(context.Background(), key, lim, 1)
		clk.Advance(100 * time.Millisecond)
	}
}

// lines is a slog.Handler that keeps each record's message and attributes.
type lines struct {
	mu  sync.Mutex
	got []string
}

func (l *lines) Enabled(context.Context, slog.Level) bool { return true }
func (l *lines) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *lines) WithGroup(string) slog.Handler            { return l }
func (l *lines) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key != "reason" && a.Key != "err" && a.Key != "member" {
			b.WriteString(" " + a.String())
		}
		return true
	})
	l.mu.Lock()
	l.got = append(l.got, b.String())
	l.mu.Unlock()
	return nil
}

func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.got...)
}

// A flap is logged as one line per transition; nothing else, however
// many calls. The opening and the closing lines name the failure policy
// that starts and stops answering then, and the opening one counts the
// calls that failed while the breaker was closed, which has no line of its
// own; it names the error of the call that opened it.
func TestBreakerLogsFlap(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	b := newFlaky(clk.Now)
	log := &lines{}
	s := newStore(t, b, &Options{Name: "redis", Clock: clk.Now, Timeout: slow, Logger: slog.New(log), CloseAfter: 2})
	s.br.jitter = nil
	lim := sluice.PerSecond(1000)
	take := func(n int) {
		for range n {
			if _, err := s.Take(context.Background(), "k", lim, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	take(10)
	b.mode.Store(1)
	take(30) // 20 calls, 10 failed, open it; the rest fall back without a line
	clk.Advance(time.Second)
	take(5) // a failed probe
	b.mode.Store(0)
	clk.Advance(time.Second)
	take(10) // two good probes close it
	want := []string{
		// The cause, and the 9 the policy answered before the opening.
		"resilient: breaker open store=redis from=closed error=backend down policy=local answered_while_closed=9",
		"resilient: breaker half_open store=redis from=open",
		"resilient: breaker open store=redis from=half_open error=backend down",
		"resilient: breaker half_open store=redis from=open",
		"resilient: breaker closed store=redis from=half_open policy=local",
	}
	if got := log.all(); !equal(got, want) {
		t.Errorf("log lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// A run of failures is timed by when its calls were sent: calls in flight
// through a stall of the process fail together, late, and are no dead
// backend; calls sent 500ms apart that all failed are.
func TestBreakerStall(t *testing.T) {
	t.Parallel()
	b := newBreaker(&Options{Logger: discard}, "store")
	b.jitter = nil
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	b.failure(turn{}, at(0), at(50), nil) // timed out before the stall
	for i := range 4 {                    // in flight through a 600ms stall
		b.failure(turn{}, at(10+i), at(650), nil)
	}
	if got := b.current(); got != sluice.BreakerClosed {
		t.Fatalf("after a stall: %v, want closed", got)
	}
	b.failure(turn{}, at(500), at(550), nil)
	if got := b.current(); got != sluice.BreakerOpen {
		t.Errorf("after calls sent 500ms apart failed: %v, want open", got)
	}
}

// A run of failures does not span a quiet gap longer than the window: a
// few failures, minutes without calls, and one more failure leave the
// breaker closed; failures that go on for DeadAfter after it open it.
func TestBreakerQuietGap(t *testing.T) {
	t.Parallel()
	b := newBreaker(&Options{Logger: discard}, "store")
	b.jitter = nil
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	for i := range 3 {
		b.failure(turn{}, at(10*i), at(10*i+50), nil)
	}
	b.failure(turn{}, at(600_000), at(600_050), nil) // ten minutes on
	if got := b.current(); got != sluice.BreakerClosed {
		t.Fatalf("a lone failure after ten quiet minutes: %v, want closed", got)
	}
	b.failure(turn{}, at(600_300), at(600_350), nil)
	b.failure(turn{}, at(600_500), at(600_550), nil)
	if got := b.current(); got != sluice.BreakerOpen {
		t.Errorf("failures sent over 500ms after it: %v, want open", got)
	}
}

// Probe closes an open breaker that no request reaches once the backend is
// back (a take it answers), and does nothing while the breaker is closed
// or no probe is due.
func TestProbeWithoutTraffic(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	f := newFlaky(clock.Now)
	s, err := New(f, &Options{Policy: FailOpen, Clock: clock.Now, ProbeInterval: time.Second, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	if sent, err := s.Probe(context.Background()); sent || err != nil {
		t.Fatalf("closed: Probe = %v, %v; want nothing sent", sent, err)
	}
	f.mode.Store(1)
	l := sluice.PerSecond(10)
	takeUntilOpen(t, s, clock, "k", l)
	calls := f.calls.Load()
	if sent, _ := s.Probe(context.Background()); sent || f.calls.Load() != calls {
		t.Fatal("Probe sent a probe before the probe interval")
	}
	clock.Advance(2 * time.Second)
	if sent, err := s.Probe(context.Background()); !sent || err == nil || s.State() != sluice.BreakerOpen {
		t.Fatalf("backend down: Probe = %v, %v, state %v; want a failed probe, open", sent, err, s.State())
	}
	f.mode.Store(0)
	for i := range 3 {
		clock.Advance(2 * time.Second)
		if sent, err := s.Probe(context.Background()); !sent || err != nil {
			t.Fatalf("probe %d: Probe = %v, %v; want sent and answered", i, sent, err)
		}
	}
	if s.State() != sluice.BreakerClosed {
		t.Fatalf("after 3 probes answered: %v, want closed", s.State())
	}
	// The probe writes, as an allowed take does, on a key and limit of its
	// own: a backend that refuses writes fails it.
	if d, err := f.Store.Peek(context.Background(), "sluice-breaker-probe", sluice.PerSecond(1_000_000), 1); err != nil || d.Remaining == 1_000_000 || !d.Allowed {
		t.Fatalf("the probe's key: %+v, %v; want taken from, and still admitting", d, err)
	}
}

// ProbeNow, for a backend known to have recovered, closes an open breaker
// at once, without waiting out the probe interval; a failed probe leaves
// it open for another; on a closed breaker it sends nothing.
func TestProbeNow(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	f := newFlaky(clock.Now)
	s, err := New(f, &Options{Policy: FailOpen, Clock: clock.Now, ProbeInterval: time.Hour, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ProbeNow(context.Background()); err != nil || f.calls.Load() != 0 {
		t.Fatalf("closed: ProbeNow = %v after %d calls; want nothing sent", err, f.calls.Load())
	}
	f.mode.Store(1)
	takeUntilOpen(t, s, clock, "k", sluice.PerSecond(10))
	if err := s.ProbeNow(context.Background()); err == nil || s.State() != sluice.BreakerOpen {
		t.Fatalf("backend down: ProbeNow = %v, state %v; want the probe's error, open", err, s.State())
	}
	f.mode.Store(0)
	if err := s.ProbeNow(context.Background()); err != nil || s.State() != sluice.BreakerClosed {
		t.Fatalf("backend back: ProbeNow = %v, state %v; want closed within the probe interval", err, s.State())
	}
}

// A long outage's probe cycles are logged at most once a minute after the
// first ones, the skipped ones counted on the next line; every transition
// is still observed.
func TestBreakerLogsLongOutage(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	b := newFlaky(clk.Now)
	log := &lines{}
	rec := &recorder{}
	s := newStore(t, b, &Options{Name: "redis", Clock: clk.Now, Timeout: slow, Logger: slog.New(log), Observer: rec, CloseAfter: 1})
	s.br.jitter = nil
	lim := sluice.PerSecond(1000)
	b.mode.Store(1)
	for range 30 {
		s.Take(context.Background(), "k", lim, 1)
	}
	for range 600 { // ten minutes, a failed probe a second
		clk.Advance(time.Second)
		s.Take(context.Background(), "k", lim, 1)
	}
	b.mode.Store(0)
	clk.Advance(time.Second)
	s.Take(context.Background(), "k", lim, 1)
	got := log.all()
	if len(got) > 30 {
		t.Errorf("%d lines over a 10-minute outage, want about one a minute:\n%s", len(got), strings.Join(got, "\n"))
	}
	if last := got[len(got)-1]; !strings.Contains(last, "breaker closed") || !strings.Contains(last, "transitions_not_logged=") {
		t.Errorf("closing line %q: want the unlogged transitions counted", last)
	}
	rec.mu.Lock()
	n := len(rec.breakers)
	rec.mu.Unlock()
	if n < 1200 {
		t.Errorf("%d breaker events observed, want every transition (over 1,200)", n)
	}
}

// readOnly answers reads and refuses writes, as a Redis out of memory
// under noeviction, or a replica, does.
type readOnly struct{ sluice.Store }

func (readOnly) Take(context.Context, string, sluice.Limit, int64) (sluice.Decision, error) {
	return sluice.Decision{}, errors.New("OOM command not allowed when used memory > 'maxmemory'")
}

// An idle breaker's probe writes: a backend that answers reads but refuses
// writes keeps it open.
func TestProbeNeedsWrites(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	f := newFlaky(clock.Now)
	ro := &readOnly{f}
	s, err := New(ro, &Options{Policy: FailOpen, Clock: clock.Now, ProbeInterval: time.Second, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	takeUntilOpen(t, s, clock, "k", sluice.PerSecond(10))
	for i := range 3 {
		clock.Advance(2 * time.Second)
		if sent, err := s.Probe(context.Background()); !sent || err == nil {
			t.Fatalf("probe %d: Probe = %v, %v; want sent and failed", i, sent, err)
		}
	}
	if s.State() != sluice.BreakerOpen {
		t.Fatalf("a backend refusing writes: %v, want open", s.State())
	}
	// Requests' probes that only read (peeks) answered by it do not close
	// it either; takes that write do.
	for range 10 {
		clock.Advance(2 * time.Second)
		s.Peek(context.Background(), "k", sluice.PerSecond(10), 1)
	}
	if s.State() == sluice.BreakerClosed {
		t.Fatal("closed by peeks that a backend refusing writes answered")
	}
	s2, err := New(f, &Options{Policy: FailOpen, Clock: clock.Now, ProbeInterval: time.Second, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	f.mode.Store(1)
	takeUntilOpen(t, s2, clock, "k", sluice.PerSecond(10))
	f.mode.Store(0)
	for i := 0; s2.State() != sluice.BreakerClosed; i++ {
		if i > 20 {
			t.Fatalf("takes that write did not close it: %v", s2.State())
		}
		clock.Advance(2 * time.Second)
		s2.Take(context.Background(), fmt.Sprint("w", i), sluice.PerSecond(10), 1)
	}
}

// TestProbeNowWhileProbing: told that the backend is back while a probe
// is in flight (a Sentinel's switch while a probe is out to the dead
// master), a breaker whose probe then fails probes again at once, not a
// ProbeInterval later: sluice serve's breakers closed 1.3 s after a
// Sentinel failover where they closed in under 0.1 s otherwise.
func TestProbeNowWhileProbing(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	f := newFlaky(clock.Now)
	s, err := New(f, &Options{Policy: FailOpen, Clock: clock.Now, ProbeInterval: time.Hour, Timeout: 100 * time.Millisecond, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	lim := sluice.PerSecond(10)
	f.mode.Store(1)
	takeUntilOpen(t, s, clock, "k", lim)
	clock.Advance(2 * time.Hour) // a probe is due
	f.mode.Store(3)              // it hangs until its deadline
	calls := f.calls.Load()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Take(context.Background(), "k", lim, 1)
	}()
	for f.calls.Load() == calls {
		time.Sleep(time.Millisecond)
	}
	f.mode.Store(0) // the backend is back; the probe out is lost
	if err := s.ProbeNow(context.Background()); err != nil {
		t.Fatalf("ProbeNow with a probe in flight: %v", err)
	}
	<-done
	if st := s.State(); st != sluice.BreakerOpen {
		t.Fatalf("state %v after the probe in flight timed out, want open", st)
	}
	for i := 0; s.State() != sluice.BreakerClosed; i++ {
		if i > 10 {
			t.Fatalf("still %v after %d calls with the backend back; want the next probes due at once", s.State(), i)
		}
		s.Take(context.Background(), "k", lim, 1)
	}
}

// With Options.Cause, a transition's line names the error's cause beside
// it, as the metrics that take the same function do.
func TestBreakerLogsCause(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	b := newFlaky(clk.Now)
	log := &lines{}
	s := newStore(t, b, &Options{Name: "redis", Clock: clk.Now, Timeout: slow, Logger: slog.New(log),
		Cause: func(error) string { return "stalled" }})
	s.br.jitter = nil
	b.mode.Store(1)
	for range 30 {
		if _, err := s.Take(context.Background(), "k", sluice.PerSecond(1000), 1); err != nil {
			t.Fatal(err)
		}
	}
	want := "resilient: breaker open store=redis from=closed error=backend down cause=stalled policy=local answered_while_closed=19"
	if got := log.all(); !slices.Contains(got, want) {
		t.Errorf("log lines:\n%s\nwant among them: %s", strings.Join(got, "\n"), want)
	}
}
