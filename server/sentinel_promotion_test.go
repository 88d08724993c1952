package server

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// postChecks posts checks of policy "hot", key "k" to the JSON API at
// addr from workers goroutines, one after another each, until the
// returned stop is called.
func postChecks(addr string, workers int) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 2 * time.Second}
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				resp, err := client.Post("http://"+addr+"/v1/check", "application/json", bytes.NewBufferString(`{"policy":"hot","key":"k"}`))
				if err == nil {
					resp.Body.Close()
				}
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

// TestFaultServeSentinelPromotion: three instances, each on its own
// Sentinel (a URL naming one), and a planned SENTINEL FAILOVER led by the
// first one's. The old master stays a master from the promotion until it
// is made a replica, and the takes it acknowledges meanwhile are lost; the
// leader sees the promotion on its next INFO of the replica (+promoted-
// slave, most of a second later), and the other Sentinels name the old
// master until the leader's hello messages reach them. Every instance
// must leave the old master at the promotion itself, not at the first
// +switch-master: no take on it later than promotionBound after the
// replica first answers ROLE master. The promotion and the switches that
// follow are acted on once per instance, and an instance whose Sentinel
// still names the old master dials the new one, once counted.
func TestFaultServeSentinelPromotion(t *testing.T) {
	race.SkipTiming(t)
	const promotionBound = 150 * time.Millisecond
	set := redistest.StartSentinel(t, &redistest.SentinelOptions{Replicas: 2, SyncDelay: 2 * time.Second})
	ctx := context.Background()
	node := func(addr string) *redis.Client {
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	config := writeConfig(t, "domain: promotion\npolicies:\n  - name: hot\n    limit: fixed_window 1000000000/1h\n")
	procs := make([]*proc, len(set.Sentinels))
	for i, s := range set.Sentinels {
		procs[i] = startSluice(t, nil, "--config", config, "--redis", "redis+sentinel://"+s.Addr+"?master_name="+redistest.SentinelMaster,
			"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
			"--failure-policy", "local", "--decision-timeout", "200ms", "--watch-interval", "0")
	}
	// Each instance's client listens to the one Sentinel its URL names,
	// and each instance's watch to every Sentinel, once discovered.
	for _, s := range set.Sentinels {
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			list, err := node(s.Addr).ClientList(ctx).Result()
			if n := strings.Count(list, "cmd=subscribe"); err == nil && n == 1+len(procs) {
				break
			} else if time.Now().After(deadline) {
				t.Fatalf("Sentinel %s: %d subscribed clients (%v), want %d", s.Addr, n, err, 1+len(procs))
			}
		}
	}

	for _, p := range procs {
		t.Cleanup(postChecks(p.http, 2))
	}
	old := node(set.Master.Addr)
	before := redistest.ScriptCalls(t, old)
	time.Sleep(300 * time.Millisecond)
	if redistest.ScriptCalls(t, old) == before {
		t.Fatal("the load does not reach the master")
	}

	// When the leader announces the promotion, and each Sentinel the switch.
	var (
		mu        sync.Mutex
		promoted  time.Time
		announced = map[string]time.Time{}
	)
	leader := set.Sentinels[0].Addr
	for _, s := range set.Sentinels {
		sc := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
		ps := sc.Subscribe(ctx, "+switch-master", "+promoted-slave")
		for range 2 {
			if _, err := ps.Receive(ctx); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(func() { ps.Close(); sc.Close() })
		go func() {
			for m := range ps.Channel() {
				at := time.Now()
				mu.Lock()
				if m.Channel == "+promoted-slave" && s.Addr == leader && promoted.IsZero() {
					promoted = at
				}
				if _, ok := announced[s.Addr]; !ok && m.Channel == "+switch-master" {
					announced[s.Addr] = at
				}
				mu.Unlock()
			}
		}()
	}
	watch := set.WatchPromotion(t)

	if err := redis.NewSentinelClient(&redis.Options{Addr: leader}).Failover(ctx, redistest.SentinelMaster).Err(); err != nil {
		t.Fatal(err)
	}
	var first time.Time // the first +switch-master
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		first = time.Time{}
		for _, at := range announced {
			if first.IsZero() || at.Before(first) {
				first = at
			}
		}
		all := len(announced) == len(set.Sentinels) && !promoted.IsZero()
		led := announced[leader]
		mu.Unlock()
		if all && time.Since(led) > 300*time.Millisecond {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the leader announced the promotion at %v, the Sentinels the switch at %v: not all within 10 s", promoted, announced)
		}
	}
	roleAt, last, lost := watch.Stop()
	mu.Lock()
	defer mu.Unlock()
	t.Logf("after the promotion (a replica's ROLE): the leader's +promoted-slave %v, the first +switch-master %v, the leader's %v",
		promoted.Sub(roleAt), first.Sub(roleAt), announced[leader].Sub(roleAt))
	t.Logf("last take on the old master %v after the promotion, %v after +promoted-slave; %d script calls on it since the promotion",
		last, roleAt.Add(last).Sub(promoted), lost)
	if last > promotionBound {
		t.Errorf("takes on the old master until %v after the promotion, want within %v", last, promotionBound)
	}
	for i, p := range procs {
		for series, want := range map[string]string{
			`sluice_redis_replaced_master_total{how="closed"}`: "1",
			`sluice_redis_failovers_total{kind="sentinel"}`:    "1",
		} {
			if got := scrapedMetric(t, p, series); got != want {
				t.Errorf("instance %d (on Sentinel %s): %s = %q, want %s", i, set.Sentinels[i].Addr, series, got, want)
			}
		}
		redirected := scrapedMetric(t, p, `sluice_redis_replaced_master_total{how="redirected"}`)
		t.Logf("instance %d: dials its Sentinel sent to the old master redirected: %s", i, redirected)
		if redirected != "0" && redirected != "1" {
			t.Errorf(`instance %d: sluice_redis_replaced_master_total{how="redirected"} = %q, want at most 1`, i, redirected)
		}
		logs := p.stderr.String()
		if n := strings.Count(logs, sentinelSwitchMsg); n != 1 {
			t.Errorf("instance %d: %d %q lines, want 1; log:\n%s", i, n, sentinelSwitchMsg, logs)
		}
		if n := strings.Count(logs, replacedMasterMsg); n != 1 {
			t.Errorf("instance %d: %d %q lines, want 1; log:\n%s", i, n, replacedMasterMsg, logs)
		}
	}
}
