package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultServeClusterMasterStopped: one master of three stops (SIGSTOP,
// the cluster left serving the other slots). Its own breaker opens: its
// keys are answered by the failure policy, the other masters' keys by
// Redis, and /v1/status says so, degraded, naming the master, while the
// instance stays ready and the store up (the checks that fail on that
// master are not the store lost). Once the master is back, every key decides on
// Redis and no master is named.
func TestFaultServeClusterMasterStopped(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Args: []string{"--cluster-require-full-coverage", "no"}})
	const limit = "fixed_window 1000000000/1h"
	config := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: "+limit+"\n")
	p := startSluice(t, nil, "--config", config, "--redis", cl.URL(), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
		"--failure-policy", "local", "--decision-timeout", "50ms", "--watch-interval", "200ms")
	// Each key's master, read before one stops: a stopped master is soon
	// marked failed, and the cluster then names no master of its slots.
	masters := map[int]string{}
	for i := range 30 {
		masters[i] = cl.MasterOf(t, redisHashTag(t, "api", limit, fmt.Sprint("k", i))).Addr
	}
	master := func(i int) string { return masters[i] }
	// source checks every key once and returns who answered each master's keys.
	source := func() map[string]map[string]bool {
		by := map[string]map[string]bool{}
		for i := range 30 {
			_, body := p.post(t, "/v1/check", fmt.Sprintf(`{"policy":"api","key":"k%d"}`, i))
			m := master(i)
			if by[m] == nil {
				by[m] = map[string]bool{}
			}
			by[m][fmt.Sprint(body["source"])] = true
		}
		return by
	}
	source()
	stopped := cl.MasterOf(t, redisHashTag(t, "api", limit, "k0"))
	stopped.Pause(t)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			stopped.Resume(t)
		}
	})
	var st map[string]any
	for deadline := time.Now().Add(15 * time.Second); ; {
		source()
		_, st = p.getJSON(t, "/v1/status")
		if fmt.Sprint(st["open_partitions"]) == "["+stopped.Addr+"]" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("one master stopped for 15s under load: status %v, want its breaker open", st)
		}
	}
	// It stays so under load, the service's checks of Redis (a ping goes
	// to a random master) notwithstanding: the store is not lost.
	for range 15 {
		source()
		time.Sleep(200 * time.Millisecond)
	}
	_, st = p.getJSON(t, "/v1/status")
	if st["fallback_active"] != false || fmt.Sprint(st["store"].(map[string]any)["up"]) != "true" {
		t.Errorf("status %v after 3s: want the store up and fallback_active false, one master's keys on the fallback", st)
	}
	if st["degraded"] != true || st["ready"] != true || !strings.Contains(fmt.Sprint(st["reasons"]), "the breaker of Redis Cluster master "+stopped.Addr+" is open") {
		t.Errorf("status %v: want ready, degraded, the master named in a reason", st)
	}
	for m, srcs := range source() {
		want := "<nil>" // the store itself: no source in the answer
		if m == stopped.Addr {
			want = "fallback"
		}
		if len(srcs) != 1 || !srcs[want] {
			t.Errorf("keys on %s answered by %v, want %s only", m, srcs, want)
		}
	}
	p.expect(t, "resilient: breaker open")

	stopped.Resume(t)
	resumed = true
	c := redis.NewClient(&redis.Options{Addr: stopped.Addr})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(15 * time.Second); ; {
		_, st = p.getJSON(t, "/v1/status")
		if st["open_partitions"] == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("master back for 15s: status %v, want no master named", st)
		}
		time.Sleep(100 * time.Millisecond)
	}
	for m, srcs := range source() {
		if len(srcs) != 1 || !srcs["<nil>"] {
			t.Errorf("keys on %s answered by %v after recovery, want Redis", m, srcs)
		}
	}
	// Each master's appendonly warning was logged once, at start: the
	// checks the stopped master failed neither cleared its warning nor
	// repeated the others'.
	logs := p.stderr.String()
	for m := range source() {
		if n := strings.Count(logs, "node "+m+": appendonly no"); n != 1 {
			t.Errorf("master %s's appendonly warning logged %d times, want once:\n%s", m, n, logs)
		}
	}
	if strings.Contains(logs, "warnings cleared") {
		t.Errorf("a warning cleared while its master was only unasked:\n%s", logs)
	}
}

