package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestServerTakeOnReplicaCause: Redis turned into a replica (REPLICAOF)
// under a running service refuses every take with READONLY, behind the
// store's own words ("redisstore: ... take: READONLY ..."): each is
// counted with cause topology, none as unreachable.
func TestServerTakeOnReplicaCause(t *testing.T) {
	t.Parallel()
	master := redistest.StartServer(t)
	r := redistest.StartServer(t)
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "error", &logs) // every decision goes to Redis
	if code, _ := p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=a"}`); code != 200 {
		t.Fatalf("check with Redis a master: %d", code)
	}
	host, port, _ := net.SplitHostPort(master.Addr)
	if err := r.Client(t).ReplicaOf(context.Background(), host, port).Err(); err != nil {
		t.Fatal(err)
	}
	waitTakesCounted(t, p, "topology")
	if _, body := p.get(t, "/metrics"); strings.Contains(body, `sluice_store_errors_total{cause="unreachable"`) {
		t.Errorf("takes refused by a replica counted as unreachable:\n%s", grepLines(body, "sluice_store_errors_total"))
	}
}

// TestServerRedisMaxClients: a Redis with maxclients connections open
// refuses new ones as it accepts them. At start and at runtime the store is
// lost with cause maxclients, logged with Redis's words, not "unreachable"
// with a broken pipe; /v1/status says so; the takes that fail meanwhile are
// counted with that cause; and it is back once Redis takes connections.
func TestServerRedisMaxClients(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := redistest.StartServer(t, "--maxclients", "1")
	// One connection, the only one Redis takes while maxclients is 1.
	admin := redis.NewClient(&redis.Options{Addr: r.Addr, PoolSize: 1, MaxRetries: -1})
	t.Cleanup(func() { admin.Close() })
	if err := admin.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}

	var logs syncBuffer
	srv, p := startOnRedis(t, "redis://"+r.Addr, "local", &logs)
	line := logged(t, &logs, "Redis refuses new connections at start")
	if !strings.Contains(line, "ERR max number of clients reached") {
		t.Errorf("start line %q: want Redis's words", line)
	}
	if st := srv.health.Status(); st.Store.Up || st.Store.Cause != "maxclients" {
		t.Errorf("status after the start: %+v, want the store down, cause maxclients", st.Store)
	}
	_, st := p.getJSON(t, "/v1/status")
	store, _ := st["store"].(map[string]any)
	if store["cause"] != "maxclients" || !strings.Contains(fmt.Sprint(store["error"]), "ERR max number of clients reached") {
		t.Errorf("/v1/status store %v: want cause maxclients with Redis's words", store)
	}
	if reasons := fmt.Sprint(st["reasons"]); strings.Contains(reasons, "unreachable") || strings.Contains(reasons, "broken pipe") {
		t.Errorf("reasons %s: want max clients, not unreachable", reasons)
	}
	if err := admin.ConfigSet(ctx, "maxclients", "10000").Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, &logs, "store back")
	if code, _ := p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=a"}`); code != 200 {
		t.Fatalf("check with Redis back: %d", code)
	}

	// At runtime: the service's connections closed while Redis takes no
	// new one.
	if err := admin.ConfigSet(ctx, "maxclients", "1").Err(); err != nil {
		t.Fatal(err)
	}
	for _, typ := range []string{"normal", "pubsub"} {
		if err := admin.Do(ctx, "client", "kill", "type", typ, "skipme", "yes").Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitTakesCounted(t, p, "maxclients")
	if !eventually(func() bool { return countLines(&logs, "store lost") == 2 }) {
		t.Fatalf("no store lost line at runtime:\n%s", logs.String())
	}
	lost := grepLines(logs.String(), "store lost")
	if line := lost[strings.Index(lost, "\n")+1:]; !strings.Contains(line, "level=ERROR") || !strings.Contains(line, "cause=maxclients") ||
		!strings.Contains(line, "ERR max number of clients reached") {
		t.Errorf("store lost line %q: want ERROR, cause maxclients, with Redis's words", line)
	}
	if strings.Contains(logs.String(), "cause=unreachable") || strings.Contains(logs.String(), "broken pipe") {
		t.Errorf("a Redis at maxclients called unreachable:\n%s", logs.String())
	}
	if _, body := p.get(t, "/metrics"); strings.Contains(body, `sluice_store_errors_total{cause="unreachable"`) {
		t.Errorf("takes refused at maxclients counted as unreachable:\n%s", grepLines(body, "sluice_store_errors_total"))
	}
	if err := admin.ConfigSet(ctx, "maxclients", "10000").Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); countLines(&logs, "store back") < 2; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no second store back once Redis took connections again:\n%s", logs.String())
		}
	}
}

