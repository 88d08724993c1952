package server

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFaultServeClusterMasterShuttingDown: a Cluster master shutting down
// holds writes for up to its shutdown-timeout while its (stopped) replica
// does not catch up. Once the service's checks name the shutdown, the
// reason its breaker is open names it too, on every status, rather than
// the general stall's wording (CLIENT PAUSE, a long script); and the
// checks name it on every round, not only those that end before the
// check's deadline.
func TestFaultServeClusterMasterShuttingDown(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1, NodeTimeout: 5 * time.Second,
		Args: []string{"--shutdown-timeout", "10", "--cluster-require-full-coverage", "no"}})
	const limit = "fixed_window 1000000000/1h"
	config := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: "+limit+"\n")
	fp, _, err := ParseFailurePolicy("local")
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	srv := runServer(t, Options{ConfigFile: config, RedisURL: cl.URL(), FailurePolicy: fp, StoreCheckInterval: 200 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	p := &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}
	logged(t, &logs, "Redis checked")
	master := cl.MasterOf(t, redisHashTag(t, "api", limit, "k0"))
	replica := cl.ReplicasOf(t, master)[0]
	replica.Pause(t) // its acknowledgement never comes: the shutdown waits
	t.Cleanup(func() { replica.Resume(t) })
	stop := keepCalling(2, 10*time.Millisecond, func(w int) {
		for i := range 10 {
			p.post(t, "/v1/check", fmt.Sprintf(`{"policy":"api","key":"k%d"}`, i))
		}
	})
	defer stop()
	time.Sleep(300 * time.Millisecond)
	admin := redis.NewClient(&redis.Options{Addr: master.Addr})
	defer admin.Close()
	go admin.Shutdown(context.Background()) // answers when it stops

	breaker := "the breaker of Redis Cluster master " + master.Addr + " is open"
	check := "Redis Cluster master " + master.Addr + " fails the service's checks"
	reason := func(reasons []string, prefix string) string {
		for _, r := range reasons {
			if strings.HasPrefix(r, prefix) {
				return r
			}
		}
		return ""
	}
	statusReasons := func() []string {
		_, st := p.getJSON(t, "/v1/status")
		var out []string
		if rs, ok := st["reasons"].([]any); ok {
			for _, r := range rs {
				out = append(out, fmt.Sprint(r))
			}
		}
		return out
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		rs := statusReasons()
		if strings.Contains(reason(rs, check), "shutting down") && reason(rs, breaker) != "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no check named the shutdown with the breaker open within 5s: %q", rs)
		}
	}
	for i := range 12 { // 3 s of the 10 s shutdown
		rs := statusReasons()
		for _, prefix := range []string{check, breaker} {
			if r := reason(rs, prefix); !strings.Contains(r, "shutting down") || strings.Contains(r, "CLIENT PAUSE") {
				t.Errorf("status %d: reason %q; want the shutdown named (reasons %q)", i, r, rs)
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
}