// TestCheckWarningsLog: a full check logs each warning once while it
// stays; a check some Cluster master failed neither clears that master's
// warnings nor repeats the others'; a complete one tells those gone.
func TestCheckWarningsLog(t *testing.T) {
	var logs syncBuffer
	l := slog.New(slog.NewTextHandler(&logs, nil))
	var w checkWarnings
	a, b := errors.New("node a: appendonly no"), errors.New("node b: appendonly no")
	w.log(l, []error{a, b}, true) // start
	w.log(l, []error{a}, false)   // b unasked
	w.log(l, []error{a}, false)   // again
	w.log(l, []error{a, b}, true) // b back
	if got := strings.Count(logs.String(), "node a: appendonly no"); got != 1 {
		t.Errorf("a logged %d times, want 1:\n%s", got, logs.String())
	}
	if got := strings.Count(logs.String(), "node b: appendonly no"); got != 1 || strings.Contains(logs.String(), "cleared") {
		t.Errorf("b logged %d times, want 1, never cleared:\n%s", got, logs.String())
	}
	w.log(l, []error{b}, true) // a's setting fixed
	if !strings.Contains(logs.String(), `msg="Redis check: warnings cleared" were="node a: appendonly no"`) {
		t.Errorf("a's warning gone while b's stays: want a line naming a:\n%s", logs.String())
	}
}

// TestFaultServeClusterMasterStoppedIdle: one master of three stops
// (SIGSTOP), the one that holds the key the service's check of Redis once
// used alone, with no traffic on any key, so that no breaker tells it.
// Under the default policy and under error (no breaker at all), the
// instance stays ready with the store up, degraded, /v1/status and
// /readyz naming the master, sluice_store_node_up 0 for it, and a key on
// another master decides on Redis; once it continues, the partial failure
// clears.
func TestFaultServeClusterMasterStoppedIdle(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Args: []string{"--cluster-require-full-coverage", "no"}})
	const limit = "fixed_window 1000000000/1h"
	config := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: "+limit+"\n")
	policies := []string{"local", "error"}
	procs := map[string]*proc{}
	for _, policy := range policies {
		procs[policy] = startSluice(t, nil, "--config", config, "--redis", cl.URL(), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
			"--failure-policy", policy, "--decision-timeout", "50ms", "--watch-interval", "200ms")
	}
	stopped := cl.MasterOf(t, "sluice:check")
	live := ""
	for i := 0; live == ""; i++ {
		if k := fmt.Sprint("k", i); cl.MasterOf(t, redisHashTag(t, "api", limit, k)) != stopped {
			live = k
		}
	}
	stopped.Pause(t)
	resumed := false
	t.Cleanup(func() {
		if !resumed {
			stopped.Resume(t)
		}
	})
	named := "Redis Cluster master " + stopped.Addr + " fails the service's checks"
	for _, policy := range policies {
		p := procs[policy]
		var st map[string]any
		for deadline := time.Now().Add(5 * time.Second); ; {
			_, st = p.getJSON(t, "/v1/status")
			if fmt.Sprint(st["failing_masters"]) == "["+stopped.Addr+"]" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: one master stopped for 5s: status %v, want it in failing_masters", policy, st)
			}
			time.Sleep(100 * time.Millisecond)
		}
		r := p.expect(t, "Redis Cluster master failing the service's checks: its keys' calls fail, the other masters' decide on Redis")
		if r["node"] != stopped.Addr {
			t.Errorf("%s: failing line %v, want node=%s", policy, r, stopped.Addr)
		}
		if got := scrapedMetric(t, p, `sluice_store_node_up{node="`+stopped.Addr+`"}`); got != "0" {
			t.Errorf("%s: sluice_store_node_up for the stopped master %q, want 0", policy, got)
		}
	}
	// It stays so: the store is not lost, nor the instance unready.
	for range 4 {
		time.Sleep(300 * time.Millisecond)
		for _, policy := range policies {
			p := procs[policy]
			_, st := p.getJSON(t, "/v1/status")
			if st["ready"] != true || st["degraded"] != true || fmt.Sprint(st["store"].(map[string]any)["up"]) != "true" ||
				fmt.Sprint(st["failing_masters"]) != "["+stopped.Addr+"]" || !strings.Contains(fmt.Sprint(st["reasons"]), named) {
				t.Fatalf("%s: status %v with one master stopped: want ready, degraded, the store up, the master named", policy, st)
			}
			if code, body := p.get(t, "/readyz"); code != 200 || !strings.Contains(body, named) {
				t.Errorf("%s: /readyz %d %q, want 200 naming the master", policy, code, body)
			}
		}
	}
	for _, policy := range policies {
		if code, body := procs[policy].post(t, "/v1/check", `{"policy":"api","key":"`+live+`"}`); code != 200 || body["source"] != nil {
			t.Errorf("%s: a key on a live master: %d %v, want decided on Redis", policy, code, body)
		}
	}

	stopped.Resume(t)
	resumed = true
	for _, policy := range policies {
		p := procs[policy]
		var st map[string]any
		for deadline := time.Now().Add(5 * time.Second); ; {
			_, st = p.getJSON(t, "/v1/status")
			if st["failing_masters"] == nil && st["degraded"] == false {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: master continued for 5s: status %v, want none failing, not degraded", policy, st)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if r := p.expect(t, "Redis Cluster master passes the service's checks again"); r["node"] != stopped.Addr {
			t.Errorf("%s: back line %v, want node=%s", policy, r, stopped.Addr)
		}
		if got := scrapedMetric(t, p, `sluice_store_node_up{node="`+stopped.Addr+`"}`); got != "1" {
			t.Errorf("%s: sluice_store_node_up after the master continued %q, want 1", policy, got)
		}
	}
}

