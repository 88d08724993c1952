package redisstore

import (
	"bytes"
	"context"
	"log/slog"
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
)

// TestWatchSwitchMaster: a Redis stands in for a Sentinel (PUBLISH on
// +promoted-slave and +switch-master), next to an address nothing listens
// on. A promotion or a switch of another master is ignored; one of ours,
// its promotion then its switch published twice, is told once; a failover
// back is told again; each is logged once; and stop returns at once, the
// dead address notwithstanding, once the switched under way (which waits
// for the watch's context) has returned.
func TestWatchSwitchMaster(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	dead := redistest.DeadAddr(t)

	var buf bytes.Buffer
	var (
		mu       sync.Mutex
		switches []string
		ended    atomic.Bool // the second switched saw its context end
	)
	told := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(switches)
	}
	stop := watchSwitchMaster(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{dead, redistest.Addr(t)}},
		slog.New(slog.NewTextHandler(&buf, nil)), func(ctx context.Context, from, to string) {
			mu.Lock()
			switches = append(switches, from+">"+to)
			n := len(switches)
			mu.Unlock()
			if n == 2 {
				<-ctx.Done()
				ended.Store(true)
			}
		}, watchHooks{})
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()

	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err := rdb.PubSubNumSub(ctx, "+switch-master", "+promoted-slave").Result()
		if err == nil && n["+switch-master"] > 0 && n["+promoted-slave"] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("subscriptions %v, want +switch-master and +promoted-slave", n)
		}
	}
	await := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Second); len(told()) < want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				break
			}
		}
		time.Sleep(200 * time.Millisecond) // no more than want
		if got := told(); len(got) != want {
			t.Fatalf("switches told %q, want %d", got, want)
		}
	}
	rdb.Publish(ctx, "+promoted-slave", "slave 127.0.0.1:2 127.0.0.1 2 @ other 127.0.0.1 1")
	rdb.Publish(ctx, "+switch-master", "other 127.0.0.1 1 127.0.0.1 2")
	rdb.Publish(ctx, "+promoted-slave", "slave 127.0.0.1:2 127.0.0.1 2 @ m 127.0.0.1 1")
	rdb.Publish(ctx, "+switch-master", "m 127.0.0.1 1 127.0.0.1 2")
	rdb.Publish(ctx, "+switch-master", "m 127.0.0.1 1 127.0.0.1 2")
	await(1)
	rdb.Publish(ctx, "+promoted-slave", "slave 127.0.0.1:1 127.0.0.1 1 @ m 127.0.0.1 2")
	rdb.Publish(ctx, "+switch-master", "m 127.0.0.1 2 127.0.0.1 1")
	await(2)

	start := time.Now()
	stop()
	stopped = true
	if d := time.Since(start); d > time.Second {
		t.Errorf("stop took %v", d)
	}
	if !ended.Load() {
		t.Error("stop returned before the switched under way")
	}
	if n, _ := rdb.PubSubNumSub(ctx, "+switch-master", "+promoted-slave").Result(); n["+switch-master"]+n["+promoted-slave"] != 0 {
		t.Errorf("subscriptions left after stop: %v", n)
	}
	if got := strings.Count(buf.String(), sentinelSwitchMsg); got != 2 {
		t.Errorf("%d switch lines, want 2; log:\n%s", got, buf.String())
	}
	if want := []string{"127.0.0.1:1>127.0.0.1:2", "127.0.0.1:2>127.0.0.1:1"}; !slices.Equal(told(), want) {
		t.Errorf("switches told %q, want %q (one per change, the other name's none)", told(), want)
	}
	if !strings.Contains(buf.String(), "from=127.0.0.1:1 to=127.0.0.1:2 event=+promoted-slave") {
		t.Errorf("no promotion in the log:\n%s", buf.String())
	}
}

