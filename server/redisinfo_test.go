package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// gatherRedisInfo registers a collector of c in a pedantic registry (which
// checks the metrics' consistency) and gathers it.
func gatherRedisInfo(t *testing.T, c redis.UniversalClient, timeout time.Duration) prometheus.Gatherer {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newRedisInfo(c, timeout))
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	return reg
}

// nodes returns the node labels of sluice_redis_up, sorted.
func nodes(t *testing.T, g prometheus.Gatherer) []string {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() == "sluice_redis_up" {
			for _, m := range mf.GetMetric() {
				out = append(out, m.GetLabel()[0].GetValue())
			}
		}
	}
	slices.Sort(out)
	return out
}

// Redis's figures come from INFO: a script run before the scrape is
// counted, memory is reported, every cluster master answers.
func TestRedisInfo(t *testing.T) {
	ctx := context.Background()
	script := redis.NewScript("return 1")
	t.Run("standalone", func(t *testing.T) {
		c := redistest.Client(t)
		g := gatherRedisInfo(t, c, 0)
		before := metricValue(t, g, "sluice_redis_script_calls_total", map[string]string{"command": "evalsha"})
		if err := script.Run(ctx, c, []string{redistest.Prefix(t)}).Err(); err != nil {
			t.Fatal(err)
		}
		if err := script.Run(ctx, c, []string{redistest.Prefix(t)}).Err(); err != nil { // by EVALSHA now
			t.Fatal(err)
		}
		node := map[string]string{"node": c.Options().Addr}
		if got := metricValue(t, g, "sluice_redis_up", node); got != 1 {
			t.Errorf("up = %v, want 1", got)
		}
		if got := metricValue(t, g, "sluice_redis_memory_used_bytes", node); got <= 0 {
			t.Errorf("memory used = %v, want > 0", got)
		}
		if got := metricValue(t, g, "sluice_redis_memory_max_bytes", node); got < 0 {
			t.Errorf("memory max missing")
		}
		if got := metricValue(t, g, "sluice_redis_may_evict", map[string]string{"node": c.Options().Addr, "policy": "noeviction"}); got != 0 {
			t.Errorf("may evict under noeviction = %v, want 0", got)
		}
		if got := metricValue(t, g, "sluice_redis_aof_enabled", node); got != 0 { // the test servers run --appendonly no
			t.Errorf("aof enabled = %v, want 0", got)
		}
		if got := metricValue(t, g, "sluice_redis_evicted_keys_total", node); got < 0 {
			t.Errorf("evicted keys missing")
		}
		if got := metricValue(t, g, "sluice_redis_script_calls_total", map[string]string{"command": "evalsha"}); got < before+1 {
			t.Errorf("evalsha calls %v after %v and one more call", got, before)
		}
		if got := metricValue(t, g, "sluice_redis_script_seconds_total", map[string]string{"command": "evalsha"}); got <= 0 {
			t.Errorf("evalsha seconds = %v, want > 0", got)
		}
		if got := metricValue(t, g, "sluice_redis_script_seconds_per_call", map[string]string{"command": "evalsha"}); got <= 0 {
			t.Errorf("evalsha seconds per call = %v, want > 0", got)
		}
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.ClusterClient(t)
		g := gatherRedisInfo(t, c, 0)
		want := redistest.ClusterAddrs(t)
		slices.Sort(want)
		if got := nodes(t, g); !slices.Equal(got, want) {
			t.Errorf("nodes %v, want the masters %v", got, want)
		}
		for _, n := range want {
			if got := metricValue(t, g, "sluice_redis_up", map[string]string{"node": n}); got != 1 {
				t.Errorf("up{node=%s} = %v, want 1", n, got)
			}
		}
	})
	t.Run("sentinel", func(t *testing.T) {
		c, err := NewRedisClient("redis+sentinel://" + redistest.SentinelAddr(t) + "?master_name=" + redistest.SentinelMaster)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if got := metricValue(t, gatherRedisInfo(t, c, 0), "sluice_redis_up", map[string]string{"node": "master"}); got != 1 {
			t.Errorf("up{node=master} = %v, want 1", got)
		}
	})
	t.Run("down", func(t *testing.T) {
		addr := redistest.DeadAddr(t)
		c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		if got := metricValue(t, gatherRedisInfo(t, c, 0), "sluice_redis_up", map[string]string{"node": addr}); got != 0 {
			t.Errorf("up = %v, want 0", got)
		}
	})
}

// TestFaultRedisInfoStalled: a Redis that accepts connections and never
// answers holds a scrape no longer than the collector's time bound.
func TestFaultRedisInfoStalled(t *testing.T) {
	race.SkipTiming(t)
	ln := redistest.Listen(t)
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			conn, err := ln.Accept() // read nothing, answer nothing
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, conn)
			mu.Unlock()
		}
	}()
	c := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	const bound, samples = 100 * time.Millisecond, 20
	var took []time.Duration
	for range samples {
		start := time.Now()
		g := gatherRedisInfo(t, c, bound)
		took = append(took, time.Since(start))
		if got := metricValue(t, g, "sluice_redis_up", map[string]string{"node": ln.Addr().String()}); got != 0 {
			t.Errorf("up = %v, want 0", got)
		}
	}
	slices.Sort(took)
	p90, worst := took[samples*9/10-1], took[samples-1]
	t.Logf("scrapes of a stalled Redis: p90 %v, max %v (bound %v)", p90, worst, bound)
	if p90 > 2*bound || worst > 10*bound {
		t.Errorf("scrapes took p90 %v, max %v; the bound is %v", p90, worst, bound)
	}
}

