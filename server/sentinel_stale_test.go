package server

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFaultServeSentinelStaleSwitchCounted: a +switch-master older than the
// master change acted on is ignored, and counted in
// sluice_redis_sentinel_stale_switches_total as well as logged: it was
// an INFO line alone. Sentinel A adopts replica R2 at config epoch 6
// (the change acted on), then Sentinel B, which has not heard of it, R1
// at epoch 5, announcing +switch-master to it.
func TestFaultServeSentinelStaleSwitchCounted(t *testing.T) {
	// B must hear epoch 5 from the test before epoch 6 from A's hello
	// (within 2 s): a timing the race detector's slowdown can miss.
	race.SkipTiming(t)
	set := redistest.StartSentinel(t, &redistest.SentinelOptions{Replicas: 2})
	config := writeConfig(t, "domain: stale\npolicies:\n  - name: hot\n    limit: fixed_window 1000/1s\n")
	p := startSluice(t, nil, "--config", config, "--redis", set.URL(), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
		"--watch-interval", "0")
	const stale = "sluice_redis_sentinel_stale_switches_total"
	if got := scrapedMetric(t, p, stale); got != "0" {
		t.Fatalf("%s = %q at start, want 0", stale, got)
	}
	// The service's watch subscribes on every Sentinel.
	ctx := context.Background()
	for _, s := range set.Sentinels {
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		t.Cleanup(func() { c.Close() })
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if list, err := c.ClientList(ctx).Result(); err == nil && strings.Contains(list, "cmd=subscribe") {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the service did not subscribe on Sentinel %s", s.Addr)
			}
		}
	}
	await := func(series, want string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if got := scrapedMetric(t, p, series); got == want {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("%s = %q, want %s; log:\n%s", series, got, want, p.stderr.String())
			}
		}
	}
	a, b := set.Sentinels[0], set.Sentinels[1]
	sb := redis.NewSentinelClient(&redis.Options{Addr: b.Addr})
	ps := sb.Subscribe(ctx, "+switch-master")
	t.Cleanup(func() { ps.Close(); sb.Close() })
	if _, err := ps.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	// A Sentinel tells the others its configuration in a hello every 2 s:
	// A's could tell B of epoch 6 before the test's epoch 5 reaches it
	// (under load, in one CI run of four). A waits a minute between hellos
	// until B has announced the stale switch; every Sentinel but B is told
	// epoch 6 by the test, so that none hears B's 5 first.
	ca := redis.NewClient(&redis.Options{Addr: a.Addr})
	t.Cleanup(func() { ca.Close() })
	helloEvery := func(ms string) {
		t.Helper()
		if err := ca.Do(ctx, "SENTINEL", "DEBUG", "PUBLISH-PERIOD", ms).Err(); err != nil {
			t.Fatalf("SENTINEL DEBUG PUBLISH-PERIOD %s on A: %v", ms, err)
		}
	}
	helloEvery("60000")
	for _, s := range set.Sentinels {
		if s != b {
			set.AnnounceConfig(t, s, set.Replicas[1], 6)
		}
	}
	await(`sluice_redis_failovers_total{kind="sentinel"}`, "1")
	set.AnnounceConfig(t, b, set.Replicas[0], 5)
	select {
	case msg := <-ps.Channel():
		if !strings.HasSuffix(msg.Payload, strings.Replace(set.Replicas[0].Addr, ":", " ", 1)) {
			t.Fatalf("Sentinel B announced %q, want the switch to R1: it heard of epoch 6 first", msg.Payload)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("Sentinel B did not announce the switch to R1")
	}
	await(stale, "1")
	helloEvery("2000")                  // Redis's default
	time.Sleep(2500 * time.Millisecond) // B hears of epoch 6 and follows: no stale switch
	if got := scrapedMetric(t, p, stale); got != "1" {
		t.Errorf("%s = %q, want 1", stale, got)
	}
	if got := scrapedMetric(t, p, `sluice_redis_failovers_total{kind="sentinel"}`); got != "1" {
		t.Errorf(`sluice_redis_failovers_total{kind="sentinel"} = %q, want 1: the stale switch was followed`, got)
	}
}
