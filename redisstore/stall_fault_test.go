package redisstore_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// wireMeter counts a client's connections (dialled, and closed) and times
// each command and pipeline it sends, from the pool's turn to its end.
type wireMeter struct {
	dials, closes atomic.Int64
	mu            sync.Mutex
	sends         []time.Duration
}

type meteredConn struct {
	net.Conn
	closed func()
	once   sync.Once
}

func (c *meteredConn) Close() error {
	c.once.Do(c.closed)
	return c.Conn.Close()
}

func (m *wireMeter) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	m.dials.Add(1)
	var d net.Dialer
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		m.closes.Add(1)
		return nil, err
	}
	return &meteredConn{Conn: c, closed: func() { m.closes.Add(1) }}, nil
}

// open is how many of the client's connections are open.
func (m *wireMeter) open() int64 { return m.dials.Load() - m.closes.Load() }

func (m *wireMeter) sent(start time.Time) {
	m.mu.Lock()
	m.sends = append(m.sends, time.Since(start))
	m.mu.Unlock()
}

// took returns the sends' times since the last call, sorted.
func (m *wireMeter) took() []time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := m.sends
	m.sends = nil
	slices.Sort(s)
	return s
}

func (m *wireMeter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (m *wireMeter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		defer m.sent(time.Now())
		return next(ctx, cmd)
	}
}

func (m *wireMeter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		defer m.sent(time.Now())
		return next(ctx, cmds)
	}
}

// TestFaultStalledRedisBoundsConnections: Redis stopped (SIGSTOP: its port
// accepts connections, nothing answers) under 1,000 calls a second, each
// caller waiting 50 ms, on a client as New's doc and sluice serve build it
// (ContextTimeoutEnabled, refusals detected). A command given up holds its
// connection three times its caller's time (Redis nearby, so its measured
// round trip adds nothing), and once the
// first is cut off the Store sends one batch (or unbatched call) at a time:
// connections stay within the pool, and goroutines come back once the
// calls end. Before, each command held its connection 500 ms, the client
// had 30 connections open (the pool's 20 and the pipeline pool's 10) and
// dialled 250 in 5 s; unbatched, 500 commands at once and 440 goroutines
// waiting on the pool at the end.
func TestFaultStalledRedisBoundsConnections(t *testing.T) {
	race.SkipTiming(t)
	const (
		wait  = 50 * time.Millisecond
		stall = 3 * time.Second
		pool  = 20
	)
	for _, tc := range []struct {
		name     string
		maxBatch int
	}{{"batched", 0}, {"MaxBatch 1", 1}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			m := &wireMeter{}
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true, PoolSize: pool, Dialer: m.dial})
			redisstore.DetectRefusals(c)
			c.AddHook(m)
			t.Cleanup(func() { c.Close() })
			var logs syncBuffer
			s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), MaxBatch: tc.maxBatch,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			l := sluice.PerSecond(1_000_000)
			take := func(key string, wait time.Duration) error {
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				_, err := s.Take(ctx, key, l, 1)
				return err
			}
			if err := take("warm", 5*time.Second); err != nil {
				t.Fatal(err)
			}
			m.took()
			goroutines := runtime.NumGoroutine()

			srv.Pause(t)
			stopped := time.Now()
			var mostOpen, mostConns int64
			var wg sync.WaitGroup
			var ok atomic.Int64
			tick := time.NewTicker(time.Millisecond)
			for i := 0; time.Since(stopped) < stall; i++ {
				<-tick.C
				wg.Go(func() {
					if take(fmt.Sprint("k", i%100), wait) == nil {
						ok.Add(1)
					}
				})
				if i%10 == 0 {
					st := c.PoolStats()
					conns := int64(st.TotalConns)
					if st.PipelineStats != nil {
						conns += int64(st.PipelineStats.TotalConns)
					}
					mostConns = max(mostConns, conns)
					if time.Since(stopped) > 10*wait { // once the first sends were cut off
						mostOpen = max(mostOpen, m.open())
					}
				}
			}
			tick.Stop()
			wg.Wait()
			if n := ok.Load(); n > 0 {
				t.Fatalf("%d calls succeeded with Redis stopped", n)
			}
			sends := m.took()
			p99, most := sends[len(sends)*99/100], sends[len(sends)-1]
			t.Logf("Redis stopped %v: %d sends, p50 %v, p99 %v, max %v; %d dials, at most %d open (%d pooled); %d stalls",
				stall, len(sends), sends[len(sends)/2].Round(time.Millisecond), p99.Round(time.Millisecond),
				most.Round(time.Millisecond), m.dials.Load(), mostOpen, mostConns, s.Stalls())
			if p99 > 4*wait || most > 8*wait {
				t.Errorf("sends held their connections p99 %v, max %v for callers waiting %v; want at most %v and %v", p99, most, wait, 4*wait, 8*wait)
			}
			if mostConns > pool {
				t.Errorf("%d connections pooled at once, the pool holding %d", mostConns, pool)
			}
			if mostOpen > 3 {
				t.Errorf("%d connections open at once once Redis stalled, want at most 3 (one send at a time)", mostOpen)
			}
			if s.Stalls() != 1 || !strings.Contains(logs.String(), "Redis stopped answering") {
				t.Errorf("Stalls() = %d, log %q; want 1 and one line", s.Stalls(), logs.String())
			}
			deadline := time.Now().Add(time.Second)
			for runtime.NumGoroutine() > goroutines+5 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if n := runtime.NumGoroutine(); n > goroutines+5 {
				t.Errorf("%d goroutines 1s after the calls ended, %d before Redis stopped", n, goroutines)
			}

			srv.Resume(t)
			deadline = time.Now().Add(2 * time.Second)
			for take("k0", wait) != nil {
				if time.Now().After(deadline) {
					t.Fatal("no call succeeded within 2s of Redis resuming")
				}
				time.Sleep(5 * time.Millisecond)
			}
			if !strings.Contains(logs.String(), "Redis answering again") {
				t.Errorf("no line once Redis answered again: %q", logs.String())
			}
		})
	}
}