// TestServerEvictionEpisode: Redis evicting keys under a running service
// (maxmemory-policy allkeys-lru set at runtime, memory full) is logged at
// once, a WARN line with the count, and only once however long the
// evictions go on; the episode's end once none has come for
// evictionQuietPolls polls, with its total. The service stays ready, and
// sluice_redis_evicted_keys_total counts them.
func TestServerEvictionEpisode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := redistest.StartServer(t)
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "local", &logs) // a poll every 50 ms
	logged(t, &logs, "Redis checked")
	admin := r.Client(t)
	used, err := admin.Info(ctx, "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	usedBytes, _ := strconv.ParseInt(parseInfo(used)["used_memory"], 10, 64)
	if err := admin.ConfigSet(ctx, "maxmemory", strconv.FormatInt(usedBytes+4<<20, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	evicted := func() int64 {
		info, err := admin.Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		n, _ := strconv.ParseInt(parseInfo(info)["evicted_keys"], 10, 64)
		return n
	}
	value := strings.Repeat("x", 10<<10)
	fill := func(round int) { // 1 MB
		pipe := admin.Pipeline()
		for i := range 100 {
			pipe.Set(ctx, fmt.Sprintf("fill:%d:%d", round, i), value, 0)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
	}
	round := 0
	for ; evicted() == 0; round++ {
		if round > 100 {
			t.Fatal("Redis evicted nothing after 100 MB")
		}
		fill(round)
	}
	// Evictions go on for 20 polls and more.
	for end := time.Now().Add(time.Second); time.Now().Before(end); round++ {
		fill(round)
		time.Sleep(20 * time.Millisecond)
	}
	line := logged(t, &logs, "Redis evicting keys", "level=WARN", "evicted=", "maxmemory_policy=allkeys-lru")
	if n := countLines(&logs, "Redis evicting keys"); n != 1 {
		t.Errorf("%d lines for one episode of evictions, want 1:\n%s", n, logs.String())
	}
	if code, body := p.get(t, "/readyz"); code != 200 {
		t.Errorf("readyz while Redis evicts: %d %s", code, body)
	}
	if got := scrapedMetric(t, p, `sluice_redis_evicted_keys_total{node="`+r.Addr+`"}`); got == "" || got == "0" {
		t.Errorf("sluice_redis_evicted_keys_total %q, want the evictions", got)
	}
	end := logged(t, &logs, "Redis no longer evicting keys", "evicted=")
	first, _ := strconv.Atoi(logValue(line, "evicted"))
	total, _ := strconv.Atoi(logValue(end, "evicted"))
	if first <= 0 || total < first || int64(total) > evicted() {
		t.Errorf("evicted %d at the start and %d in the episode; Redis counts %d:\n%s", first, total, evicted(), logs.String())
	}
}

// logValue returns a text log line's value for key.
func logValue(line, key string) string {
	_, v, _ := strings.Cut(line, " "+key+"=")
	v, _, _ = strings.Cut(v, " ")
	return strings.TrimSpace(v)
}

// A stopped replica (a node no master's INFO depends on) does not slow the
// scrape nor mark the masters down: the masters are those of the client's
// slot map in memory, not of a reload that asks nodes one by one and
// waited out the stopped one (1s, every master then read as down).
func TestFaultRedisInfoStoppedReplica(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1, NodeTimeout: time.Minute})
	c := cl.Client(t)
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	g := gatherRedisInfo(t, c, time.Second)
	var masters []*redistest.Node
	for _, n := range cl.Nodes {
		if len(cl.ReplicasOf(t, n)) > 0 {
			masters = append(masters, n)
		}
	}
	replica := cl.ReplicasOf(t, masters[0])[0]
	replica.Pause(t)
	defer replica.Resume(t)
	for i := range 10 {
		start := time.Now()
		for _, m := range masters {
			if got := metricValue(t, g, "sluice_redis_up", map[string]string{"node": m.Addr}); got != 1 {
				t.Errorf("scrape %d: sluice_redis_up{node=%s} = %v with only a replica stopped, want 1", i, m.Addr, got)
			}
		}
		if took := time.Since(start); took > 500*time.Millisecond {
			t.Errorf("scrape %d took %v with only a replica stopped", i, took)
		}
	}
}

// A marker found gone under allkeys-* after evictions that a scrape saw
// first is evictions, however late the watch's next look comes: evictions
// seen since the marker was last there. None since: a flush.
func TestMarkerEvictedSeenByScrapeFirst(t *testing.T) {
	var logs syncBuffer
	w := newEvictionWatch(slog.New(slog.NewTextHandler(&logs, nil)), time.Second)
	t0 := time.Unix(1_800_000_000, 0)
	info := func(evicted int) map[string]string {
		return map[string]string{"evicted_keys": strconv.Itoa(evicted), "run_id": "r1", "uptime_in_seconds": "100", "maxmemory_policy": "allkeys-lru"}
	}
	look := func(found string, evicted int, at time.Time) {
		w.observe("n", info(evicted), at)
		set := redis.NewStatusCmd(context.Background())
		set.SetVal(found)
		w.marker("n", "sluice:marker", "mine", set, info(evicted), at, at)
	}
	look("a", 0, t0)
	look("a", 0, t0.Add(time.Second))
	w.observe("n", info(5), t0.Add(1500*time.Millisecond)) // a scrape sees the evictions
	look("b", 5, t0.Add(4500*time.Millisecond))            // the watch's next look, 3 s late
	if n := w.nodes["n"].flushes; n != 0 {
		t.Errorf("%d flushes told for a marker evicted, want 0:\n%s", n, logs.String())
	}
	look("c", 5, t0.Add(5500*time.Millisecond)) // gone again, nothing evicted since
	if n := w.nodes["n"].flushes; n != 1 {
		t.Errorf("%d flushes told for a marker gone with no evictions since its last look, want 1:\n%s", n, logs.String())
	}
}
