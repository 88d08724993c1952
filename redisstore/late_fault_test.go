package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// TestFaultLateReplyKeepsConnection: calls whose replies come after their
// callers' deadlines (Redis 30 ms away, callers waiting 20 ms) fail at
// their deadlines, but their commands run on and their connections go
// back to the pool: go-redis with ContextTimeoutEnabled would otherwise
// close each one, and every next call would pay a new connection's
// handshake. A reply that does not come within a few round trips (at
// most 10 times the caller's budget) still ends its connection.
func TestFaultLateReplyKeepsConnection(t *testing.T) {
	race.SkipTiming(t)
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	l := sluice.PerSecond(1_000_000)
	for _, tc := range []struct {
		name string
		opts redisstore.Options
	}{{"batched", redisstore.Options{}}, {"MaxBatch 1", redisstore.Options{MaxBatch: 1}}} {
		t.Run(tc.name, func(t *testing.T) {
			proxy.SetDelay(0)
			c := timedClient(t, redis.Options{Addr: proxy.Addr})
			opts := tc.opts
			opts.Prefix = redistest.Prefix(t)
			s := redisstore.New(c, &opts)
			take := func(wait time.Duration) error {
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				_, err := s.Take(ctx, "k", l, 1)
				return err
			}
			if err := take(5 * time.Second); err != nil { // the script loaded, a connection pooled
				t.Fatal(err)
			}

			proxy.SetDelay(15 * time.Millisecond)
			late := func() {
				t.Helper()
				for i := range 20 {
					st := time.Now()
					if err := take(20 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
						t.Fatalf("call %d waiting 20ms for a 30ms round trip: %v after %v, want context.DeadlineExceeded", i, err, time.Since(st))
					}
				}
			}
			// Serial calls overlap with the late replies before them (a new
			// connection's first, the handshake's, the longest), and the
			// store dials ahead of them: the pool grows to what that takes.
			late()
			before := proxy.Accepted()
			late()
			for range 5 {
				if err := take(500 * time.Millisecond); err != nil {
					t.Fatalf("a call waiting 500ms for a 30ms round trip: %v", err)
				}
			}
			if n := proxy.Accepted() - before; n > 1 {
				t.Errorf("%d new connections for 25 more serial calls, 20 of them answered late; want at most 1", n)
			}

			// Redis 2s away: a caller waiting 20ms ends its command's
			// connection within 10 times that, not at the reply.
			open := proxy.Open()
			proxy.SetDelay(time.Second)
			start := time.Now()
			if err := take(20 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a call waiting 20ms for a 2s round trip: %v, want context.DeadlineExceeded", err)
			}
			for proxy.Open() >= open {
				if time.Since(start) > time.Second {
					t.Fatalf("the connection of a call whose reply is 2s away is still open after %v", time.Since(start))
				}
				time.Sleep(5 * time.Millisecond)
			}
			t.Logf("connection closed %v after the call started", time.Since(start).Round(time.Millisecond))
		})
	}
}

// load runs n goroutines that take in a loop for d, each call waiting at
// most wait, and returns the latencies of the calls that succeeded and
// how many failed. sample, if set, runs every 5ms meanwhile.
func load(s *redisstore.Store, n int, d, wait time.Duration, sample func()) (lat []time.Duration, failed int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	l := sluice.PerSecond(1_000_000)
	for g := range n {
		wg.Go(func() {
			for i := 0; time.Now().Before(end); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				start := time.Now()
				_, err := s.Take(ctx, fmt.Sprint("k", g, ":", i%100), l, 1)
				took := time.Since(start)
				cancel()
				mu.Lock()
				if err != nil {
					failed++
				} else {
					lat = append(lat, took)
				}
				mu.Unlock()
			}
		})
	}
	for sample != nil && time.Now().Before(end) {
		sample()
		time.Sleep(5 * time.Millisecond)
	}
	wg.Wait()
	slices.Sort(lat)
	return lat, failed
}

