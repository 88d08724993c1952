package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestWatchSwitchMaster: a Redis stands in for a Sentinel (PUBLISH on
// +switch-master), next to an address nothing listens on. A switch of
// another master is ignored; one of ours, published twice, probes once,
// after the ping succeeds; another switch probes again; each is logged
// once; and stop returns at once, the dead address notwithstanding.
func TestWatchSwitchMaster(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	dead := redistest.DeadAddr(t)

	var buf bytes.Buffer
	var pings, probes, switches atomic.Int32
	ping := func(context.Context) error {
		if pings.Add(1) <= 2 {
			return errors.New("not yet") // the client still on the old master
		}
		return nil
	}
	probe := func(context.Context) error { probes.Add(1); return nil }
	stop := watchSwitchMaster(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{dead, redistest.Addr(t)}},
		slog.New(slog.NewTextHandler(&buf, nil)), ping, probe, func(string, string) { switches.Add(1) })
	stopped := false
	defer func() {
		if !stopped {
			stop()
		}
	}()

	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		n, err := rdb.PubSubNumSub(ctx, "+switch-master").Result()
		if err == nil && n["+switch-master"] > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no subscription to +switch-master")
		}
	}
	await := func(want int32) {
		t.Helper()
		for deadline := time.Now().Add(3 * time.Second); probes.Load() < want; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				break
			}
		}
		time.Sleep(200 * time.Millisecond) // no more than want
		if got := probes.Load(); got != want {
			t.Fatalf("%d probes, want %d", got, want)
		}
	}
	rdb.Publish(ctx, "+switch-master", "other 127.0.0.1 1 127.0.0.1 2")
	rdb.Publish(ctx, "+switch-master", "m 127.0.0.1 1 127.0.0.1 2")
	rdb.Publish(ctx, "+switch-master", "m 127.0.0.1 1 127.0.0.1 2")
	await(1)
	if pings.Load() != 3 {
		t.Errorf("%d pings, want 3 (two failed, then the probe)", pings.Load())
	}
	rdb.Publish(ctx, "+switch-master", "m 127.0.0.1 2 127.0.0.1 3")
	await(2)

	start := time.Now()
	stop()
	stopped = true
	if d := time.Since(start); d > time.Second {
		t.Errorf("stop took %v", d)
	}
	if n, _ := rdb.PubSubNumSub(ctx, "+switch-master").Result(); n["+switch-master"] != 0 {
		t.Errorf("%d subscriptions left after stop", n["+switch-master"])
	}
	if got := strings.Count(buf.String(), sentinelSwitchMsg); got != 2 {
		t.Errorf("%d switch lines, want 2; log:\n%s", got, buf.String())
	}
	if got := switches.Load(); got != 2 {
		t.Errorf("%d switches told, want 2 (one per new master, the other name's none)", got)
	}
	if !strings.Contains(buf.String(), "to=127.0.0.1:3") {
		t.Errorf("no new master in the log:\n%s", buf.String())
	}
}

// A URL naming one Sentinel: the watch subscribes on the others too, as
// that one lists them (SENTINEL SENTINELS). If the one named leads a
// planned failover it announces the switch seconds after the others.
func TestWatchSwitchMasterDiscoversSentinels(t *testing.T) {
	set := redistest.StartSentinel(t, nil)
	ctx := context.Background()
	nop := func(context.Context) error { return nil }
	stop := watchSwitchMaster(&redis.FailoverOptions{MasterName: redistest.SentinelMaster, SentinelAddrs: []string{set.Sentinels[0].Addr}},
		slog.New(slog.DiscardHandler), nop, nop, func(string, string) {})
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
				t.Fatalf("no subscription to +switch-master on Sentinel %s (the URL named %s)", s.Addr, set.Sentinels[0].Addr)
			}
		}
	}
}
