package server

import (
	"context"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// restartWithPassword stops r and starts a redis-server on its address
// that requires password pw, stopped at cleanup.
func restartWithPassword(t *testing.T, r *redisProc, pw string) {
	t.Helper()
	r.Stop()
	cmd := exec.Command("redis-server", "--port", strings.TrimPrefix(r.Addr, "127.0.0.1:"), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--requirepass", pw, "--dir", t.TempDir(),
		"--logfile", filepath.Join(t.TempDir(), "redis.log"))
	redistest.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	c := redis.NewClient(&redis.Options{Addr: r.Addr, Password: pw, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); c.Ping(context.Background()).Err() != nil; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("redis-server with a password did not start")
		}
	}
}

// TestServeRedisRestartedWithPassword: Redis restarted under load with a
// password sluice serve does not have. The first line the service logs
// about it is the truth, `store lost` with cause auth, and it is the only
// one: no partial failure (a store that refuses every connection is lost,
// not partly down), counted as such.
func TestServeRedisRestartedWithPassword(t *testing.T) {
	r := startRedis(t)
	f := startFleet(t, r.url(), 1, "policies:\n  - name: api\n    limit: fixed_window 1000000000/1h\n", "--failure-policy", "local")
	p := f.procs[0]
	l := f.drive(4, "k", "api")
	var once sync.Once
	finish := func() { once.Do(l.finish) }
	defer finish()
	time.Sleep(300 * time.Millisecond)
	restartWithPassword(t, r, "new")
	f.awaitLogs(t, 10*time.Second, `msg="store lost"`)
	time.Sleep(500 * time.Millisecond) // failed decisions go on: no other line may follow
	finish()
	logs := p.stderr.String()
	var line string
	for l := range strings.Lines(logs) {
		if strings.Contains(l, `msg="store lost"`) {
			line = l
			break
		}
	}
	if !strings.Contains(line, "cause=auth") || !strings.Contains(line, "level=ERROR") {
		t.Errorf("store lost line %q: want ERROR, cause=auth", line)
	}
	if strings.Contains(logs, "breaker is closed") {
		t.Errorf("a partial failure logged for a Redis that refuses every connection:\n%s", logs)
	}
	if got := metric(t, p, `sluice_partial_failure_transitions_total{cause="auth",to="on"}`); got > 0 {
		t.Errorf("partial failure transitions (auth) %v, want none", got)
	}
	if got := metric(t, p, `sluice_store_transitions_total{cause="auth",to="down"}`); got != 1 {
		t.Errorf("store transitions to down (auth) %v, want 1", got)
	}
}

// TestFaultStallNamedFromFirstFailure: Redis's writes paused (CLIENT
// PAUSE WRITE) under load through sluice serve: every decision that timed
// out is counted with cause stalled, from the first, on connections that
// stay established; none is called unreachable while the watch (every
// second) has yet to classify the stall.
func TestFaultStallNamedFromFirstFailure(t *testing.T) {
	race.SkipTiming(t)
	for _, policy := range []string{"local", "error"} {
		t.Run(policy, func(t *testing.T) {
			r := startRedis(t)
			f := startFleet(t, r.url(), 1, "policies:\n  - name: api\n    limit: fixed_window 1000000000/1h\n", "--failure-policy", policy)
			p := f.procs[0]
			l := f.drive(4, "k", "api")
			time.Sleep(300 * time.Millisecond)
			admin := r.client()
			defer admin.Close()
			if err := admin.Do(context.Background(), "CLIENT", "PAUSE", 1500, "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			time.Sleep(2 * time.Second)
			l.finish()
			if got := metric(t, p, `sluice_store_errors_total{cause="stalled",op="take",store="redis"}`); got <= 0 {
				t.Errorf("takes failed as stalled: %v, want some", got)
			}
			if got := metric(t, p, `sluice_store_errors_total{cause="unreachable",op="take",store="redis"}`); got > 0 {
				t.Errorf("takes failed as unreachable: %v, want none (Redis answered all along):\n%s", got, p.stderr.String())
			}
			if strings.Contains(p.stderr.String(), "unreachable") {
				t.Errorf("a stalled Redis called unreachable:\n%s", p.stderr.String())
			}
		})
	}
}

// TestFaultBreakerProbedWhenStoreBack: the health check that finds Redis
// back probes the open breaker at once, even one whose probe has just
// failed, so the instance leaves its fallback within about a check of
// Redis's return, not a probe interval later: the fleet's stagger S, and
// the r·S it adds to the degraded bound, shrink. Six outages, Redis back at different points of the probe cycle; without it
// the breaker closed up to a probe interval after the check (596ms in
// one of five).
func TestFaultBreakerProbedWhenStoreBack(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	admin := r.Client(t)
	ctx := context.Background()
	sluiceUser(t, admin, "flaky")
	cfg := writeConfig(t, slotsConfig)
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://flaky:pw@" + r.Addr + "/0", StoreCheckInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	var worst time.Duration
	for episode := range 6 {
		if err := admin.Do(ctx, "acl", "setuser", "flaky", "-@write").Err(); err != nil {
			t.Fatal(err)
		}
		for i := 0; !srv.health.Status().FallbackActive || !srv.health.storeDown(); i++ {
			if i == 400 {
				t.Fatalf("episode %d: the breaker never opened, or the store was never lost", episode)
			}
			if _, err := srv.Service().Check(ctx, "api", "ann", 1); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Let a probe fail: the breaker's next one is then a probe interval away.
		time.Sleep(time.Duration(episode) * 170 * time.Millisecond)
		if err := admin.Do(ctx, "acl", "setuser", "flaky", "+@write").Err(); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		for srv.health.Status().FallbackActive {
			if time.Since(back) > 5*time.Second {
				t.Fatalf("episode %d: breaker still open 5s after Redis took writes again", episode)
			}
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(back)
		t.Logf("episode %d: breaker closed %v after Redis took writes again", episode, took)
		worst = max(worst, took)
	}
	// A check every 100ms, then the probe: well under the probe interval.
	if worst > 400*time.Millisecond {
		t.Errorf("slowest close %v after Redis came back, want within 400ms (a check and a probe)", worst)
	}
}
