package redisstore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// One dead master among live ones: calls fail and succeed in turn, and
// the episode is one line each way, not a pair per reload.
func TestReloaderEpisode(t *testing.T) {
	var logs bytes.Buffer
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer c.Close()
	r := &reloader{cluster: c, log: slog.New(slog.NewTextHandler(&logs, nil))}
	down := errors.New("dial tcp 127.0.0.1:7001: connect: connection refused")
	for range 20 {
		r.failed("", down)
		r.succeeded("")
	}
	if n := strings.Count(logs.String(), "cluster calls failing"); n != 1 {
		t.Errorf("%d failing lines, want 1:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "succeeding again") {
		t.Errorf("the episode ended while a node still failed:\n%s", logs.String())
	}
	r.lastBad.Store(time.Now().Add(-recoveredAfter).UnixNano())
	r.succeeded("")
	if n := strings.Count(logs.String(), "succeeding again"); n != 1 {
		t.Errorf("%d succeeding lines after %v without failure, want 1:\n%s", n, recoveredAfter, logs.String())
	}
}

// TestReloaderQuiet: an episode's reloads stop once no call has failed for
// quietAfter (a store nobody calls, its client perhaps closed), and the
// next failure starts them again.
func TestReloaderQuiet(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer c.Close()
	r := &reloader{cluster: c, every: 20 * time.Millisecond, quiet: 200 * time.Millisecond, log: slog.New(slog.DiscardHandler)}
	down := errors.New("dial tcp 127.0.0.1:7001: connect: connection refused")
	r.failed("", down)
	waitFor := func(polling bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); r.polling.Load() != polling; {
			if time.Now().After(deadline) {
				t.Fatalf("polling = %v after 5s, want %v", !polling, polling)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	waitFor(false)
	r.failed("", down)
	if !r.polling.Load() {
		t.Fatal("a failure after a quiet stop did not start the reloads again")
	}
	waitFor(false)
}

// TestLookOffCaller: the call that finds the slot map's masters to read
// (a moved key, or none read yet) does not wait for the read of 16,384
// slots (about 1 ms on a three-master Cluster: p50 838 µs for the call,
// 3.8 µs once off it); the read runs on, and its masters are kept.
func TestLookOffCaller(t *testing.T) {
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer c.Close()
	r := &reloader{cluster: c, log: slog.New(slog.DiscardHandler)}
	r.mapped.Store(true)
	reading, release := make(chan struct{}, 1), make(chan struct{})
	r.readSlots = func(context.Context, *redis.ClusterClient, string) ([]clusterMaster, error) {
		reading <- struct{}{}
		<-release
		return []clusterMaster{{addr: "127.0.0.1:7000", key: "k"}}, nil
	}
	done := make(chan struct{})
	go func() {
		r.succeeded("")
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("a call waited for the slot map's masters to be read")
	}
	select {
	case <-reading:
	case <-time.After(5 * time.Second):
		t.Fatal("the slot map's masters were not read")
	}
	close(release)
	r.lookMu.Lock()
	masters := r.masters
	r.lookMu.Unlock()
	if masters != "127.0.0.1:7000" {
		t.Errorf("masters %q after the read, want 127.0.0.1:7000", masters)
	}
}

// TestClientLoadsDropped: the package-level functions' note of a client's
// first slot map goes with the client, so that a process building many
// clients does not keep one per client.
func TestClientLoadsDropped(t *testing.T) {
	count := func() int {
		n := 0
		clientLoads.Range(func(any, any) bool { n++; return true })
		return n
	}
	before := count()
	for range 5 {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		_ = awaitClientMap(ctx, c)
		cancel()
		c.Close()
	}
	if n := count(); n < before+5 {
		t.Fatalf("%d clients noted, want at least %d", n, before+5)
	}
	for deadline := time.Now().Add(5 * time.Second); count() > before; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d clients still noted after 5s, want %d", count(), before)
		}
		runtime.GC()
	}
}

// TestWatchStops: a Store's watch of the slot map starts with its client's
// first map, and ends once the client is closed, or once the Store is
// garbage while its client lives on.
func TestWatchStops(t *testing.T) {
	ctx := context.Background()
	awaitWatching := func(r *reloader, want bool, gc bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); r.watching.Load() != want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("watching = %v after 5s, want %v", !want, want)
			}
			if gc {
				runtime.GC()
			}
		}
	}
	l := sluice.PerSecond(10)

	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t)})
	s := New(c, &Options{Prefix: redistest.Prefix(t)})
	if s.reload.watching.Load() {
		t.Fatal("a watch runs before the client has a slot map")
	}
	if _, err := s.Take(ctx, "k", l, 1); err != nil {
		t.Fatal(err)
	}
	awaitWatching(s.reload, true, false)
	c.Close()
	awaitWatching(s.reload, false, false)
	runtime.KeepAlive(s) // stopped by the Close, not by the cleanup

	c = redistest.ClusterClient(t)
	s = New(c, &Options{Prefix: redistest.Prefix(t)})
	if _, err := s.Take(ctx, "k", l, 1); err != nil {
		t.Fatal(err)
	}
	r := s.reload
	awaitWatching(r, true, false)
	s = nil
	awaitWatching(r, false, true)

	// A hook that refers to its Store (the reloader holds the hook) does
	// not keep the Store, nor the watch, alive.
	w := func() *atomic.Bool {
		hooked := New(c, &Options{Prefix: redistest.Prefix(t)})
		hooked.OnFailover(func() { _ = hooked.RoundTrip() })
		if _, err := hooked.Take(ctx, "k", l, 1); err != nil {
			t.Fatal(err)
		}
		return hooked.reload.watching
	}()
	for deadline := time.Now().Add(5 * time.Second); !w.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no watch")
		}
	}
	for deadline := time.Now().Add(5 * time.Second); w.Load(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the watch of a Store whose hook refers to it still runs 5s after it was dropped")
		}
		runtime.GC()
	}
}

// A slot map read mid-failover lists the old masters and the promoted
// replica: not told until the old master has no slots left.
func TestMidFailover(t *testing.T) {
	for _, tt := range []struct {
		last  string
		addrs []string
		want  bool
	}{
		{"a:1,b:1,c:1", []string{"a:1", "b:1", "c:1", "d:1"}, true},
		{"a:1,b:1,c:1", []string{"a:1", "b:1", "d:1"}, false},
		{"a:1,b:1,c:1", []string{"a:1", "b:1", "c:1"}, false},
		{"a:1,b:1", []string{"a:1", "c:1", "d:1"}, false},
	} {
		if got := midFailover(tt.last, tt.addrs); got != tt.want {
			t.Errorf("midFailover(%q, %q) = %v, want %v", tt.last, tt.addrs, got, tt.want)
		}
	}
}