// Options naming one Sentinel: the watch subscribes on the others too, as
// that one lists them (SENTINEL SENTINELS). If the one named leads a
// planned failover it announces the switch seconds after the others.
func TestWatchSwitchMasterDiscoversSentinels(t *testing.T) {
	set := redistest.StartSentinel(t, nil)
	ctx := context.Background()
	stop := watchSwitchMaster(&redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: []string{set.Sentinels[0].Addr}},
		slog.New(slog.DiscardHandler), func(context.Context, string, string) {}, watchHooks{})
	defer stop()
	subscribed := func(addr string) bool {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		list, err := c.ClientList(ctx).Result()
		return err == nil && strings.Contains(list, "cmd=subscribe")
	}
	for _, s := range set.Sentinels {
		for deadline := time.Now().Add(5 * time.Second); !subscribed(s.Addr); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("no subscription to +switch-master on Sentinel %s (the options named %s)", s.Addr, set.Sentinels[0].Addr)
			}
		}
	}
}

// roleWatch is a watch of master "m" whose Sentinel a Redis stands in
// for (rdb, on which the test publishes), with the switches it tells
// (told) and its log; event is the payload of a promotion of replica.
type roleWatch struct {
	rdb   *redis.Client
	log   *logtest.Log
	event string
	mu    sync.Mutex
	tells []string
	// refused counts the replica's refusals of INFO told.
	refused atomic.Int32
}

func startRoleWatch(t *testing.T, replica string, o *redis.FailoverOptions) *roleWatch {
	w := &roleWatch{rdb: redistest.Client(t), log: &logtest.Log{}}
	o.MasterName, o.SentinelAddrs = "m", []string{redistest.Addr(t)}
	stop := watchSwitchMaster(o, w.log.TextLogger(), func(_ context.Context, from, to string) {
		w.mu.Lock()
		w.tells = append(w.tells, from+">"+to)
		w.mu.Unlock()
	}, watchHooks{roleRefused: func(string) { w.refused.Add(1) }})
	t.Cleanup(stop)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err := w.rdb.PubSubNumSub(context.Background(), sentinelPromotionEvent).Result()
		if err == nil && n[sentinelPromotionEvent] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no subscription to %s", sentinelPromotionEvent)
		}
	}
	host, port, _ := net.SplitHostPort(replica)
	w.event = "slave " + replica + " " + host + " " + port + " @ m 127.0.0.1 1"
	return w
}

func (w *roleWatch) told() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.tells)
}

// TestWatchSwitchMasterRole: on a Sentinel's +failover-state-wait-promotion
// the watch asks the replica its role, and acts once it answers master,
// before the Sentinel's +promoted-slave (which its INFO of the replica
// makes most of a second late); that event and the switch, for the same
// change, are then not acted on again.
func TestWatchSwitchMasterRole(t *testing.T) {
	replica := redistest.StartServer(t)
	ctx := context.Background()
	admin := replica.Client(t)
	_, deadPort, _ := net.SplitHostPort(redistest.DeadAddr(t))
	if err := admin.Do(ctx, "replicaof", "127.0.0.1", deadPort).Err(); err != nil {
		t.Fatal(err)
	}
	w := startRoleWatch(t, replica.Addr, &redis.FailoverOptions{})
	rdb, buf, told, event := w.rdb, w.log, w.told, w.event
	host, port, _ := net.SplitHostPort(replica.Addr)
	rdb.Publish(ctx, sentinelPromotionEvent, event)
	rdb.Publish(ctx, sentinelPromotionEvent, event) // asked once
	time.Sleep(200 * time.Millisecond)
	if got := told(); len(got) != 0 {
		t.Fatalf("switches told %q while the replica is one", got)
	}
	if err := admin.Do(ctx, "replicaof", "no", "one").Err(); err != nil {
		t.Fatal(err)
	}
	promoted := time.Now()
	want := []string{"127.0.0.1:1>" + replica.Addr}
	for !slices.Equal(told(), want) {
		if time.Since(promoted) > time.Second {
			t.Fatalf("switches told %q, want %q", told(), want)
		}
		time.Sleep(time.Millisecond)
	}
	t.Logf("told %v after the replica became a master", time.Since(promoted))
	rdb.Publish(ctx, "+promoted-slave", event)
	rdb.Publish(ctx, "+switch-master", "m 127.0.0.1 1 "+host+" "+port)
	// Past sentinelConfirmFor: confirmed, so not undone.
	time.Sleep(sentinelConfirmFor + 300*time.Millisecond)
	if got := told(); !slices.Equal(got, want) {
		t.Errorf("switches told %q, want %q: the promotion and switch acted on again, or the change undone", got, want)
	}
	if !strings.Contains(buf.String(), "event=role") || strings.Count(buf.String(), sentinelSwitchMsg) != 1 {
		t.Errorf("log:\n%s\nwant one switch line, on the replica's role", buf.String())
	}
}

