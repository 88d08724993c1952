package redisstore_test

import (
	"context"
	"log/slog"
	"slices"
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
)

// TestFaultSentinelFollow: a Store on go-redis's failover client whose
// Sentinel leads a planned SENTINEL FAILOVER, under takes from a few
// goroutines. That Sentinel announces +switch-master only once the other
// replica has resynced from the new master (delayed here by
// repl-diskless-sync-delay), while the old master, a master until then,
// answers the client, and the takes it acknowledges meanwhile are lost.
// With FollowSentinels the client leaves it at the promotion: no take on
// it later than followBound after the replica first answers ROLE master.
// Without, it stays on it for a second or more (the scenario shown).
func TestFaultSentinelFollow(t *testing.T) {
	race.SkipTiming(t)
	const (
		followBound  = 150 * time.Millisecond
		aloneAtLeast = time.Second
	)
	t.Run("followed", func(t *testing.T) {
		var switches, closed atomic.Int32
		last, lost := plannedFailover(t, &redisstore.FollowOptions{
			OnSwitch: func(context.Context, string, string) { switches.Add(1) },
			OnReplaced: func(how string) {
				if how == "closed" {
					closed.Add(1)
				}
			},
		})
		t.Logf("FollowSentinels: last take on the old master %v after the promotion, %d takes on it since", last, lost)
		if last > followBound {
			t.Errorf("takes on the old master until %v after the promotion, want within %v", last, followBound)
		}
		if switches.Load() != 1 || closed.Load() != 1 {
			t.Errorf("OnSwitch called %d times, connections closed %d times; want once each", switches.Load(), closed.Load())
		}
	})
	t.Run("alone", func(t *testing.T) {
		last, lost := plannedFailover(t, nil)
		t.Logf("go-redis alone: last take on the old master %v after the promotion, %d takes on it since", last, lost)
		if last < aloneAtLeast {
			t.Errorf("go-redis alone left the old master %v after the promotion: want %v or more, else this test shows nothing", last, aloneAtLeast)
		}
	})
}

// plannedFailover runs a planned SENTINEL FAILOVER led by the Sentinel a
// Store's failover client asks, followed with follow unless nil, under
// takes from 4 goroutines. It returns when the last take on the old
// master was, from the promotion (a replica's first ROLE master), and how
// many it took since.
func plannedFailover(t *testing.T, follow *redisstore.FollowOptions) (last time.Duration, lost int64) {
	set := redistest.StartSentinel(t, &redistest.SentinelOptions{Replicas: 2, SyncDelay: 2 * time.Second})
	ctx := context.Background()
	leader := set.Sentinels[0].Addr
	o := &redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: []string{leader}}
	if follow != nil {
		f := redisstore.FollowSentinels(o, follow)
		t.Cleanup(f.Close)
	}
	s, limit := failoverStore(t, o)
	if follow != nil {
		awaitFollowing(t, set)
	}
	keepTaking(t, s, limit, 4)
	old := newClient(t, &redis.Options{Addr: set.Master.Addr})
	before := redistest.ScriptCalls(t, old)
	time.Sleep(300 * time.Millisecond)
	if redistest.ScriptCalls(t, old) == before {
		t.Fatal("the takes do not reach the master")
	}

	// When the leader announces the switch.
	sc, ps := switchesOf(t, leader)
	var announced atomic.Pointer[time.Time]
	go func() {
		for range ps.Channel() {
			at := time.Now()
			announced.CompareAndSwap(nil, &at)
		}
	}()
	watch := set.WatchPromotion(t)

	if err := sc.Failover(ctx, redistest.SentinelMaster).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if at := announced.Load(); at != nil && time.Since(*at) > 300*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the leader did not announce the switch within 10 s")
		}
	}
	roleAt, last, lost := watch.Stop()
	t.Logf("the leader's +switch-master %v after the promotion", announced.Load().Sub(roleAt))
	return last, lost
}