// TestFaultSlowRedisCallsGoAtOnce: with Redis a third of the callers'
// deadline away, a call does not queue for a batch (sent when a slot
// frees, up to a round trip later, and answered a round trip after that):
// it goes at once, beyond MaxInFlight, so it takes one round trip, not up
// to two. Slots stay within the client's pool.
func TestFaultSlowRedisCallsGoAtOnce(t *testing.T) {
	race.SkipTiming(t)
	const (
		rtt  = 30 * time.Millisecond
		wait = 100 * time.Millisecond
		pool = 6
	)
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	proxy.SetDelay(rtt / 2)
	// Pipelines on the pool too, so that it bounds every connection.
	c := timedClient(t, redis.Options{Addr: proxy.Addr, PoolSize: pool, PipelinePoolSize: -1})
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), MaxInFlight: 1})

	load(s, 4, time.Second, wait, nil) // connections dialled, the round trip measured
	lat, failed := load(s, 4, 2*time.Second, wait, nil)
	if len(lat) == 0 {
		t.Fatalf("no call succeeded, %d failed", failed)
	}
	p50, p90 := lat[len(lat)/2], lat[len(lat)*9/10]
	t.Logf("4 goroutines, Redis %v away, MaxInFlight 1: %d calls, %d failed, p50 %v, p90 %v", rtt, len(lat)+failed, failed,
		p50.Round(time.Millisecond/10), p90.Round(time.Millisecond/10))
	if p50 > rtt*3/2 {
		t.Errorf("p50 %v: calls waited for batches; want about one round trip (%v), at most %v", p50, rtt, rtt*3/2)
	}
	if failed*100 > len(lat)+failed {
		t.Errorf("%d of %d calls failed, want at most 1%%", failed, len(lat)+failed)
	}

	// More callers than the pool holds: slots stop at its size.
	most := int64(0)
	load(s, 3*pool, time.Second, wait, func() { most = max(most, proxy.Open()) })
	if most > pool+1 {
		t.Errorf("%d connections open for %d goroutines, the pool holding %d", most, 3*pool, pool)
	}
}

