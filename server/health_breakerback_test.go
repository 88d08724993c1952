//go:build unix

package server

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFaultStatusBackWithBreaker: Redis killed under load, the store
// lost by a check, then Redis restarted: the decisions' probes close the
// breaker and Redis answers them again. /v1/status, /readyz and
// sluice_fallback_active then say so at once, not at the watch's next
// check (an hour here; a second by default, when `store back` came
// 0.75–0.85s after `breaker closed` in a Sentinel failover).
func TestFaultStatusBackWithBreaker(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	// The test checks once, as the watch would, to have the store lost.
	srv, p, logs := serveChecked(t, "redis://"+r.Addr)
	stop := keepCalling(2, 2*time.Millisecond, func(int) { sendKey(p, "api", "k") })
	defer stop()
	time.Sleep(200 * time.Millisecond)
	r.Stop()
	logged(t, logs, "resilient: breaker open")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.health.check(ctx); err == nil {
		t.Fatal("the check passed with Redis killed")
	}
	if st := srv.health.Status(); st.Store.Up || !st.FallbackActive {
		t.Fatalf("Redis killed and checked: store up %v, fallback active %v; want lost, the failure policy answering", st.Store.Up, st.FallbackActive)
	}
	r.Start(t)
	logged(t, logs, "resilient: breaker closed")
	closed := time.Now()
	var st Status
	for {
		st = srv.health.Status()
		if st.Store.Up && !st.FallbackActive && !st.Degraded {
			break
		}
		if time.Since(closed) > 500*time.Millisecond {
			t.Fatalf("500ms after the breaker closed on Redis's answers: store up %v, fallback active %v, degraded %v (%q); want up, not answering, not degraded:\n%s",
				st.Store.Up, st.FallbackActive, st.Degraded, st.Reasons, logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("status up %v after the breaker closed", time.Since(closed))
	if code, body := p.get(t, "/readyz"); code != 200 || body != "ok\n" && body != "ok" {
		t.Errorf("/readyz %d %q, want 200 ok", code, body)
	}
	if v := scrapedMetric(t, p, "sluice_fallback_active"); v != "0" {
		t.Errorf("sluice_fallback_active %q, want 0", v)
	}
	if n := countLines(logs, `msg="store back"`); n != 1 {
		t.Errorf("%d store back lines, want 1:\n%s", n, logs.String())
	}
}

// TestFaultClusterMasterBackProbedAtOnce: one Cluster master stopped
// (SIGSTOP, no failover) under load, its breaker open and the checks
// failing it; once it runs again, the check that finds it passing probes
// its breaker at once, as the check that finds the whole store back
// does, so its keys leave the failure policy with the check, not up to
// ProbeInterval (1s, plus a quarter) later: measured through `sluice
// serve`, the breaker closed 1.05s after the check found the master back.
func TestFaultClusterMasterBackProbedAtOnce(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{NodeTimeout: 30 * time.Second, Args: []string{"--cluster-require-full-coverage", "no"}})
	srv, p, logs := serveChecked(t, cl.URL())
	stopped := cl.MasterOf(t, redisHashTag(t, "api", apiLimit, "k"))
	stop := keepCalling(2, 2*time.Millisecond, func(int) { sendKey(p, "api", "k") })
	time.Sleep(200 * time.Millisecond)
	resume := pauseMaster(t, stopped)
	logged(t, logs, "resilient: breaker open", "partition="+stopped.Addr)
	srv.health.watchOnce(time.Second)
	if st := srv.health.Status(); !slices.Contains(st.FailingMasters, stopped.Addr) || !slices.Contains(st.OpenPartitions, stopped.Addr) {
		t.Fatalf("master %s stopped and checked: failing %v, open %v; want it in both", stopped.Addr, st.FailingMasters, st.OpenPartitions)
	}
	stop()
	// A probe fails just before the master runs again: its breaker is
	// open for another ProbeInterval, whatever the load's probes did.
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	srv.health.breakerNow(ctx)
	if st := srv.health.Status(); !slices.Contains(st.OpenPartitions, stopped.Addr) {
		t.Fatalf("master %s stopped and probed: open %v, want it", stopped.Addr, st.OpenPartitions)
	}
	resume()
	srv.health.watchOnce(time.Second)
	st := srv.health.Status()
	if len(st.FailingMasters) > 0 || len(st.OpenPartitions) > 0 || st.Degraded {
		t.Errorf("the check after the master ran again: failing %v, open %v, degraded %v (%q); want none, its breaker probed at once:\n%s",
			st.FailingMasters, st.OpenPartitions, st.Degraded, st.Reasons, logs.String())
	}
}

// TestFaultClusterMasterOOMToldOnce: one Cluster master of three over its
// maxmemory (noeviction) under load. Its checks fail (cause oom) and its
// breaker opens: its keys' failed calls are that master's failure, not
// a partial failure of their own, which before was a second ERROR line at
// the start and, its cause permanent, kept the instance degraded for 10s
// after the master took writes again (9s through `sluice serve`).
func TestFaultClusterMasterOOMToldOnce(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, nil)
	srv, p, logs := serveChecked(t, cl.URL())
	full := cl.MasterOf(t, redisHashTag(t, "api", apiLimit, "k0"))
	admin := redis.NewClient(&redis.Options{Addr: full.Addr})
	defer admin.Close()
	ctx := context.Background()
	stop := keepCalling(2, 2*time.Millisecond, func(w int) {
		for i := range 6 {
			sendKey(p, "api", fmt.Sprint("k", w*6+i))
		}
	})
	defer stop()
	time.Sleep(200 * time.Millisecond)
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, logs, "Redis Cluster master failing the service's checks", "node="+full.Addr, "cause=oom")
	logged(t, logs, "resilient: breaker open", "partition="+full.Addr)
	time.Sleep(time.Second) // its keys' calls go on failing, its breaker's probes too
	if err := admin.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	srv.health.watchOnce(time.Second)
	st := srv.health.Status()
	if len(st.FailingMasters) > 0 || len(st.OpenPartitions) > 0 || st.Degraded {
		t.Errorf("the check after the master took writes again: failing %v, open %v, degraded %v (%q); want none:\n%s",
			st.FailingMasters, st.OpenPartitions, st.Degraded, st.Reasons, logs.String())
	}
	if n := countLines(logs, "store calls failing while the breaker is closed"); n != 0 {
		t.Errorf("%d partial failure lines for one master's OOM, want none (the master's own line tells it):\n%s", n, logs.String())
	}
}

