package resilient

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/openloop"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/tick"
	"github.com/sluicehq/sluice/redisstore"
)

// margin is added to every latency bound: these tests bound stalls, they
// do not measure speed, and the machine may be busy.
const margin = time.Second

// load runs Take on a few keys from several goroutines until stop is
// closed, recording the slowest call and any error.
type load struct {
	slowest atomic.Int64 // ns
	errs    atomic.Int64
	calls   atomic.Int64
	firstMu sync.Mutex
	first   error
	wg      sync.WaitGroup
	stop    chan struct{}
	once    sync.Once
}

func startLoad(s sluice.Store, workers int) *load { return startPacedLoad(s, workers, 0) }

// startPacedLoad is startLoad with each worker sending a call every pace
// at most: a steady load that leaves the machine's cores to Redis too.
func startPacedLoad(s sluice.Store, workers int, pace time.Duration) *load {
	l := &load{stop: make(chan struct{})}
	lim := sluice.PerSecond(100_000)
	for w := range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			key := fmt.Sprintf("k%d", w)
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				start := time.Now()
				_, err := s.Take(context.Background(), key, lim, 1)
				el := time.Since(start)
				if el < pace {
					time.Sleep(pace - el)
				}
				for {
					cur := l.slowest.Load()
					if int64(el) <= cur || l.slowest.CompareAndSwap(cur, int64(el)) {
						break
					}
				}
				l.calls.Add(1)
				if err != nil {
					l.errs.Add(1)
					l.firstMu.Lock()
					if l.first == nil {
						l.first = err
					}
					l.firstMu.Unlock()
				}
			}
		}()
	}
	return l
}

func (l *load) end() {
	l.once.Do(func() { close(l.stop) })
	l.wg.Wait()
}

// waitFor polls cond until it holds or a generous deadline passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Redis killed mid-load: the local fallback answers within the timeout and
// nothing fails; Redis restarted: decisions return to it on their own.
func TestFaultKillAndRestart(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	rec := &recorder{}
	const timeout = 100 * time.Millisecond
	s, err := NewMulti(redisstore.New(client, nil), &Options{
		Timeout: timeout, ProbeInterval: 50 * time.Millisecond, Observer: rec,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	l := startLoad(s, 4)
	defer l.end()

	waitFor(t, "decisions from Redis", func() bool { return rec.count(sluice.SourceBackend) >= 100 })
	srv.Stop()
	fallback := rec.count(sluice.SourceFallback)
	waitFor(t, "the fallback to answer", func() bool { return rec.count(sluice.SourceFallback) >= fallback+200 })
	waitFor(t, "the breaker to open", func() bool { return s.State() != sluice.BreakerClosed })

	srv.Start(t)
	waitFor(t, "the breaker to close", func() bool { return s.State() == sluice.BreakerClosed })
	backend := rec.count(sluice.SourceBackend)
	waitFor(t, "decisions from Redis again", func() bool { return rec.count(sluice.SourceBackend) >= backend+100 })
	l.end()

	if n := l.errs.Load(); n > 0 {
		t.Errorf("%d of %d calls failed; first: %v", n, l.calls.Load(), l.first)
	}
	if slowest := time.Duration(l.slowest.Load()); slowest > timeout+margin {
		t.Errorf("slowest decision took %v with a %v timeout", slowest, timeout)
	}
}

// SCRIPT FLUSH in the middle of the load: the store reloads its scripts and
// no call fails or falls back.
func TestFaultScriptFlush(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	rec := &recorder{}
	// A long timeout: this test is about NOSCRIPT, not a busy machine.
	s := newMultiStore(t, redisstore.New(client, nil), &Options{Timeout: 5 * time.Second, Observer: rec})
	l := startLoad(s, 4)
	for range 20 {
		before := rec.count(sluice.SourceBackend)
		if err := client.ScriptFlush(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "calls after the flush", func() bool { return rec.count(sluice.SourceBackend) >= before+20 })
	}
	l.end()
	if n := l.errs.Load(); n > 0 {
		t.Errorf("%d calls failed; first: %v", n, l.first)
	}
	if n := rec.errs; n > 0 {
		t.Errorf("%d backend errors observed", n)
	}
	if n := rec.count(sluice.SourceFallback); n > 0 {
		t.Errorf("%d calls fell back", n)
	}
}

// An unreachable Redis costs each decision at most the timeout, whether
// connections are refused or accepted and never answered.
func TestFaultUnreachable(t *testing.T) {
	t.Parallel()
	silent := redistest.Listen(t)
	go func() { // accept, read everything, answer nothing
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 1024)
				for {
					if _, err := c.Read(buf); err != nil {
						return
					}
				}
			}()
		}
	}()
	refusedAddr := redistest.DeadAddr(t)

	for _, tt := range []struct {
		name  string
		addr  string
		trust bool // a client honouring contexts, called inline
	}{
		{"silent", silent.Addr().String(), false},
		{"refused", refusedAddr, false},
		{"silent, inline", silent.Addr().String(), true},
		{"refused, inline", refusedAddr, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Otherwise default client options: a 3s read timeout
			// that the Store's own timeout must cut short.
			client := redis.NewClient(&redis.Options{Addr: tt.addr, ContextTimeoutEnabled: tt.trust})
			t.Cleanup(func() { client.Close() })
			const timeout = 50 * time.Millisecond
			rec := &recorder{}
			s, err := New(redisstore.New(client, nil), &Options{Policy: FailClosed, Timeout: timeout, Observer: rec, TrustContext: tt.trust})
			if err != nil {
				t.Fatal(err)
			}
			for i := range 20 { // 20 failures reach MinCalls at a 100% failure rate
				start := time.Now()
				d, err := s.Take(context.Background(), "k", sluice.PerSecond(10), 1)
				if el := time.Since(start); el > timeout+margin {
					t.Errorf("call %d took %v with a %v timeout", i, el, timeout)
				}
				if err != nil || d.Allowed {
					t.Errorf("call %d: %+v, %v; want a FailClosed denial", i, d, err)
				}
			}
			if got := s.State(); got != sluice.BreakerOpen {
				t.Errorf("breaker %v, want open", got)
			}
			if rec.errs == 0 {
				t.Error("no backend error observed")
			}
		})
	}
}