// TestFaultFollowSentinelsHungSentinel: a Sentinel that takes connections
// and never answers (a stopped process, a hung host) holds the follower's
// Close no longer than one question's timeout; it held it 4 s, go-redis's
// default read timeout and more, on the subscription's handshake and the
// question for the other Sentinels.
func TestFaultFollowSentinelsHungSentinel(t *testing.T) {
	race.SkipTiming(t)
	hung := redistest.Listen(t) // connections complete in the backlog, never answered
	f := redisstore.FollowSentinels(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{hung.Addr().String()}},
		&redisstore.FollowOptions{Logger: slog.New(slog.DiscardHandler)})
	time.Sleep(time.Second) // subscribing, and asking for the other Sentinels
	start := time.Now()
	f.Close()
	d := time.Since(start)
	t.Logf("Close took %v", d)
	if d > 600*time.Millisecond {
		t.Errorf("Close took %v with a Sentinel that never answers, want within 600ms", d)
	}
}

// awaitFollowing waits until every Sentinel of set has a subscriber: the
// follower's, once it has discovered them all.
func awaitFollowing(t *testing.T, set *redistest.SentinelSet) {
	t.Helper()
	for _, sn := range set.Sentinels {
		c := redis.NewClient(&redis.Options{Addr: sn.Addr, MaxRetries: -1})
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			list, err := c.ClientList(context.Background()).Result()
			if err == nil && strings.Contains(list, "cmd=subscribe") {
				break
			} else if time.Now().After(deadline) {
				c.Close()
				t.Fatalf("Sentinel %s: no subscription (%v)", sn.Addr, err)
			}
		}
		c.Close()
	}
}

// failoverStore returns a Store on a failover client with o, closed at
// cleanup, and a limit that never denies during a test, once a take of key
// "k" has reached the master.
func failoverStore(t *testing.T, o *redis.FailoverOptions) (*redisstore.Store, sluice.Limit) {
	t.Helper()
	c := redis.NewFailoverClient(o)
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	limit := sluice.PerHour(1_000_000_000)
	if _, err := s.Take(context.Background(), "k", limit, 1); err != nil {
		t.Fatal(err)
	}
	return s, limit
}

// keepTaking has goroutines take from key "k" of s back to back, each take
// bounded by 200 ms, until the test's cleanup.
func keepTaking(t *testing.T, s *redisstore.Store, l sluice.Limit, goroutines int) {
	done := make(chan struct{})
	var workers sync.WaitGroup
	for range goroutines {
		workers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
				s.Take(ctx, "k", l, 1)
				cancel()
			}
		})
	}
	t.Cleanup(func() { close(done); workers.Wait() })
}

// switchesOf returns a client of the Sentinel at addr and its subscription
// to +switch-master, confirmed, both closed at cleanup.
func switchesOf(t *testing.T, addr string) (*redis.SentinelClient, *redis.PubSub) {
	t.Helper()
	sc := redis.NewSentinelClient(&redis.Options{Addr: addr})
	ps := sc.Subscribe(context.Background(), "+switch-master")
	t.Cleanup(func() { ps.Close(); sc.Close() })
	if _, err := ps.Receive(context.Background()); err != nil {
		t.Fatal(err)
	}
	return sc, ps
}

// heard records what callbacks tell, in order, for a test to read as they
// run.
type heard struct {
	mu  sync.Mutex
	got []string
}

func (r *heard) add(e string) { r.mu.Lock(); r.got = append(r.got, e); r.mu.Unlock() }

func (r *heard) list() []string { r.mu.Lock(); defer r.mu.Unlock(); return slices.Clone(r.got) }