// TestFaultServeClusterPlannedFailoverNodeUp: after a planned failover
// (CLUSTER FAILOVER on a replica, which fails no call), sluice_store_node_up
// names the promoted master, and no longer the demoted one, within a few
// checks, not at the next full check a minute on.
func TestFaultServeClusterPlannedFailoverNodeUp(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	config := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: 100/s\n")
	p := startSluice(t, nil, "--config", config, "--redis", cl.URL(), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
		"--watch-interval", "200ms")
	old := cl.MasterOf(t, "sluice:check")
	if got := scrapedMetric(t, p, `sluice_store_node_up{node="`+old.Addr+`"}`); got != "1" {
		t.Fatalf("sluice_store_node_up for master %s: %q, want 1", old.Addr, got)
	}
	replica := cl.ReplicasOf(t, old)[0]
	rc := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer rc.Close()
	if err := rc.ClusterFailover(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(8 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		promoted := scrapedMetric(t, p, `sluice_store_node_up{node="`+replica.Addr+`"}`)
		demoted := scrapedMetric(t, p, `sluice_store_node_up{node="`+old.Addr+`"}`)
		if promoted == "1" && demoted == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("8s after CLUSTER FAILOVER: sluice_store_node_up promoted %s %q, demoted %s %q; want 1 and no series", replica.Addr, promoted, old.Addr, demoted)
		}
	}
	// The failover is counted once, by the check that saw it or a call's look.
	for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got := scrapedMetric(t, p, `sluice_redis_failovers_total{kind="cluster"}`)
		if got == "1" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sluice_redis_failovers_total{kind=\"cluster\"} = %q after CLUSTER FAILOVER, want 1", got)
		}
	}
}

// TestFaultServeStartsWithClusterMasterStopped: one master of three
// stopped (SIGSTOP) before the start. The start's check gives each master
// redisstore.CheckMasterTimeout (it waited its whole 5s for that master);
// its access check and its warm-up then give the masters a second each,
// not another 5s each, since the others answer in milliseconds and the
// watch checks every master from then on. The instance starts, the
// master named.
func TestFaultServeStartsWithClusterMasterStopped(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Args: []string{"--cluster-require-full-coverage", "no"}})
	stopped := cl.MasterOf(t, "k")
	stopped.Pause(t)
	t.Cleanup(func() { stopped.Resume(t) })
	start := time.Now()
	p := startSluice(t, nil, "--redis", cl.URL(), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "200ms")
	took := time.Since(start)
	t.Logf("started %v after its launch", took.Round(time.Millisecond))
	// The check's bound per master, a second for redisstore.WatchDials (its slot map
	// reload may ask the stopped master first), then partialStartTimeout
	// twice, with 2.5s to spare for a busy machine: the check's or either
	// step's full 5s would pass it.
	if most := redisstore.CheckMasterTimeout + time.Second + 2*partialStartTimeout + 2500*time.Millisecond; took > most {
		t.Errorf("started %v after its launch with one master stopped, want at most %v", took.Round(time.Millisecond), most)
	}
	if _, st := p.getJSON(t, "/v1/status"); !strings.Contains(fmt.Sprint(st["reasons"]), stopped.Addr) {
		t.Errorf("status %v: want the stopped master named", st)
	}
}