// TestFaultClusterMasterBackWithBreaker: one Cluster master stopped under
// load, failing the checks, then running again: the load's probes close
// its breaker, and the status stops naming it as failing the checks at
// once, not at the watch's next check (an hour here).
func TestFaultClusterMasterBackWithBreaker(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{NodeTimeout: 30 * time.Second, Args: []string{"--cluster-require-full-coverage", "no"}})
	srv, p, logs := serveChecked(t, cl.URL())
	stopped := cl.MasterOf(t, redisHashTag(t, "api", apiLimit, "k"))
	stop := keepCalling(2, 2*time.Millisecond, func(int) { sendKey(p, "api", "k") })
	defer stop()
	time.Sleep(200 * time.Millisecond)
	resume := pauseMaster(t, stopped)
	logged(t, logs, "resilient: breaker open", "partition="+stopped.Addr)
	srv.health.watchOnce(time.Second)
	if st := srv.health.Status(); !slices.Contains(st.FailingMasters, stopped.Addr) {
		t.Fatalf("master %s stopped and checked: failing %v, want it", stopped.Addr, st.FailingMasters)
	}
	resume()
	logged(t, logs, "resilient: breaker closed", "partition="+stopped.Addr)
	closed := time.Now()
	for {
		st := srv.health.Status()
		if len(st.FailingMasters) == 0 && len(st.OpenPartitions) == 0 && !st.Degraded {
			break
		}
		if time.Since(closed) > 500*time.Millisecond {
			t.Fatalf("500ms after the master's breaker closed: failing %v, open %v, degraded %v (%q); want none:\n%s",
				st.FailingMasters, st.OpenPartitions, st.Degraded, st.Reasons, logs.String())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if n := countLines(logs, "Redis Cluster master passes the service's checks again"); n != 1 {
		t.Errorf("%d lines of the master passing again, want 1:\n%s", n, logs.String())
	}
}

// apiLimit is the limit of policy api in the services serveChecked
// starts: one no load reaches.
const apiLimit = "fixed_window 1000000000/1h"

// serveChecked runs the service on redisURL with policy api (apiLimit)
// under the local failure policy and a 50ms decision timeout, its watch
// never checking in a test's span: the test runs the checks it means to.
func serveChecked(t *testing.T, redisURL string) (*Server, *proc, *syncBuffer) {
	t.Helper()
	config := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: "+apiLimit+"\n")
	fp, _, err := ParseFailurePolicy("local")
	if err != nil {
		t.Fatal(err)
	}
	logs := new(syncBuffer)
	srv := runServer(t, Options{ConfigFile: config, RedisURL: redisURL, FailurePolicy: fp, StoreCheckInterval: time.Hour,
		DecisionTimeout: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))})
	return srv, &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}, logs
}

// pauseMaster stops n (SIGSTOP) and returns what runs it again; the test's
// end runs it again if the test did not.
func pauseMaster(t *testing.T, n *redistest.Node) (resume func()) {
	n.Pause(t)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			n.Resume(t)
		}
	})
	return func() {
		n.Resume(t)
		resumed = true
	}
}
