package redistest

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// RoundTrips times bare PINGs to a server, one after another on a
// connection of their own: the round trip any call to it had at that
// moment. A timing test compares its calls with it, so that a pause of
// the machine (the test's process, the proxy, redis-server) that slowed
// the path itself is told from one the code under test added.
type RoundTrips struct {
	mu    sync.Mutex
	pings []pingSpan // in order: one at a time
	stop  chan struct{}
	done  chan struct{}
}

type pingSpan struct {
	start, end time.Time
	failed     bool
}

// WatchRoundTrips starts timing PINGs to addr (host:port) and stops at
// cleanup.
func WatchRoundTrips(t testing.TB, addr string) *RoundTrips {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, MaxRetries: -1})
	if err := c.Ping(context.Background()).Err(); err != nil { // the connection made
		c.Close()
		t.Fatalf("redistest: %s: %v", addr, err)
	}
	r := &RoundTrips{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(r.done)
		for {
			select {
			case <-r.stop:
				return
			default:
			}
			start := time.Now()
			err := c.Ping(context.Background()).Err()
			end := time.Now()
			r.mu.Lock()
			r.pings = append(r.pings, pingSpan{start, end, err != nil})
			r.mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		close(r.stop)
		<-r.done
		c.Close()
	})
	return r
}

// Slowest returns the longest round trip of the PINGs in flight at any
// time from from to to.
func (r *RoundTrips) Slowest(from, to time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	// The first PING that ended after from; later ones start later.
	i, _ := slices.BinarySearchFunc(r.pings, from, func(p pingSpan, t time.Time) int { return p.end.Compare(t) })
	var most time.Duration
	for _, p := range r.pings[i:] {
		if p.start.After(to) {
			break
		}
		switch {
		case p.failed: // no round trip: the path was down
			return time.Hour
		case p.end.After(from):
			most = max(most, p.end.Sub(p.start))
		}
	}
	return most
}