// TestFaultServeClusterEveryBreakerOpen: every master of three stops
// (SIGSTOP) while the service's checks, an hour apart, have not found the
// store lost: each master's breaker opens, and once all are open the
// failure policy answers every decision, which /v1/status
// (fallback_active), sluice_fallback_active and
// sluice_fallback_transitions_total say, with one line, as for the store's
// own breaker. Masters back: their breakers close and they say so again.
// Before, fallback_active stayed false throughout, and an alert on
// sluice_fallback_active missed a whole Cluster's fallback.
func TestFaultServeClusterEveryBreakerOpen(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Args: []string{"--cluster-require-full-coverage", "no"}})
	const limit = "fixed_window 1000000000/1h"
	config := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: "+limit+"\n")
	fp, _, err := ParseFailurePolicy("local")
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	srv := runServer(t, Options{ConfigFile: config, RedisURL: cl.URL(), FailurePolicy: fp, StoreCheckInterval: time.Hour,
		DecisionTimeout: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	p := &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}
	logged(t, &logs, "Redis checked")
	// Keys on every master, under load throughout.
	const keys = 30
	masters := map[string]bool{}
	for i := range keys {
		masters[cl.MasterOf(t, redisHashTag(t, "api", limit, fmt.Sprint("k", i))).Addr] = true
	}
	if len(masters) != 3 {
		t.Fatalf("%d keys on masters %v, want all three", keys, masters)
	}
	stop := keepCalling(6, 5*time.Millisecond, func(w int) {
		for i := w; i < keys; i += 6 {
			sendKey(p, "api", fmt.Sprint("k", i))
		}
	})
	defer stop()
	status := func() map[string]any {
		_, st := p.getJSON(t, "/v1/status")
		return st
	}
	if st := status(); st["fallback_active"] != false {
		t.Fatalf("status %v with every master up, want fallback_active false", st)
	}
	resumed := map[*redistest.Node]bool{}
	for _, n := range cl.Nodes {
		n.Pause(t)
	}
	t.Cleanup(func() {
		for _, n := range cl.Nodes {
			if !resumed[n] {
				n.Resume(t)
			}
		}
	})
	var st map[string]any
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st = status(); fmt.Sprint(st["open_partitions"]) == fmt.Sprint(slices.Sorted(maps.Keys(masters))) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("every master stopped for 15s under load: status %v, want every breaker open", st)
		}
	}
	st = status()
	if st["fallback_active"] != true || fmt.Sprint(st["store"].(map[string]any)["up"]) != "true" {
		t.Errorf("status %v: want fallback_active true, the store not lost (no check since the start)", st)
	}
	if !strings.Contains(fmt.Sprint(st["reasons"]), "the breakers of every Redis Cluster master") {
		t.Errorf("status reasons %v: want every master's breaker named open", st["reasons"])
	}
	for series, want := range map[string]string{"sluice_fallback_active": "1",
		`sluice_fallback_transitions_total{to="on"}`: "1", `sluice_fallback_transitions_total{to="off"}`: "0"} {
		if got := scrapedMetric(t, p, series); got != want {
			t.Errorf("%s = %q with every master's breaker open, want %s", series, got, want)
		}
	}
	logged(t, &logs, "every Redis Cluster master's breaker is open", "level=WARN", "failure_policy=local")

	// Two masters back (one alone, a minority, answers CLUSTERDOWN).
	for _, n := range cl.Nodes[:2] {
		n.Resume(t)
		resumed[n] = true
	}
	stopped := cl.Nodes[2].Addr
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if st = status(); st["fallback_active"] == false {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("two masters back for 15s under load: status %v, want fallback_active false", st)
		}
	}
	// One closed breaker is enough: the other may await its probes.
	if parts, _ := st["open_partitions"].([]any); len(parts) == 0 || len(parts) > 2 || !slices.Contains(parts, any(stopped)) {
		t.Errorf("open_partitions %v with two masters back, want %s's and at most one other", parts, stopped)
	}
	for series, want := range map[string]string{"sluice_fallback_active": "0",
		`sluice_fallback_transitions_total{to="on"}`: "1", `sluice_fallback_transitions_total{to="off"}`: "1"} {
		if got := scrapedMetric(t, p, series); got != want {
			t.Errorf("%s = %q with masters' breakers closed, want %s", series, got, want)
		}
	}
	logged(t, &logs, "not every Redis Cluster master's breaker is open any more", "level=INFO")
	if n := countLines(&logs, `msg="every Redis Cluster master's breaker is open`); n != 1 {
		t.Errorf("%d lines for one whole-Cluster fallback, want 1:\n%s", n, logs.String())
	}
}

// sendKey posts a check of key under policy to p and drops the answer.
func sendKey(p *proc, policy, key string) {
	resp, err := http.Post("http://"+p.http+"/v1/check", "application/json", strings.NewReader(`{"policy":"`+policy+`","key":"`+key+`"}`))
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}
