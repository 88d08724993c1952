package resilient

import (
	"context"
	"fmt"
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
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
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
	client := redis.NewClient(&redis.Options{Addr: srv.Addr})
	t.Cleanup(func() { client.Close() })
	rec := &recorder{}
	// A long timeout: this test is about NOSCRIPT, not a busy machine.
	s, err := NewMulti(redisstore.New(client, nil), &Options{Timeout: 5 * time.Second, Observer: rec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
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
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
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
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedAddr := refused.Addr().String()
	refused.Close()

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
