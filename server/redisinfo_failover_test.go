package server

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// A Sentinel failover puts another server under the node's name; its
// evicted_keys, counted since its own start (evictions of long ago, while
// it was master before), are not evictions since the last read: no
// episode. Evictions on it after that still start one.
func TestEvictionWatchFailoverIsNotEviction(t *testing.T) {
	var buf bytes.Buffer
	w := newEvictionWatch(slog.New(slog.NewTextHandler(&buf, nil)), time.Second)
	now := time.Now()
	info := func(id, evicted, uptime string) map[string]string {
		return map[string]string{"run_id": id, "evicted_keys": evicted, "uptime_in_seconds": uptime,
			"maxmemory_policy": "noeviction", "maxmemory": "0"}
	}
	w.observe("master", info("a", "0", "600"), now)
	w.observe("master", info("a", "0", "601"), now.Add(time.Second))
	// The failover: b has been up for an hour and evicted 51637 keys once.
	w.observe("master", info("b", "51637", "3600"), now.Add(2*time.Second))
	w.observe("master", info("b", "51637", "3601"), now.Add(3*time.Second))
	if strings.Contains(buf.String(), "evicting keys") {
		t.Fatalf("a failover to a server that evicted long ago read as evictions:\n%s", buf.String())
	}
	w.observe("master", info("b", "51640", "3602"), now.Add(4*time.Second))
	if !strings.Contains(buf.String(), "Redis evicting keys") || !strings.Contains(buf.String(), "evicted=3 ") {
		t.Fatalf("3 evictions on the new master not told:\n%s", buf.String())
	}
}

// After a restart or a CONFIG RESETSTAT, every eviction in the count is
// since the last read: counted, and the sum never goes down.
func TestEvictionWatchCountsAfterRestart(t *testing.T) {
	w := newEvictionWatch(slog.New(slog.DiscardHandler), time.Second)
	now := time.Now()
	info := func(id, evicted, uptime string) map[string]string {
		return map[string]string{"run_id": id, "evicted_keys": evicted, "uptime_in_seconds": uptime}
	}
	w.observe("n", info("a", "100", "600"), now)
	w.observe("n", info("a", "110", "601"), now.Add(time.Second)) // +10
	w.observe("n", info("b", "4", "0"), now.Add(2*time.Second))   // restarted: +4
	w.observe("n", info("b", "2", "1"), now.Add(3*time.Second))   // CONFIG RESETSTAT: +2
	if got := w.counts("n").evicted; got != 16 {
		t.Errorf("evicted %d, want 16", got)
	}
}

// sluice_redis_evicted_keys_total counts the evictions this instance saw,
// not INFO's evicted_keys of whichever server is now the node: a Sentinel
// failover to a server that evicted long ago adds nothing (the shipped
// alert, increase(...) > 0, stayed quiet), its new evictions add, and the
// switch back neither adds nor takes away. Real servers, read as one
// Sentinel-managed node ("master").
func TestRedisEvictedCounterAcrossServers(t *testing.T) {
	ctx := context.Background()
	old := redistest.StartServer(t) // the replica promoted, up the longest
	oldAdmin := old.Client(t)
	evict := func(c *redis.Client) int64 { // evictions Redis made, its total after
		t.Helper()
		evicted := func() int64 {
			raw, err := c.Info(ctx, "stats").Result()
			if err != nil {
				t.Fatal(err)
			}
			n, _ := strconv.ParseInt(parseInfo(raw)["evicted_keys"], 10, 64)
			return n
		}
		before := evicted()
		raw, err := c.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		used, _ := strconv.ParseInt(parseInfo(raw)["used_memory"], 10, 64)
		for _, kv := range [][2]string{{"maxmemory", strconv.FormatInt(used+2<<20, 10)}, {"maxmemory-policy", "allkeys-lru"}} {
			if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
		value := strings.Repeat("x", 10<<10)
		for round := 0; evicted() == before; round++ {
			if round > 100 {
				t.Fatal("Redis evicted nothing after 100 MB")
			}
			pipe := c.Pipeline()
			for i := range 100 {
				pipe.Set(ctx, fmt.Sprintf("fill:%d:%d", round, i), value, 0)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				t.Fatal(err)
			}
		}
		for _, kv := range [][2]string{{"maxmemory-policy", "noeviction"}, {"maxmemory", "0"}} {
			if err := c.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
				t.Fatal(err)
			}
		}
		return evicted()
	}
	oldTotal := evict(oldAdmin)
	time.Sleep(2 * time.Second) // older than the reads below: not a restart
	cur := redistest.StartServer(t)
	curAdmin := cur.Client(t)

	var logs syncBuffer
	c := newRedisInfo(nil, 0)
	c.evictions = newEvictionWatch(slog.New(slog.NewTextHandler(&logs, nil)), 50*time.Millisecond)
	read := func(from *redis.Client) float64 { // a scrape with "master" on from
		t.Helper()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(collectorFunc(func(ch chan<- prometheus.Metric) {
			c.collectNode(ctx, ch, from, "master")
		}))
		return metricValue(t, reg, "sluice_redis_evicted_keys_total", map[string]string{"node": "master"})
	}
	if got := read(curAdmin); got != 0 {
		t.Fatalf("first read: %v, want 0", got)
	}
	read(curAdmin)
	// The failover: the old server, with oldTotal evictions of its own past.
	if got := read(oldAdmin); got != 0 {
		t.Errorf("after a failover to a server that evicted %d keys long ago: %v, want 0", oldTotal, got)
	}
	if strings.Contains(logs.String(), "evicting keys") {
		t.Errorf("a failover read as evictions:\n%s", logs.String())
	}
	// Evictions on it now count.
	grown := evict(oldAdmin) - oldTotal
	if got := read(oldAdmin); got != float64(grown) {
		t.Errorf("after %d evictions on the new master: %v", grown, got)
	}
	logged(t, &logs, "Redis evicting keys", "evicted="+strconv.FormatInt(grown, 10)+" ")
	// And back: the counter holds.
	if got := read(curAdmin); got != float64(grown) {
		t.Errorf("after failing back: %v, want %d still", got, grown)
	}
}

// collectorFunc is a prometheus.Collector of unchecked metrics.
type collectorFunc func(ch chan<- prometheus.Metric)

func (collectorFunc) Describe(chan<- *prometheus.Desc)      {}
func (f collectorFunc) Collect(ch chan<- prometheus.Metric) { f(ch) }

// A scrape's INFO asked for just before a restart and observed after the
// watch's read of the restarted server is past news: it used to set the
// old run_id back, and the next read counted the restart a second time.
func TestLateReadCountsNoSecondRestart(t *testing.T) {
	w := newEvictionWatch(slog.New(slog.DiscardHandler), time.Second)
	now := time.Now()
	info := func(id, uptime string) map[string]string {
		return map[string]string{"run_id": id, "evicted_keys": "0", "uptime_in_seconds": uptime}
	}
	w.observe("n", info("a", "600"), now)
	w.observe("n", info("b", "0"), now.Add(2*time.Second))           // the watch: restarted
	w.observe("n", info("a", "601"), now.Add(1900*time.Millisecond)) // the scrape, asked before, observed late
	w.observe("n", info("b", "1"), now.Add(3*time.Second))
	if got := w.counts("n").restarts; got != 1 {
		t.Errorf("restarts %d, want 1", got)
	}
}