// opened records when the breaker opened, on top of what recorder counts.
type opened struct {
	recorder
	mu    sync.Mutex
	opens []time.Time
}

func (o *opened) ObserveBreaker(e sluice.BreakerEvent) {
	o.recorder.ObserveBreaker(e)
	if e.To == sluice.BreakerOpen {
		o.mu.Lock()
		o.opens = append(o.opens, time.Now())
		o.mu.Unlock()
	}
}

func (o *opened) firstOpenAfter(t time.Time) (time.Time, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, at := range o.opens {
		if !at.Before(t) {
			return at, true
		}
	}
	return time.Time{}, false
}

// pauses runs CLIENT PAUSE for pause every period until the test ends.
func pauses(t *testing.T, addr string, pause, period time.Duration) {
	c := redis.NewClient(&redis.Options{Addr: addr})
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick.Every(stop, period, func() { c.Do(context.Background(), "CLIENT", "PAUSE", pause.Milliseconds()) })
	}()
	t.Cleanup(func() { close(stop); <-done; c.Close() })
}

// slowRedis runs the load for d against a Redis paused for pause every
// period, with the default breaker and timeout, and returns what the
// recorder saw.
func slowRedis(t *testing.T, pause, period, d time.Duration) (*opened, *load) {
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	// A paused server notices that the pause is over on its next wake-up:
	// at 10 per second (the default hz) a 30ms pause can last 100ms; at 500,
	// 32ms, which leaves the 50ms timeout 18ms of headroom.
	if err := client.ConfigSet(context.Background(), "hz", "500").Err(); err != nil {
		t.Fatal(err)
	}
	rec := &opened{}
	s := newMultiStore(t, redisstore.New(client, nil), &Options{Observer: rec, Logger: discard})
	l := startPacedLoad(s, 8, time.Millisecond)
	waitFor(t, "decisions from Redis", func() bool { return rec.count(sluice.SourceBackend) >= 100 })
	pauses(t, srv.Addr, pause, period)
	time.Sleep(d)
	l.end()
	return rec, l
}

// Slow is not down: Redis paused 30ms every 500ms, below the 50ms timeout,
// never opens the breaker, and no decision falls back at the 99.9th
// percentile. Not every one: that a call sent in a 30ms pause is answered
// within 50ms is a time bound, and a busy machine alone delays a call past
// 50ms now and then, pause or not. Not parallel: the 20ms between pause and
// timeout are all the headroom there is.
func TestFaultSlowRedisShortPauses(t *testing.T) {
	race.SkipTiming(t)
	rec, l := slowRedis(t, 30*time.Millisecond, 500*time.Millisecond, 6*time.Second)
	if got := rec.breakers; len(got) != 0 {
		t.Errorf("breaker changes %v, want none", got)
	}
	calls, fallback := l.calls.Load(), int64(rec.count(sluice.SourceFallback))
	if fallback*1000 > calls {
		t.Errorf("%d of %d decisions fell back, over 0.1%%", fallback, calls)
	}
	t.Logf("%d calls, %d fell back, slowest %v", calls, fallback, time.Duration(l.slowest.Load()))
}

