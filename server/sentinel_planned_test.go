package server

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFaultServeSentinelPlannedFailover: a planned SENTINEL FAILOVER sent
// to the Sentinel that `sluice serve`'s client listens to. That Sentinel
// leads the failover and announces +switch-master only once the other
// replica has resynced from the new master (a full resync, delayed by
// repl-diskless-sync-delay), seconds after the other Sentinels announced
// it. The service must move to the new master within a second of the
// first announcement, and send the old master no take after that.
func TestFaultServeSentinelPlannedFailover(t *testing.T) {
	race.SkipTiming(t)
	set := redistest.StartSentinel(t, &redistest.SentinelOptions{Replicas: 2, SyncDelay: 4 * time.Second})
	ctx := context.Background()
	node := func(addr string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	config := writeConfig(t, "domain: planned\npolicies:\n  - name: hot\n    limit: fixed_window 1000000000/1h\n")
	p := startSluice(t, nil, "--config", config, "--redis", set.URL(), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
		"--failure-policy", "local", "--decision-timeout", "200ms", "--watch-interval", "0")

	// Takes from a few workers until the test ends.
	t.Cleanup(postChecks(p.http, 4))

	old := node(set.Master.Addr)
	evalshaOf := func(c *redis.Client) int64 { return redistest.ScriptCalls(t, c) }
	evalsha := func() int64 { return evalshaOf(old) }
	// The Sentinel the service's client listens to is the one with two
	// subscribed connections: go-redis's and the service's own watch,
	// which subscribes on every Sentinel.
	var leader string
	for deadline := time.Now().Add(5 * time.Second); leader == ""; time.Sleep(50 * time.Millisecond) {
		for _, s := range set.Sentinels {
			list, err := node(s.Addr).ClientList(ctx).Result()
			if err == nil && strings.Count(list, "cmd=subscribe") == 2 {
				leader = s.Addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no Sentinel has the service's client subscribed")
		}
	}
	before := evalsha()
	time.Sleep(300 * time.Millisecond)
	if evalsha() == before {
		t.Fatal("the load does not reach the master")
	}

	// When each Sentinel announces the switch.
	var (
		mu        sync.Mutex
		announced = map[string]time.Time{}
	)
	for _, s := range set.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
		ps := sc.Subscribe(ctx, "+switch-master")
		if _, err := ps.Receive(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ps.Close(); sc.Close() })
		go func() {
			for range ps.Channel() {
				mu.Lock()
				if _, ok := announced[s.Addr]; !ok {
					announced[s.Addr] = time.Now()
				}
				mu.Unlock()
			}
		}()
	}

	// The old master's script calls and the replicas', sampled until the
	// leader announced.
	type sample struct {
		at       time.Time
		calls    int64
		replicas []int64
		masters  []bool // which replica says it is a master
	}
	var samples []sample
	replicas := make([]*redis.Client, len(set.Replicas))
	for i, r := range set.Replicas {
		replicas[i] = node(r.Addr)
	}
	if err := redis.NewSentinelClient(&redis.Options{Addr: leader}).Failover(ctx, redistest.SentinelMaster).Err(); err != nil {
		t.Fatal(err)
	}
	var first time.Time
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		sm := sample{at: time.Now(), calls: evalsha()}
		for _, r := range replicas {
			sm.replicas = append(sm.replicas, evalshaOf(r))
			role, _ := r.Do(ctx, "role").Slice()
			sm.masters = append(sm.masters, len(role) > 0 && role[0] == "master")
		}
		samples = append(samples, sm)
		mu.Lock()
		first = time.Time{}
		for _, at := range announced {
			if first.IsZero() || at.Before(first) {
				first = at
			}
		}
		led, all := announced[leader], len(announced) == len(set.Sentinels)
		mu.Unlock()
		if all && time.Since(led) > 500*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the Sentinels announced the switch at %v, not all of them within 15 s", announced)
		}
	}
	mu.Lock()
	gap := announced[leader].Sub(first)
	mu.Unlock()
	t.Logf("first +switch-master; the leader's %v later", gap)
	if gap < 1500*time.Millisecond {
		t.Fatalf("the leading Sentinel announced %v after the first: not the case this test is about", gap)
	}
	// The last sample the old master's script calls grew in.
	var moved time.Time
	for i := 1; i < len(samples); i++ {
		if samples[i].calls > samples[i-1].calls {
			moved = samples[i].at
		}
	}
	after := moved.Sub(first)
	t.Logf("last take on the old master %v after the first +switch-master (%d script calls in all)",
		after, samples[len(samples)-1].calls)
	if after > time.Second {
		t.Errorf("takes on the old master until %v after the first +switch-master, want within 1s", after)
	}
	// The first sample with takes on the new master, a replica until then.
	promoted, err := redis.NewSentinelClient(&redis.Options{Addr: leader}).GetMasterAddrByName(ctx, redistest.SentinelMaster).Result()
	if err != nil {
		t.Fatal(err)
	}
	var (
		landed, promotion time.Time
		atPromotion       int64 // the old master's script calls then
	)
	for _, sm := range samples {
		for i, r := range set.Replicas {
			if r.Addr != net.JoinHostPort(promoted[0], promoted[1]) {
				continue
			}
			if sm.replicas[i] > 0 && landed.IsZero() {
				landed = sm.at
			}
			if sm.masters[i] && promotion.IsZero() {
				promotion, atPromotion = sm.at, sm.calls
			}
		}
	}
	t.Logf("first take on the new master %v after the first +switch-master; the promotion %v before it, with %d script calls on the old master since",
		landed.Sub(first), first.Sub(promotion), samples[len(samples)-1].calls-atPromotion)
	if landed.IsZero() || landed.Sub(first) > time.Second {
		t.Errorf("first take on the new master %v after the first +switch-master, want within 1s", landed.Sub(first))
	}
	p.expect(t, replacedMasterMsg)
	p.expect(t, agreedMasterMsg)
	if got := scrapedMetric(t, p, `sluice_redis_replaced_master_total{how="closed"}`); got != "1" {
		t.Errorf(`sluice_redis_replaced_master_total{how="closed"} = %q, want 1`, got)
	}
	if got := scrapedMetric(t, p, "sluice_redis_sentinel_role_refused_total"); got != "0" {
		t.Errorf("sluice_redis_sentinel_role_refused_total = %q, want 0 (exposed; no replica refused INFO)", got)
	}
}
