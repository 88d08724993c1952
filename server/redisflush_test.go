package server

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestServerRedisFlushTold: FLUSHALL under a running service, which starts
// every limit afresh and which Redis reports nowhere, is one WARN line
// naming the node, and sluice_redis_flushes_total counts it, on every
// instance (the second finds the marker the first wrote again); a restart
// after it is told as a restart only. Before, nothing was told.
func TestServerRedisFlushTold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := redistest.StartServer(t)
	admin := r.Client(t)
	var logs1, logs2 syncBuffer
	_, p1 := startOnRedis(t, "redis://"+r.Addr, "local", &logs1) // a poll every 50 ms
	_, p2 := startOnRedis(t, "redis://"+r.Addr, "local", &logs2)
	metric := `sluice_redis_flushes_total{node="` + r.Addr + `"}`
	if !eventually(func() bool { return admin.Exists(ctx, markerPrefix).Val() == 1 }) {
		t.Fatal("no marker key written")
	}
	time.Sleep(200 * time.Millisecond) // both instances have read it
	if got := scrapedMetric(t, p1, metric); got != "0" {
		t.Fatalf("%s = %q before any flush, want 0", metric, got)
	}
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i, l := range []*syncBuffer{&logs1, &logs2} {
		logged(t, l, "Redis flushed", "level=WARN", "node="+r.Addr, "every limit starts afresh")
		p := []*proc{p1, p2}[i]
		if !eventually(func() bool { return scrapedMetric(t, p, metric) == "1" }) {
			t.Errorf("instance %d: %s = %q after one flush, want 1", i+1, metric, scrapedMetric(t, p, metric))
		}
	}
	r.Stop()
	r.Start(t)
	logged(t, &logs1, "Redis restarted")
	time.Sleep(300 * time.Millisecond) // a few more polls
	for i, l := range []*syncBuffer{&logs1, &logs2} {
		if n := countLines(l, "Redis flushed"); n != 1 {
			t.Errorf("instance %d: %d flush lines after a flush and a restart, want 1:\n%s", i+1, n, l.String())
		}
	}
}

// TestServerRedisFlushToldCluster: on a Cluster every master has its own
// marker key, in one of its slots: FLUSHALL on one master is told for
// that master alone.
func TestServerRedisFlushToldCluster(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := redistest.StartCluster(t, nil)
	var logs syncBuffer
	_, p := startOnRedis(t, cl.URL(), "local", &logs)
	addrs := cl.Addrs()
	nodes := map[string]*redis.Client{}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		t.Cleanup(func() { c.Close() })
		nodes[a] = c
		if !eventually(func() bool { return len(c.Keys(ctx, markerPrefix+"*").Val()) == 1 }) {
			t.Fatalf("master %s: marker keys %q, want one", a, c.Keys(ctx, markerPrefix+"*").Val())
		}
	}
	time.Sleep(200 * time.Millisecond) // read on a few polls
	flushed := addrs[0]
	if err := nodes[flushed].FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, &logs, "Redis flushed", "node="+flushed)
	time.Sleep(200 * time.Millisecond)
	if n := countLines(&logs, "Redis flushed"); n != 1 {
		t.Errorf("%d flush lines for one master flushed, want 1:\n%s", n, logs.String())
	}
	for _, a := range addrs {
		want := "0"
		if a == flushed {
			want = "1"
		}
		if got := scrapedMetric(t, p, `sluice_redis_flushes_total{node="`+a+`"}`); got != want {
			t.Errorf("sluice_redis_flushes_total{node=%q} = %q, want %s", a, got, want)
		}
	}
}

// TestServerRedisFlushSoonAfterStartTold: a FLUSHALL before the watch's
// first poll (a second after the start, at the default interval) is told:
// the watch reads the marker at once when it starts. Before, the first
// poll found no marker read before it, wrote one, and told nothing.
func TestServerRedisFlushSoonAfterStartTold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := redistest.StartServer(t)
	admin := r.Client(t)
	fp, _, err := ParseFailurePolicy("local")
	if err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	runServer(t, Options{ConfigFile: "testdata/envoy-example.yaml", RedisURL: "redis://" + r.Addr,
		FailurePolicy: fp, StoreCheckInterval: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	time.Sleep(300 * time.Millisecond)
	if err := admin.FlushAll(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, &logs, "Redis flushed", "node="+r.Addr)
}

// TestServerRedisFlushDuringEvictions: a FLUSHALL while Redis evicts keys
// is told as a flush, not taken for an eviction of the marker key: under
// a volatile-* policy, which never evicts a key without a TTL, whatever
// was evicted; under allkeys-*, which may evict it, because INFO
// commandstats counted the FLUSHALL. The marker deleted under allkeys-*
// while keys are evicted, which no FLUSHALL or FLUSHDB explains, is left
// to the evictions: it may have been one.
func TestServerRedisFlushDuringEvictions(t *testing.T) {
	t.Parallel()
	for _, policy := range []string{"volatile-lru", "allkeys-lru"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			r := redistest.StartServer(t)
			admin := r.Client(t)
			var logs syncBuffer
			startOnRedis(t, "redis://"+r.Addr, "local", &logs) // a poll every 50 ms
			if !eventually(func() bool { return admin.Exists(ctx, markerPrefix).Val() == 1 }) {
				t.Fatal("no marker key written")
			}
			used, _ := strconv.ParseInt(parseInfo(admin.Info(ctx, "memory").Val())["used_memory"], 10, 64)
			if err := admin.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used+2<<20, 10)).Err(); err != nil {
				t.Fatal(err)
			}
			if err := admin.ConfigSet(ctx, "maxmemory-policy", policy).Err(); err != nil {
				t.Fatal(err)
			}
			// Keys with a TTL, which either policy evicts, written until
			// the end: evictions on every poll.
			stop := make(chan struct{})
			filled := make(chan struct{})
			go func() {
				defer close(filled)
				value := strings.Repeat("x", 10<<10)
				for round := 0; ; round++ {
					select {
					case <-stop:
						return
					default:
					}
					pipe := admin.Pipeline()
					for i := range 50 {
						pipe.Set(ctx, fmt.Sprintf("fill:%d:%d", round, i), value, time.Hour)
					}
					pipe.Exec(ctx)
					time.Sleep(5 * time.Millisecond)
				}
			}()
			defer func() { close(stop); <-filled }()
			logged(t, &logs, "Redis evicting keys")
			if policy == "allkeys-lru" {
				if err := admin.Del(ctx, markerPrefix).Err(); err != nil {
					t.Fatal(err)
				}
				time.Sleep(300 * time.Millisecond) // polls that find it gone, and write it again
				if n := countLines(&logs, "Redis flushed"); n != 0 {
					t.Fatalf("the marker deleted while allkeys-lru evicts told as a flush:\n%s", logs.String())
				}
			}
			if err := admin.FlushAll(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			logged(t, &logs, "Redis flushed", "node="+r.Addr)
		})
	}
}