// TestFaultGrowingLoadFindsConnectionsReady: with Redis 20ms away, a new
// connection's first command (the handshake and the command, about four
// round trips) takes longer than a 50ms deadline. As callers join one by
// one, each call that takes more slots than ever before dials one more
// connection ahead, outside its deadline, so the next caller to join finds
// it ready instead of timing out on a handshake of its own. What the test
// counts is that: the joining callers' first calls sent on a connection
// dialled for them (one whose first command, after the handshake, is
// theirs, not the PING that dials ahead). Whether a call makes its
// deadline is the machine's too, so the calls that failed are counted
// only over those during which a bare round trip on the same path was
// not slowed by a pause (see redistest.RoundTrips).
func TestFaultGrowingLoadFindsConnectionsReady(t *testing.T) {
	race.SkipTiming(t)
	const (
		rtt     = 20 * time.Millisecond
		wait    = 50 * time.Millisecond
		callers = 6
		every   = 400 * time.Millisecond // between callers joining
		// A call during which a bare round trip took longer is left out
		// of the failures counted: half the 30ms the round trip leaves of
		// the deadline gone to a pause of the machine.
		slowPath = 35 * time.Millisecond
	)
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	proxy.SetDelay(rtt / 2)
	firsts := &firstCommands{}
	c := timedClient(t, redis.Options{Addr: proxy.Addr, Dialer: firsts.dial})
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	l := sluice.PerSecond(1_000_000)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	_, err := s.Take(ctx, "warm", l, 1) // the script loaded, the round trip measured
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * rtt) // a connection dialled ahead of the next caller

	type call struct {
		start, end time.Time
		failed     string
	}
	var mu sync.Mutex
	var calls []call
	var wg sync.WaitGroup
	rt := redistest.WatchRoundTrips(t, proxy.Addr)
	end := time.Now().Add(callers * every)
	for g := range callers {
		wg.Go(func() {
			time.Sleep(time.Duration(g) * every)
			for i := 0; time.Now().Before(end); i++ {
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				start := time.Now()
				_, err := s.Take(ctx, fmt.Sprint("k", g, ":", i), l, 1)
				cancel()
				c := call{start: start, end: time.Now()}
				if err != nil {
					c.failed = fmt.Sprintf("caller %d call %d: %v", g, i, err)
				}
				mu.Lock()
				calls = append(calls, c)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	var failed, calmFailed []string
	calm := 0
	for _, c := range calls {
		quiet := rt.Slowest(c.start, c.end) <= slowPath
		if quiet {
			calm++
		}
		if c.failed != "" {
			failed = append(failed, c.failed)
			if quiet {
				calmFailed = append(calmFailed, c.failed)
			}
		}
	}
	// The joining callers' first 3 calls sent on a connection of their own.
	var joining []string
	for g := 1; g < callers; g++ {
		for i := range 3 {
			if firsts.sent(fmt.Sprint("{k", g, ":", i, "}")) {
				joining = append(joining, fmt.Sprintf("caller %d call %d", g, i))
			}
		}
	}
	t.Logf("%d calls from %d callers joining %v apart, %d failed, %d connections (%d dialled ahead, one the bare round trip's); "+
		"of %d calls with the bare round trip within %v, %d failed:\n%s",
		len(calls), callers, every, len(failed), proxy.Accepted(), firsts.pings(),
		calm, slowPath, len(calmFailed), strings.Join(failed, "\n"))
	// Joining, without a connection ready, sent the first call of every
	// other caller (5 of them here) on a new connection, past its deadline.
	// One: a reply cut off in a pause closes its connection, and whichever
	// call comes next dials again.
	if len(joining) > 1 {
		t.Errorf("%d of the joining callers' first 3 calls went on a connection dialled for them, want at most 1: %s",
			len(joining), strings.Join(joining, ", "))
	}
	if len(calmFailed)*20 > calm {
		t.Errorf("%d of %d calls with the bare round trip within %v failed, want at most 5%%:\n%s", len(calmFailed), calm, slowPath, strings.Join(calmFailed, "\n"))
	}
}

// firstCommands dials a client's connections and keeps, of each, the
// first command written after the handshake (HELLO, CLIENT SETINFO).
type firstCommands struct {
	mu    sync.Mutex
	cmds  []string
	ahead int // connections whose first command is a PING
}

func (f *firstCommands) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &firstConn{Conn: c, f: f}, nil
}

// sent reports whether a connection's first command holds word.
func (f *firstCommands) sent(word string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.ContainsFunc(f.cmds, func(cmd string) bool { return strings.Contains(cmd, word) })
}

// pings is how many connections a PING opened: dialled ahead.
func (f *firstCommands) pings() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ahead
}

type firstConn struct {
	net.Conn
	f    *firstCommands
	seen bool
}

func (c *firstConn) Write(b []byte) (int, error) {
	if !c.seen {
		cmd := strings.ToLower(string(b))
		ping := strings.Contains(cmd, "\r\nping\r\n")
		if ping || strings.Contains(cmd, "\r\nevalsha\r\n") || strings.Contains(cmd, "\r\neval\r\n") {
			c.seen = true
			c.f.mu.Lock()
			if ping {
				c.f.ahead++
			} else {
				c.f.cmds = append(c.f.cmds, string(b))
			}
			c.f.mu.Unlock()
		}
	}
	return c.Conn.Write(b)
}

// TestFaultSlowRedisWarns: RoundTrip reports Redis's round trip, and a
// Redis whose round trip is over a quarter of the calls' deadlines (20ms
// for 50ms) is one WARN line, after a second of such calls and once a
// minute at most, however many calls; a nearby one none.
func TestFaultSlowRedisWarns(t *testing.T) {
	race.SkipTiming(t)
	const (
		rtt  = 20 * time.Millisecond
		wait = 50 * time.Millisecond
	)
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	for _, tc := range []struct {
		name string
		opts redisstore.Options
	}{{"batched", redisstore.Options{}}, {"MaxBatch 1", redisstore.Options{MaxBatch: 1}}} {
		t.Run(tc.name, func(t *testing.T) {
			for _, delay := range []time.Duration{0, rtt / 2} {
				proxy.SetDelay(delay)
				c := timedClient(t, redis.Options{Addr: proxy.Addr})
				var logs logtest.Log
				opts := tc.opts
				opts.Prefix = redistest.Prefix(t)
				opts.Logger = logs.TextLogger()
				s := redisstore.New(c, &opts)
				if s.RoundTrip() != 0 {
					t.Errorf("RoundTrip %v before any call, want 0", s.RoundTrip())
				}
				lat, failed := load(s, 4, 1500*time.Millisecond, wait, nil) // the line is written after 1s
				got := s.RoundTrip()
				lines := strings.Count(logs.String(), "Redis round trip over a quarter")
				t.Logf("Redis %v away: RoundTrip %v, %d calls (%d failed), %d lines: %s", 2*delay, got, len(lat)+failed, failed, lines, logs.String())
				if delay == 0 {
					if got <= 0 || got > wait/4 {
						t.Errorf("RoundTrip %v on loopback, want above 0 and under %v", got, wait/4)
					}
					if lines != 0 {
						t.Errorf("%d lines for a Redis on loopback, want none", lines)
					}
					continue
				}
				if got < rtt*3/4 || got > 2*rtt {
					t.Errorf("RoundTrip %v, Redis %v away", got, rtt)
				}
				if lines != 1 {
					t.Errorf("%d lines for a Redis a round trip of %v away from calls waiting %v, want 1", lines, rtt, wait)
				}
				if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "deadline=50ms") {
					t.Errorf("the line: want level=WARN and deadline=50ms")
				}
			}
		})
	}
}