// TestServerClusterReshardingCause: a leased policy's key whose state a
// slot migration moved while its epoch stayed behind: the lease's grants
// meet TRYAGAIN until the migration completes. The failed grants are
// counted with cause resharding, none as unreachable, and once the slot
// is finished decisions go to Redis again.
func TestServerClusterReshardingCause(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 2})
	cfg := writeConfig(t, "policies:\n  - name: hot\n    limit: 1000000/hour\n    lease: 100ms\n")
	var logs syncBuffer
	fp, _, _ := ParseFailurePolicy("local")
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: cl.URL(), FailurePolicy: fp,
		StoreCheckInterval: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	p := &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}
	// A demand the key is leased for: 10 units a request, 8 at once, so
	// that it is hot however slowly a loaded machine answers each one.
	check := func() int {
		var wg sync.WaitGroup
		codes := make([]int, 8)
		for i := range codes {
			wg.Go(func() {
				resp, err := http.Post("http://"+p.http+"/v1/check", "application/json", strings.NewReader(`{"policy":"hot","key":"k","cost":10}`))
				if err != nil {
					return
				}
				resp.Body.Close()
				codes[i] = resp.StatusCode
			})
		}
		wg.Wait()
		for _, c := range codes {
			if c != http.StatusOK {
				return c
			}
		}
		return http.StatusOK
	}
	grants := func() float64 {
		_, body := p.get(t, "/metrics")
		var n float64
		for line := range strings.Lines(body) {
			if strings.HasPrefix(line, "sluice_store_calls_total{") && strings.Contains(line, `grant"`) {
				f := strings.Fields(line)
				v, _ := strconv.ParseFloat(f[len(f)-1], 64)
				n += v
			}
		}
		return n
	}
	if !eventually(func() bool { return check() == 200 && grants() > 0 }) {
		t.Fatalf("the key was never leased:\n%s", logs.String())
	}

	// The lease's state key, and the node that holds it. A grant's state
	// lives about as long as its units take to refill (a few hundred ms
	// here), so a slow machine may find it gone: lease again and look.
	var state string
	var src *redistest.Node
	find := func() bool {
		for _, n := range cl.Nodes {
			c := redis.NewClient(&redis.Options{Addr: n.Addr})
			keys, err := c.Keys(ctx, "*").Result()
			c.Close()
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range keys {
				if strings.Contains(k, "hot") && !strings.HasSuffix(k, "-reset") {
					state, src = k, n
				}
			}
		}
		return state != ""
	}
	if !eventually(func() bool { return find() || check() == 200 && find() }) {
		t.Fatal("the lease wrote no state key")
	}
	dst := cl.Nodes[0]
	if dst == src {
		dst = cl.Nodes[1]
	}
	srcC := redis.NewClient(&redis.Options{Addr: src.Addr})
	dstC := redis.NewClient(&redis.Options{Addr: dst.Addr})
	t.Cleanup(func() { srcC.Close(); dstC.Close() })
	slot, err := srcC.ClusterKeySlot(ctx, state).Result()
	if err != nil {
		t.Fatal(err)
	}
	srcID, _ := srcC.Do(ctx, "cluster", "myid").Text()
	dstID, _ := dstC.Do(ctx, "cluster", "myid").Text()
	host, port, _ := net.SplitHostPort(dst.Addr)
	for _, step := range [][]any{
		{dstC, "cluster", "setslot", slot, "importing", srcID},
		{srcC, "cluster", "setslot", slot, "migrating", dstID},
		{srcC, "migrate", host, port, "", 0, 5000, "keys", state},
	} {
		if err := step[0].(*redis.Client).Do(ctx, step[1:]...).Err(); err != nil {
			t.Fatalf("%v: %v", step[1:], err)
		}
	}

	if !eventually(func() bool {
		check()
		_, body := p.get(t, "/metrics")
		return strings.Contains(body, `cause="resharding"`)
	}) {
		_, body := p.get(t, "/metrics")
		t.Fatalf("no store error counted as resharding:\n%s", grepLines(body, "sluice_store_errors_total"))
	}
	if _, body := p.get(t, "/metrics"); strings.Contains(body, `sluice_store_errors_total{cause="unreachable"`) {
		t.Errorf("grants refused with TRYAGAIN counted as unreachable:\n%s", grepLines(body, "sluice_store_errors_total"))
	}

	// Finish the migration: the grants succeed again.
	left, err := srcC.ClusterGetKeysInSlot(ctx, int(slot), 100).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(left) > 0 {
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range left {
			args = append(args, k)
		}
		if err := srcC.Do(ctx, args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []*redis.Client{dstC, srcC} {
		if err := c.Do(ctx, "cluster", "setslot", slot, "node", dstID).Err(); err != nil {
			t.Fatal(err)
		}
	}
	errs := func() string {
		_, body := p.get(t, "/metrics")
		return grepLines(body, `cause="resharding"`)
	}
	settled := errs()
	if !eventually(func() bool {
		before := grants()
		for range 5 {
			check()
		}
		return grants() > before && errs() == settled
	}) {
		t.Errorf("grants still failing after the migration completed:\n%s\n%s", errs(), logs.String())
	}
}

// waitTakesCounted checks rl.foo until a take is counted as a store error
// with cause, failing the test if none is.
func waitTakesCounted(t *testing.T, p *proc, cause string) {
	t.Helper()
	series := `sluice_store_errors_total{cause="` + cause + `",op="take",store="redis"}`
	if !eventually(func() bool {
		p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=a"}`)
		got := scrapedMetric(t, p, series)
		return got != "" && got != "0"
	}) {
		_, body := p.get(t, "/metrics")
		t.Fatalf("no take counted as %s:\n%s", series, grepLines(body, "sluice_store_errors_total"))
	}
}

// grepLines returns text's lines that contain word.
func grepLines(text, word string) string {
	var b strings.Builder
	for line := range strings.Lines(text) {
		if strings.Contains(line, word) {
			b.WriteString(line)
		}
	}
	return b.String()
}

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
	if n := w.counts("master").restarts; n != 0 || logs.String() != "" {
		t.Fatalf("a failover counted as %d restarts:\n%s", n, logs.String())
	}
	read("c", 3, 5*time.Second) // started 3 s ago, after the last read
	if n := w.counts("master").restarts; n != 1 {
		t.Errorf("restarts = %d after a restart, want 1:\n%s", n, logs.String())
	}
}
