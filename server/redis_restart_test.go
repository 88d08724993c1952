package server

import (
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestServerRedisRestartTold: a Redis that restarts (here without
// persistence, so that it comes back empty and every limit starts afresh)
// is one WARN line naming the node, and sluice_redis_restarts_total counts
// it. Before, at most the outage's "store lost" and "store back" were
// logged, and a restart quicker than the health checks not even those.
func TestServerRedisRestartTold(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "local", &logs) // a poll every 50 ms
	logged(t, &logs, "Redis checked")
	metric := `sluice_redis_restarts_total{node="` + r.Addr + `"}`
	if got := scrapedMetric(t, p, metric); got != "0" {
		t.Fatalf("%s = %q before any restart, want 0", metric, got)
	}
	r.Stop()
	r.Start(t)
	logged(t, &logs, "Redis restarted", "level=WARN", "node="+r.Addr, "aof_enabled=0", "appendonly yes keeps them")
	time.Sleep(200 * time.Millisecond) // a few more polls: still one line
	if n := countLines(&logs, "Redis restarted"); n != 1 {
		t.Errorf("%d lines for one restart, want 1:\n%s", n, logs.String())
	}
	if got := scrapedMetric(t, p, metric); got != "1" {
		t.Errorf("%s = %q after one restart, want 1", metric, got)
	}
}

// TestRedisRestartNotFailover: a new run_id on a server that has run since
// before the last read is another server under the node's name (a
// Sentinel's new master), not a restart; a node read for the first time
// is not one either.
func TestRedisRestartNotFailover(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	w := newEvictionWatch(slog.New(slog.NewTextHandler(&logs, nil)), 50*time.Millisecond)
	at := time.Now()
	read := func(id string, up int, after time.Duration) {
		at = at.Add(after)
		w.observe("master", map[string]string{"evicted_keys": "0", "run_id": id, "uptime_in_seconds": itoa(int64(up))}, at)
	}
	read("a", 100, 0)
	read("a", 100, time.Second)
	read("b", 5000, time.Second) // a replica promoted
	if n, _ := w.restarts("master"); n != 0 || logs.String() != "" {
		t.Fatalf("a failover counted as %d restarts:\n%s", n, logs.String())
	}
	read("c", 3, 5*time.Second) // started 3 s ago, after the last read
	if n, _ := w.restarts("master"); n != 1 {
		t.Errorf("restarts = %d after a restart, want 1:\n%s", n, logs.String())
	}
}
