package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFaultServeClusterFailover: `sluice serve` on a 3-master cluster with
// a replica each, failure policy "error" so that every answer is Redis's;
// the hot key's master is killed under load through the JSON API, and
// decisions succeed again within 3 s of its replica's promotion.
func TestFaultServeClusterFailover(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	serveUnderFailover(t, cl.URL(), "cluster", func(call func(context.Context, string) (int64, error)) (func(), func() time.Time) {
		master := cl.MasterOf(t, redisHashTag(t, "hot", "fixed_window 1000000000/1h", "k"))
		return master.Kill, func() time.Time {
			_, at := cl.AwaitMaster(t, 10*time.Second, cl.ReplicasOf(t, master)...)
			return at
		}
	})
}

// TestFaultServeSentinelFailover: the same through Sentinel: one master,
// one replica, three Sentinels (quorum 2).
func TestFaultServeSentinelFailover(t *testing.T) {
	race.SkipTiming(t)
	set := redistest.StartSentinel(t, nil)
	serveUnderFailover(t, set.URL(), "sentinel", func(func(context.Context, string) (int64, error)) (func(), func() time.Time) {
		return set.Master.Kill, func() time.Time {
			_, at := set.AwaitMaster(t, 10*time.Second, set.Replicas...)
			return at
		}
	})
}

// serveUnderFailover runs `sluice serve` on redisURL with one policy that
// never denies during the test and failure policy "error", and runs
// redistest.UnderFailover through its JSON API. master returns how to kill
// the hot key's master and how to wait for the promotion; it may call the
// API first to find the master. The failover must be counted under kind.
func serveUnderFailover(t *testing.T, redisURL, kind string, master func(call func(context.Context, string) (int64, error)) (kill func(), promoted func() time.Time)) {
	t.Helper()
	config := writeConfig(t, "domain: failover\npolicies:\n  - name: hot\n    limit: fixed_window 1000000000/1h\n")
	p := startSluice(t, nil, "--config", config, "--redis", redisURL, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
		"--failure-policy", "error", "--decision-timeout", redistest.FailoverCallTimeout.String(), "--watch-interval", "0")
	client := &http.Client{Timeout: 5 * time.Second}
	call := func(ctx context.Context, path string) (int64, error) {
		body := bytes.NewBufferString(`{"policy":"hot","key":"k"}`)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.http+path, body)
		if err != nil {
			return 0, err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			return 0, err
		}
		defer resp.Body.Close()
		var r checkResponse
		if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || resp.StatusCode != http.StatusOK {
			return 0, fmt.Errorf("%s: %s %v", path, resp.Status, err)
		}
		return r.Limit - r.Remaining, nil
	}
	kill, promoted := master(call)
	redistest.UnderFailover(t, redistest.Failover{
		Take: func(ctx context.Context) (int64, error) {
			// The service bounds the call itself; a little more here, so
			// that its answer, not this deadline, ends each call.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*redistest.FailoverCallTimeout)
			defer cancel()
			return call(ctx, "/v1/check")
		},
		Counted:  func() (int64, error) { return call(context.Background(), "/v1/peek") },
		Fail:     kill,
		Promoted: promoted,
	})
	series := `sluice_redis_failovers_total{kind="` + kind + `"}`
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		got := scrapedMetric(t, p, series)
		if got != "" && got != "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s = %q after the failover, want at least 1", series, got)
		}
	}
}

// TestFaultServeClusterNodeDown: one master of three dies and stays dead
// (no replica, the cluster left serving the other slots): its keys' calls
// fail while the others succeed, so the store's breaker stays closed (that
// master's own opens) and the failure policy answers only those keys.
// `sluice serve` must say it is degraded (the status's reason, the log
// line) rather than look healthy.
func TestFaultServeClusterNodeDown(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, nil)
	for _, n := range cl.Nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr})
		if err := c.ConfigSet(context.Background(), "cluster-require-full-coverage", "no").Err(); err != nil {
			t.Fatal(err)
		}
		c.Close()
	}
	config := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: fixed_window 1000000000/1h\n")
	p := startSluice(t, nil, "--config", config, "--redis", cl.URL(), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
		"--failure-policy", "local", "--decision-timeout", "50ms", "--watch-interval", "0")
	load := func() {
		for i := range 30 {
			p.post(t, "/v1/check", fmt.Sprintf(`{"policy":"api","key":"k%d"}`, i))
		}
	}
	load()
	if _, st := p.getJSON(t, "/v1/status"); st["degraded"] != false {
		t.Fatalf("before: status %v, want not degraded", st)
	}
	cl.MasterOf(t, redisHashTag(t, "api", "fixed_window 1000000000/1h", "k0")).Kill()
	deadline := time.Now().Add(10 * time.Second)
	for {
		load()
		_, st := p.getJSON(t, "/v1/status")
		if st["degraded"] == true {
			if st["fallback_active"] == true {
				t.Fatalf("status %v: the breaker opened; want it closed, the other masters answering", st)
			}
			if fmt.Sprint(st["reasons"]) == "[]" {
				t.Errorf("status %v: degraded without a reason", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("one master dead for 10s under load: status %v, want degraded", st)
		}
	}
	p.expectAny(t, "store calls failing while the breaker is closed: the failure policy answers them (part of the store down, such as a Cluster node?)",
		"resilient: breaker open")
}