// Redis paused 80ms every second: the calls caught by a pause time out and
// fall back one by one, but the breaker never opens, so the share of
// fallback decisions is the share of calls that timed out (plus at most
// one percentage point).
func TestFaultSlowRedisLongPauses(t *testing.T) {
	race.SkipTiming(t)
	rec, l := slowRedis(t, 80*time.Millisecond, time.Second, 6*time.Second)
	if got := rec.breakers; len(got) != 0 {
		t.Errorf("breaker changes %v, want none", got)
	}
	calls := float64(l.calls.Load())
	fallback := float64(rec.count(sluice.SourceFallback)) / calls
	rec.mu.Lock()
	timedOut := float64(rec.errs) / calls
	rec.mu.Unlock()
	if fallback > timedOut+0.01 {
		t.Errorf("%.2f%% of decisions fell back, %.2f%% timed out: over 1 point apart", 100*fallback, 100*timedOut)
	}
	t.Logf("%d calls: %.2f%% timed out, %.2f%% fell back", l.calls.Load(), 100*timedOut, 100*fallback)
}

// A dead Redis opens the breaker within a second, whether it refuses
// connections (the process stopped) or holds them silent (SIGSTOP): the
// 90th percentile of many outages within 1s, and none over 2s.
func TestFaultDeadRedisOpensWithinASecond(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	for _, mode := range []string{"refused", "silent"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			srv := redistest.StartServer(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
			t.Cleanup(func() { client.Close() })
			rec := &opened{}
			s := newMultiStore(t, redisstore.New(client, nil), &Options{Observer: rec, Logger: discard, ProbeInterval: 100 * time.Millisecond})
			pid := redisPID(t, client)
			l := startLoad(s, 4)
			defer l.end()
			var took []time.Duration
			for range 10 {
				backend := rec.count(sluice.SourceBackend)
				waitFor(t, "decisions from Redis", func() bool {
					return s.State() == sluice.BreakerClosed && rec.count(sluice.SourceBackend) >= backend+50
				})
				start := time.Now()
				if mode == "refused" {
					srv.Stop()
				} else if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
					t.Fatal(err)
				}
				waitFor(t, "the breaker to open", func() bool { _, ok := rec.firstOpenAfter(start); return ok })
				at, _ := rec.firstOpenAfter(start)
				took = append(took, at.Sub(start))
				if mode == "refused" {
					srv.Start(t)
				} else if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
					t.Fatal(err)
				}
			}
			slices.Sort(took)
			p90, worst := took[len(took)*9/10-1], took[len(took)-1]
			t.Logf("breaker opened after %v (p90 %v)", took, p90)
			if p90 > time.Second || worst > 2*time.Second {
				t.Errorf("breaker opened after p90 %v, max %v; want within 1s and 2s", p90, worst)
			}
		})
	}
}

// redisPID asks the server for its process id.
func redisPID(t *testing.T, c *redis.Client) int {
	t.Helper()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, err := strconv.Atoi(v)
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatal("no process_id in INFO server")
	return 0
}

// pacedRun is what paced callers got: each decision's source and latency.
type pacedRun struct {
	sources map[sluice.Source]int
	errs    int
	lat     []time.Duration // sorted
	// calm counts the sources of the decisions during which no bare
	// round trip on the same path took over slowPath (see
	// redistest.RoundTrips).
	calm map[sluice.Source]int
}

// slowPath: a decision during which a bare round trip to Redis on the
// same path took longer is left out of pacedRun.calm. Half the 30 ms a
// 20 ms round trip leaves of a 50 ms timeout gone: the machine (this
// process, the proxy, redis-server) paused, and whether the decision made
// it was the pause's doing.
const slowPath = 35 * time.Millisecond

// runPaced runs callers goroutines for d, each taking from a key of its
// own every period (from a random phase), the first at once and the others
// joining one by one over ramp, and waits for them. rt times the bare
// round trip meanwhile.
func runPaced(s sluice.Store, callers int, period, ramp, d time.Duration, rt *redistest.RoundTrips) pacedRun {
	type took struct {
		start time.Time
		d     time.Duration
		src   sluice.Source
	}
	var mu sync.Mutex
	var all []took
	r := pacedRun{sources: map[sluice.Source]int{}, calm: map[sluice.Source]int{}}
	lim := sluice.PerSecond(1_000_000)
	r.lat = openloop.Paced(callers, period, ramp, d, func(c, i int) time.Duration {
		start := time.Now()
		dec, err := s.Take(context.Background(), fmt.Sprint("c", c, ":", i), lim, 1)
		d := time.Since(start)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			r.errs++
		} else {
			r.sources[dec.Source]++
			all = append(all, took{start, d, dec.Source})
		}
		return d
	})
	for _, c := range all {
		if rt.Slowest(c.start, c.start.Add(c.d)) <= slowPath {
			r.calm[c.src]++
		}
	}
	return r
}

func (r pacedRun) total() int { return len(r.lat) }