// TestBatchesStayInPool: batches of decisions, each one script run on one
// server, go on the client's pool, so that Redis sees at most PoolSize
// connections from it. go-redis takes a pipeline's connection from a pool
// of its own (PipelinePoolSize, 10 by default) on top of PoolSize: under
// load with Redis 10 ms away, a pool of 6 opened 12.
func TestBatchesStayInPool(t *testing.T) {
	const pool = 6
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	proxy.SetDelay(5 * time.Millisecond)
	c := timedClient(t, redis.Options{Addr: proxy.Addr, PoolSize: pool})
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	admin := srv.Client(t)
	most := 0
	lat, _ := load(s, 4*pool, 2*time.Second, 50*time.Millisecond, func() {
		info, err := admin.Info(context.Background(), "clients").Result()
		if err != nil {
			t.Error(err)
			return
		}
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
				n, _ := strconv.Atoi(v)
				most = max(most, n-1) // admin's own
			}
		}
	})
	if len(lat) == 0 {
		t.Fatal("no call succeeded")
	}
	t.Logf("%d calls, at most %d connections on Redis, PoolSize %d", len(lat), most, pool)
	if most > pool {
		t.Errorf("%d connections on Redis from a client whose PoolSize is %d", most, pool)
	}
}

// TestFaultRoundTripFollowsFailover: once a frozen master's replica is
// promoted, Store.RoundTrip (sluice serve's sluice_redis_round_trip_seconds,
// and the slow-Redis line's figure) is the live masters' again. It was the
// slowest lane's ever used, so it stayed at the dead master's last timed-out
// calls for good, and the slow-Redis WARN line named that figure after the
// cluster had recovered.
func TestFaultRoundTripFollowsFailover(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	l := failoverLimit
	s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	keys, masters := keyPerMaster(t, cl, s, l)
	defer takeEach(s, keys, l, 5*time.Millisecond)()
	time.Sleep(300 * time.Millisecond)
	before := s.RoundTrip()
	m := masters[0]
	replicas := cl.ReplicasOf(t, m)
	m.Pause(t)
	_, at := cl.AwaitMaster(t, 10*time.Second, replicas...)
	// Thawed, the old master (a replica now) answers the calls it held,
	// seconds late: that lane's figure climbs to hundreds of ms, and
	// without its node among the masters nothing is sent to bring it down.
	m.Resume(t)
	time.Sleep(1500 * time.Millisecond)
	var after time.Duration
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		after = max(after, s.RoundTrip())
	}
	t.Logf("RoundTrip %v before the freeze, at most %v from 1.5 s to 2.5 s after the promotion (%v after it)",
		before, after, time.Since(at).Round(time.Millisecond))
	if after >= 20*time.Millisecond {
		t.Errorf("RoundTrip up to %v from 1.5 s to 2.5 s after the promotion, want the live masters' (under 20ms; %v before the freeze)", after, before)
	}
}

