package resilient

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/openloop"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// pacedRun is what paced callers got: each decision's source and latency.
type pacedRun struct {
	sources map[sluice.Source]int
	errs    int
	lat     []time.Duration // sorted
}

// runPaced runs callers goroutines for d, each taking from a key of its
// own every period (from a random phase), the first at once and the others
// joining one by one over ramp, and waits for them.
func runPaced(s sluice.Store, callers int, period, ramp, d time.Duration) pacedRun {
	var mu sync.Mutex
	r := pacedRun{sources: map[sluice.Source]int{}}
	lim := sluice.PerSecond(1_000_000)
	r.lat = openloop.Paced(callers, period, ramp, d, func(c, i int) time.Duration {
		start := time.Now()
		dec, err := s.Take(context.Background(), fmt.Sprint("c", c, ":", i), lim, 1)
		took := time.Since(start)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			r.errs++
		} else {
			r.sources[dec.Source]++
		}
		return took
	})
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
	r := runPaced(s, callers, period, time.Second, 4*time.Second)
	fromRedis := r.sources[sluice.SourceBackend]
	t.Logf("round trip 20ms: %d decisions, %d from Redis, %v; p50 %v, p99 %v; %d connections",
		r.total(), fromRedis, r.sources, r.quantile(0.5), r.quantile(0.99), proxy.Accepted())
	if r.errs > 0 || fromRedis*100 < r.total()*99 {
		t.Errorf("round trip 20ms: %d of %d decisions from Redis (%d errors), want at least 99%%", fromRedis, r.total(), r.errs)
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
	r = runPaced(s, callers, period, 0, 3*time.Second)
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