// TestFaultSentinelStaleSwitch: a Sentinel announcing a change older than
// the one the follower acted on (a failover's leader finishing late, after
// a newer failover was announced) is not followed. Sentinel A adopts
// replica R2 at config epoch 6, then Sentinel B, the client's own, R1 at
// epoch 5 and announces +switch-master to it. The follower stays on R2,
// and so do the takes, although go-redis follows B to R1 until B hears of
// epoch 6 (R1 and R2 are made masters of their own first, so that a take
// on either counts there). The ignored switch is told to OnStaleSwitch,
// once, as well as logged: it was a log line alone.
func TestFaultSentinelStaleSwitch(t *testing.T) {
	race.SkipTiming(t)
	set := redistest.StartSentinel(t, &redistest.SentinelOptions{Replicas: 2})
	ctx := context.Background()
	m, r1, r2 := set.Master.Addr, set.Replicas[0], set.Replicas[1]
	a, b := set.Sentinels[0], set.Sentinels[1]
	var switches, stale heard
	o := &redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: []string{b.Addr}}
	var logs logtest.Log
	f := redisstore.FollowSentinels(o, &redisstore.FollowOptions{
		Logger:        logs.TextLogger(),
		OnSwitch:      func(_ context.Context, from, to string) { switches.add(from + ">" + to) },
		OnStaleSwitch: func(named, master string) { stale.add(named + " for " + master) },
	})
	t.Cleanup(f.Close)
	s, limit := failoverStore(t, o)
	awaitFollowing(t, set)
	c1, c2 := newClient(t, &redis.Options{Addr: r1.Addr}), newClient(t, &redis.Options{Addr: r2.Addr})
	for _, c := range []*redis.Client{c1, c2} {
		if err := c.Do(ctx, "replicaof", "no", "one").Err(); err != nil {
			t.Fatal(err)
		}
	}

	keepTaking(t, s, limit, 2)
	_, ps := switchesOf(t, b.Addr)

	set.AnnounceConfig(t, a, r2, 6)
	newest := []string{m + ">" + r2.Addr}
	for deadline := time.Now().Add(2 * time.Second); !slices.Equal(switches.list(), newest); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("switches told %q, want %q", switches.list(), newest)
		}
	}
	time.Sleep(200 * time.Millisecond) // the client on R2
	before1, before2 := redistest.ScriptCalls(t, c1), redistest.ScriptCalls(t, c2)
	set.AnnounceConfig(t, b, r1, 5)
	select {
	case msg := <-ps.Channel():
		if !strings.HasSuffix(msg.Payload, strings.Replace(r1.Addr, ":", " ", 1)) {
			t.Fatalf("Sentinel B announced %q, want the switch to R1 (%s): it heard of epoch 6 first", msg.Payload, r1.Addr)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Sentinel B did not announce the switch to R1")
	}
	// B hears A's hello, epoch 6, within 2 s, and switches to R2 in turn.
	time.Sleep(2500 * time.Millisecond)
	after1, after2 := redistest.ScriptCalls(t, c1), redistest.ScriptCalls(t, c2)
	t.Logf("after the stale switch: %d takes on R1, %d on R2", after1-before1, after2-before2)
	if got := switches.list(); !slices.Equal(got, newest) {
		t.Errorf("switches told %q, want %q alone: the stale one followed", got, newest)
	}
	if after1 != before1 {
		t.Errorf("%d takes on R1 after the stale switch to it, want none; log:\n%s", after1-before1, logs.String())
	}
	if after2 == before2 {
		t.Error("no take on R2 after the stale switch")
	}
	if got, want := stale.list(), []string{r1.Addr + " for " + r2.Addr}; !slices.Equal(got, want) {
		t.Errorf("OnStaleSwitch told %q, want %q", got, want)
	}
}

// TestFaultFollowSentinelsUnplanned: in an unplanned failover (the master
// killed) the client has no connection left to the dead master when the
// switch comes, calls having failed on them; OnDegraded still tells the
// change, with a reason, until the client has dialled the new master,
// as it does when it closes connections: a status wired to it shows the
// switch, as OnSwitch does.
func TestFaultFollowSentinelsUnplanned(t *testing.T) {
	set := redistest.StartSentinel(t, nil)
	var events heard
	o := &redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: set.SentinelAddrs()}
	f := redisstore.FollowSentinels(o, &redisstore.FollowOptions{
		Logger:   slog.New(slog.DiscardHandler),
		OnSwitch: func(context.Context, string, string) { events.add("switch") },
		OnDegraded: func(reason string) {
			if reason == "" {
				events.add("agreed")
			} else {
				events.add("degraded")
			}
		},
	})
	t.Cleanup(f.Close)
	s, limit := failoverStore(t, o)
	t.Cleanup(takeEach(s, []string{"k"}, limit, 20*time.Millisecond))
	set.Master.Kill()
	want := []string{"degraded", "switch", "agreed"}
	for deadline := time.Now().Add(15 * time.Second); !slices.Equal(events.list(), want); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("told %q, want %q", events.list(), want)
		}
	}
}