// TestFaultRoundTripStoppedMaster: with a master stopped (SIGSTOP: its
// port accepts connections, nothing answers) and no failover, RoundTrip
// answers at once, from the slot map in memory, with the figure of calls
// that went before. It listed the masters with go-redis's ForEachMaster,
// which reloads the slot map first, asking nodes one at a time: one that
// asked the stopped master first waited out the 100 ms bound, or on a
// client with go-redis's defaults its 3 s read timeout.
func TestFaultRoundTripStoppedMaster(t *testing.T) {
	race.SkipTiming(t)
	const (
		calls = 20
		bound = 20 * time.Millisecond
	)
	cl := stoppableCluster(t)
	l := failoverLimit
	s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	keys, masters := keyPerMaster(t, cl, s, l)
	for range 20 {
		for _, key := range keys {
			if _, err := s.Take(context.Background(), key, l, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	before := s.RoundTrip()
	masters[0].Pause(t)
	defer masters[0].Resume(t)
	// Answered from memory, each call takes microseconds; a busy host
	// may still deschedule one: the 90th percentile is held to the bound,
	// the slowest to under the 100 ms a call asking the stopped master
	// waited.
	took := make([]time.Duration, calls)
	for i := range calls {
		start := time.Now()
		rtt := s.RoundTrip()
		took[i] = time.Since(start)
		if rtt <= 0 || rtt >= bound {
			t.Fatalf("RoundTrip %d of %d with a master stopped: %v, want the calls' figure (%v before the stop)", i+1, calls, rtt, before)
		}
	}
	slices.Sort(took)
	p90, slowest := took[calls*9/10-1], took[calls-1]
	if p90 > bound || slowest >= 90*time.Millisecond {
		t.Errorf("RoundTrip with a master stopped: p90 %v, slowest %v; want under %v and 90ms", p90, slowest, bound)
	}
	t.Logf("RoundTrip %v before the stop; with a master stopped, %d calls answered in p90 %v, at most %v", before, calls, p90, slowest)
}

// TestFaultColdStartWarm: resilient over a Store started cold (a new
// client, Redis's script cache empty) against a Redis 40 ms away, with
// resilient's 50 ms timeout. Warmed before it serves, no decision's first
// call pays a handshake or a NOSCRIPT, and the breaker never leaves
// closed. Without Warm the first calls time out and the breaker opened at
// start (measured: once in each of 5 runs).
func TestFaultColdStartWarm(t *testing.T) {
	race.SkipTiming(t)
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	proxy.SetDelay(20 * time.Millisecond)
	for _, warm := range []bool{true, false} {
		t.Run(fmt.Sprint("warm=", warm), func(t *testing.T) {
			if err := srv.Client(t).ScriptFlush(context.Background()).Err(); err != nil {
				t.Fatal(err)
			}
			c := timedClient(t, redis.Options{Addr: proxy.Addr})
			redisstore.DetectRefusals(c)
			store := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
			var logs logtest.Log
			rs, err := resilient.New(store, &resilient.Options{Logger: logs.TextLogger()})
			if err != nil {
				t.Fatal(err)
			}
			if warm {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				err := store.Warm(ctx)
				cancel()
				if err != nil {
					t.Fatal(err)
				}
			}
			var failed, calls atomic.Int64
			var wg sync.WaitGroup
			end := time.Now().Add(time.Second)
			l := sluice.PerSecond(1_000_000)
			for g := range 8 {
				wg.Go(func() {
					for i := 0; time.Now().Before(end); i++ {
						_, err := rs.Take(context.Background(), fmt.Sprint("k", g, ":", i%10), l, 1)
						calls.Add(1)
						if err != nil {
							failed.Add(1)
						}
					}
				})
			}
			wg.Wait()
			opened := strings.Count(logs.String(), "resilient: breaker open")
			t.Logf("warm %v: %d calls, %d failed, breaker opened %d times, %d stalls; state %v", warm, calls.Load(), failed.Load(), opened, store.Stalls(), rs.State())
			if warm && (opened > 0 || rs.State() != sluice.BreakerClosed) {
				t.Errorf("breaker opened %d times after Warm, state %v:\n%.2000s", opened, rs.State(), logs.String())
			}
		})
	}
}

// TestFaultWarmRoundTripFollows: Warm's round trip seeds the lane the
// calls use, and only it, so RoundTrip follows Redis once calls answer:
// warmed 40 ms away, then with Redis near, it falls to the calls' figure.
// Seeded into the unbatched lane too, which a batching Store never sends
// on, it stayed at the warm-up's 40 ms for good (and so did
// sluice_redis_round_trip_seconds).
func TestFaultWarmRoundTripFollows(t *testing.T) {
	race.SkipTiming(t)
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	proxy.SetDelay(20 * time.Millisecond)
	c := timedClient(t, redis.Options{Addr: proxy.Addr})
	store := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := store.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	if rtt := store.RoundTrip(); rtt < 30*time.Millisecond {
		t.Fatalf("RoundTrip after Warm 40ms away: %v", rtt)
	}
	proxy.SetDelay(0)
	l := sluice.PerSecond(1_000_000)
	for i := range 2000 {
		if _, err := store.Take(ctx, fmt.Sprint("k", i%10), l, 1); err != nil {
			t.Fatal(err)
		}
	}
	if rtt := store.RoundTrip(); rtt > 10*time.Millisecond {
		t.Errorf("RoundTrip %v after 2,000 calls with Redis near, warmed 40ms away: still the warm-up's", rtt)
	}
}