func (r pacedRun) quantile(q float64) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	return r.lat[int(float64(len(r.lat)-1)*q)]
}

// TestFaultSlowRedisStaysInUse: a Redis that answers slowly but well
// within the decision timeout keeps deciding; one that answers only after
// it is left. Redis behind a delaying proxy, 8 callers each taking every
// 20ms, Timeout 50ms, the client as sluice serve builds it
// (ContextTimeoutEnabled):
//
//   - round trip 20ms (40% of the timeout), the store used once (as sluice
//     serve's start checks do) and the callers joining over a second: at
//     least 99% of decisions come from Redis and the breaker never opens,
//     on a bounded number of connections (late replies no longer close
//     theirs, calls no longer queue for two round trips, new connections
//     are dialled ahead). (All at once on a store never used, the first
//     calls would all wait for new connections' handshakes, about four
//     round trips, past the timeout: the breaker would open once.)
//   - round trip 60ms (above the timeout): decisions fall back at the
//     timeout, the breaker opens, and the connections stay bounded.
//
// A pause of the machine (this process, the proxy, redis-server) past the
// 30ms a 20ms round trip leaves fails every decision in flight, whatever
// the store does: the 99% are of the decisions during which a bare round
// trip on the same path was not slowed (see slowPath).
func TestFaultSlowRedisStaysInUse(t *testing.T) {
	race.SkipTiming(t)
	const (
		timeout = 50 * time.Millisecond
		callers = 8
		period  = 20 * time.Millisecond
	)
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	client := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { client.Close() })
	// Every connection the client may open: its pool and its pipelines'.
	most := int64(client.Options().PoolSize + redis.DefaultPipelinePoolSize)
	rec := &recorder{}
	s, err := New(redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}), &Options{
		Timeout: timeout, Observer: rec, Nodes: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	proxy.SetDelay(10 * time.Millisecond)
	if _, err := s.Take(context.Background(), "first", sluice.PerSecond(1), 1); err != nil {
		t.Fatal(err)
	}
	rt := redistest.WatchRoundTrips(t, proxy.Addr)
	r := runPaced(s, callers, period, time.Second, 4*time.Second, rt)
	fromRedis := r.sources[sluice.SourceBackend]
	calm, calmFromRedis := 0, r.calm[sluice.SourceBackend]
	for _, n := range r.calm {
		calm += n
	}
	t.Logf("round trip 20ms: %d decisions, %d from Redis, %v; p50 %v, p99 %v; %d connections; "+
		"%d decisions with the bare round trip within %v: %v",
		r.total(), fromRedis, r.sources, r.quantile(0.5), r.quantile(0.99), proxy.Accepted(), calm, slowPath, r.calm)
	// Of the decisions the machine left alone: a pause of the path past
	// the 30 ms a round trip leaves fails any decision in flight.
	if r.errs > 0 || calmFromRedis*100 < calm*99 {
		t.Errorf("round trip 20ms: %d of %d decisions from Redis (%d errors), want at least 99%%", calmFromRedis, calm, r.errs)
	}
	rec.mu.Lock()
	opened := slices.Contains(rec.breakers, sluice.BreakerOpen)
	rec.mu.Unlock()
	if opened || s.State() != sluice.BreakerClosed {
		t.Errorf("round trip 20ms: the breaker opened (transitions %v)", rec.breakers)
	}
	if n := proxy.Accepted(); n > most {
		t.Errorf("round trip 20ms: %d connections, the client holding at most %d", n, most)
	}

	proxy.SetDelay(30 * time.Millisecond)
	before := proxy.Accepted()
	r = runPaced(s, callers, period, 0, 3*time.Second, rt)
	t.Logf("round trip 60ms: %d decisions, %v; p50 %v, p99 %v, slowest %v; %d new connections, %d open",
		r.total(), r.sources, r.quantile(0.5), r.quantile(0.99), r.quantile(1), proxy.Accepted()-before, proxy.Open())
	if s.State() == sluice.BreakerClosed {
		t.Errorf("round trip 60ms: the breaker is closed, want open (transitions %v)", rec.breakers)
	}
	if fb := r.sources[sluice.SourceFallback]; r.errs > 0 || fb*10 < r.total()*9 {
		t.Errorf("round trip 60ms: %d of %d decisions from the fallback (%d errors), want at least 90%%", fb, r.total(), r.errs)
	}
	// Calls fall back at the timeout, or at once once the breaker is open.
	if p99 := r.quantile(0.99); p99 > timeout+25*time.Millisecond {
		t.Errorf("round trip 60ms: p99 %v, want the timeout (%v) or less", p99, timeout)
	}
	if n := proxy.Open(); n > most {
		t.Errorf("round trip 60ms: %d connections open, the client holding at most %d", n, most)
	}
}