// TestWatchSwitchMasterRoleRefused: a replica that refuses INFO (an ACL
// user without it) is logged once, and counted, and the change waits for
// the Sentinel's +promoted-slave.
func TestWatchSwitchMasterRoleRefused(t *testing.T) {
	replica := redistest.StartServer(t)
	ctx := context.Background()
	if err := replica.Client(t).Do(ctx, "acl", "setuser", "norole", "on", ">pw", "~*", "+@all", "-info").Err(); err != nil {
		t.Fatal(err)
	}
	w := startRoleWatch(t, replica.Addr, &redis.FailoverOptions{Username: "norole", Password: "pw"})
	rdb, buf, event := w.rdb, w.log, w.event
	switches := func() int { return len(w.told()) }
	rdb.Publish(ctx, sentinelPromotionEvent, event)
	time.Sleep(300 * time.Millisecond)
	if n := switches(); n != 0 || strings.Count(buf.String(), sentinelRoleMsg) != 1 || !strings.Contains(buf.String(), "NOPERM") {
		t.Fatalf("%d switches told, log:\n%s\nwant none, and the refusal logged once", n, buf.String())
	}
	if n := w.refused.Load(); n != 1 {
		t.Errorf("refusal told %d times, want once, with its log line", n)
	}
	rdb.Publish(ctx, "+promoted-slave", event)
	for deadline := time.Now().Add(time.Second); switches() != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the +promoted-slave that followed was not acted on")
		}
	}
}

// TestWatchSwitchMasterRoleUnconfirmed: a change acted on at the replica's
// role that no Sentinel announces within sentinelConfirmFor (its leader
// lost before its next INFO of the replica: the failover never commits)
// is undone, the old master used again, with a WARN; a +promoted-slave
// that comes later still moves the instance.
func TestWatchSwitchMasterRoleUnconfirmed(t *testing.T) {
	replica := redistest.StartServer(t)
	ctx := context.Background()
	w := startRoleWatch(t, replica.Addr, &redis.FailoverOptions{})
	rdb, buf, told, event := w.rdb, w.log, w.told, w.event
	start := time.Now()
	rdb.Publish(ctx, sentinelPromotionEvent, event) // the replica answers master at once
	there, back := "127.0.0.1:1>"+replica.Addr, replica.Addr+">127.0.0.1:1"
	for !slices.Equal(told(), []string{there}) {
		if time.Since(start) > time.Second {
			t.Fatalf("switches told %q, want %q", told(), there)
		}
		time.Sleep(time.Millisecond)
	}
	acted := time.Now()
	for !slices.Equal(told(), []string{there, back}) {
		if time.Since(acted) > sentinelConfirmFor+time.Second {
			t.Fatalf("switches told %q, want %q then %q: the unconfirmed change not undone", told(), there, back)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d := time.Since(acted); d < sentinelConfirmFor-50*time.Millisecond {
		t.Errorf("undone %v after it was acted on, want %v", d, sentinelConfirmFor)
	}
	if got := strings.Count(buf.String(), sentinelUnconfirmedMsg); got != 1 {
		t.Errorf("%d %q lines, want 1; log:\n%s", got, sentinelUnconfirmedMsg, buf.String())
	}
	rdb.Publish(ctx, "+promoted-slave", event)
	for !slices.Equal(told(), []string{there, back, there}) {
		if time.Since(acted) > sentinelConfirmFor+3*time.Second {
			t.Fatalf("switches told %q: the late +promoted-slave not acted on", told())
		}
		time.Sleep(5 * time.Millisecond)
	}
}
