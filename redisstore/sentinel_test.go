package redisstore_test

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFollowSentinels: the follower dials through the Dialer the options
// had, and on a Sentinel's switch (a Redis stands in for the Sentinel)
// closes the connections to the old master and tells it, in order: the
// closing, the reason, then OnSwitch; a dial to the old master then
// reaches the new one, told once. Close waits for the OnSwitch under way,
// whose context it ends, and may be called again.
func TestFollowSentinels(t *testing.T) {
	fake := redistest.StartServer(t)
	old, next := redistest.StartServer(t).Addr, redistest.StartServer(t).Addr
	ctx := context.Background()
	var (
		mu      sync.Mutex
		events  []string
		dialled = map[string]bool{}
	)
	record := func(e string) { mu.Lock(); events = append(events, e); mu.Unlock() }
	told := func() []string { mu.Lock(); defer mu.Unlock(); return slices.Clone(events) }
	var d net.Dialer
	o := &redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{fake.Addr},
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			mu.Lock()
			dialled[addr] = true
			mu.Unlock()
			return d.DialContext(ctx, network, addr)
		}}
	var logs logtest.Log
	f := redisstore.FollowSentinels(o, &redisstore.FollowOptions{
		Logger: logs.TextLogger(),
		OnSwitch: func(ctx context.Context, from, to string) {
			record("switch " + from + ">" + to)
			<-ctx.Done()
			record("switch ended")
		},
		OnReplaced: record,
		OnDegraded: func(reason string) {
			if reason == "" {
				record("agreed")
			} else {
				record("degraded")
			}
		},
	})
	closed := false
	defer func() {
		if !closed {
			f.Close()
		}
	}()

	a, err := o.Dialer(ctx, "tcp", old)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	mu.Lock()
	through := dialled[old]
	mu.Unlock()
	if !through {
		t.Fatal("the dial did not go through the options' own Dialer")
	}
	admin := fake.Client(t)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err := admin.PubSubNumSub(ctx, "+switch-master").Result()
		if err == nil && n["+switch-master"] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no subscription to +switch-master (%v)", err)
		}
	}
	oh, op, _ := net.SplitHostPort(old)
	nh, np, _ := net.SplitHostPort(next)
	admin.Publish(ctx, "+switch-master", strings.Join([]string{"m", oh, op, nh, np}, " "))
	want := []string{"closed", "degraded", "switch " + old + ">" + next}
	for deadline := time.Now().Add(3 * time.Second); !slices.Equal(told(), want); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("told %q, want %q", told(), want)
		}
	}
	a.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("the old master's connection after the switch: read %v, want closed", err)
	}

	// The client's Sentinel still names the old master.
	for range 2 {
		c, err := o.Dialer(ctx, "tcp", old)
		if err != nil {
			t.Fatal(err)
		}
		if got := c.RemoteAddr().String(); got != next {
			t.Errorf("a dial to the replaced master reached %s, want the new one, %s", got, next)
		}
		c.Close()
	}
	want = append(want, "redirected", "agreed")
	if got := told(); !slices.Equal(got, want) {
		t.Errorf("told %q, want %q", got, want)
	}

	f.Close()
	closed = true
	if got := told(); got[len(got)-1] != "switch ended" {
		t.Errorf("Close returned before the OnSwitch under way: told %q", got)
	}
	f.Close() // again: nothing
	for _, line := range []string{"redis: sentinel switched master", "redis: on a master the Sentinels replaced", "redis: the Sentinel still names the master the Sentinels replaced"} {
		if n := strings.Count(logs.String(), line); n != 1 {
			t.Errorf("%d %q lines, want 1; log:\n%s", n, line, logs.String())
		}
	}
}

// Options that name no master are left alone, and the nil follower
// returned may be closed.
func TestFollowSentinelsNoMaster(t *testing.T) {
	o := &redis.FailoverOptions{SentinelAddrs: []string{"127.0.0.1:1"}}
	f := redisstore.FollowSentinels(o, nil)
	if f != nil || o.Dialer != nil {
		t.Errorf("follower %v, Dialer set %v; want neither", f, o.Dialer != nil)
	}
	f.Close()
	redisstore.FollowSentinels(nil, nil).Close()
}

// TestFollowSentinelsTwice: a second call on the same options, while the
// first follower runs, returns that follower and starts nothing: one
// subscription, the first's hooks alone called, with a WARN line. Once it
// is closed, a call starts a new follower, whose dials reach the server
// asked through the closed one's Dialer.
func TestFollowSentinelsTwice(t *testing.T) {
	fake := redistest.StartServer(t)
	old, next := redistest.StartServer(t).Addr, redistest.StartServer(t).Addr
	ctx := context.Background()
	admin := fake.Client(t)
	subscribers := func(want int64) {
		t.Helper()
		var n map[string]int64
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if n, _ = admin.PubSubNumSub(ctx, "+switch-master").Result(); n["+switch-master"] == want {
				time.Sleep(100 * time.Millisecond) // and no more
				if n, _ = admin.PubSubNumSub(ctx, "+switch-master").Result(); n["+switch-master"] == want {
					return
				}
			}
		}
		t.Fatalf("%d subscriptions to +switch-master, want %d", n["+switch-master"], want)
	}
	var first, second atomic.Int32
	var logs logtest.Log
	o := &redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{fake.Addr}}
	f1 := redisstore.FollowSentinels(o, &redisstore.FollowOptions{Logger: logs.TextLogger(),
		OnSwitch: func(context.Context, string, string) { first.Add(1) }})
	f2 := redisstore.FollowSentinels(o, &redisstore.FollowOptions{Logger: logs.TextLogger(),
		OnSwitch: func(context.Context, string, string) { second.Add(1) }})
	if f1 != f2 {
		t.Error("a second call on the same options started another follower")
	}
	if n := strings.Count(logs.String(), "FollowSentinels called again"); n != 1 {
		t.Errorf("%d WARN lines for the second call, want 1; log:\n%s", n, logs.String())
	}
	subscribers(1)
	oh, op, _ := net.SplitHostPort(old)
	nh, np, _ := net.SplitHostPort(next)
	admin.Publish(ctx, "+switch-master", strings.Join([]string{"m", oh, op, nh, np}, " "))
	for deadline := time.Now().Add(3 * time.Second); first.Load() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the switch was not told")
		}
	}
	time.Sleep(100 * time.Millisecond)
	if a, b := first.Load(), second.Load(); a != 1 || b != 0 {
		t.Errorf("OnSwitch: the first call's %d times, the second's %d; want once, never", a, b)
	}

	f1.Close()
	subscribers(0)
	f3 := redisstore.FollowSentinels(o, nil)
	defer f3.Close()
	if f3 == f1 {
		t.Fatal("a call after Close returned the closed follower")
	}
	subscribers(1)
	c, err := o.Dialer(ctx, "tcp", old) // the closed follower would have sent it to next
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.RemoteAddr().String(); got != old {
		t.Errorf("a dial through the closed follower's Dialer reached %s, want %s", got, old)
	}
}
