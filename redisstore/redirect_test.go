package redisstore

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/storetest"
)

// TestClusterRedirects moves a hash slot between the two masters of a
// private cluster while a batched and an unbatched Store use it, each
// through a cluster client of its own: first the whole slot (the client's
// stale map meets MOVED), then some of its keys (a slot in migration answers
// ASK for the keys it no longer holds). The script cache is flushed before
// each step, so redirected calls also meet NOSCRIPT on their new node. Every
// call succeeds, state moves with the keys, and the servers' own counters
// show that each Store was redirected.
func TestClusterRedirects(t *testing.T) {
	ctx := context.Background()
	nodes := startCluster(t, 2)
	a, b := nodes[0], nodes[1]

	// A hash tag in one of a's slots: every key below is "<tag>}<n>", so the
	// Redis key's hash tag is <tag>.
	var tag string
	for i := 0; ; i++ {
		if tag = fmt.Sprint("t", i); slot(tag) < 8192 {
			break
		}
	}
	s0 := int(slot(tag))
	clock := storetest.NewClock(storetest.T0)
	prefix := redistest.Prefix(t)
	stores := []struct {
		name string
		s    *Store
	}{
		{"batched", New(newClusterClient(t, nodes), &Options{Prefix: prefix + "b:", Clock: clock.Now, MaxInFlight: 1})},
		{"unbatched", New(newClusterClient(t, nodes), &Options{Prefix: prefix + "u:", Clock: clock.Now, MaxBatch: 1})},
	}
	const keys = 32
	limits := []sluice.Limit{sluice.PerMinute(10), sluice.PerMinute(10).WithAlgorithm(sluice.FixedWindow)}

	// round takes one unit from every key of each store in turn, from
	// concurrent goroutines, and checks that every node's counter named by
	// redirected grew. The keys have all had the same takes, so each must
	// answer want remaining.
	round := func(step string, want int64, redirected func(store string)) {
		t.Helper()
		for _, st := range stores {
			for _, n := range nodes {
				if err := n.c.ScriptFlush(ctx).Err(); err != nil {
					t.Fatal(err)
				}
				if err := n.c.ConfigResetStat(ctx).Err(); err != nil {
					t.Fatal(err)
				}
			}
			var wg sync.WaitGroup
			for k := range keys {
				l := limits[k%len(limits)]
				wg.Go(func() {
					key := fmt.Sprintf("%s}%d", tag, k)
					d, err := st.s.Take(ctx, key, l, 1)
					if err != nil || !d.Allowed || d.Remaining != want {
						t.Errorf("%s, %s %s %v: %+v %v, want allowed with %d left", step, st.name, key, l.Algorithm, d, err, want)
					}
				})
			}
			wg.Wait()
			if redirected != nil {
				redirected(st.name)
			}
		}
	}

	round("slot on its first node", 9, nil)

	// Move the whole slot to b; the clients still map it to a.
	migrate(t, a, b, s0, func(string) bool { return true })
	for _, n := range nodes {
		if err := n.c.Do(ctx, "cluster", "setslot", s0, "node", b.id).Err(); err != nil {
			t.Fatal(err)
		}
	}
	round("slot moved (MOVED)", 8, func(store string) {
		if n := a.stat(t, "errorstats", "errorstat_MOVED", "count"); n == 0 {
			t.Errorf("%s: the old node sent no MOVED", store)
		}
	})

	// Start moving it back, but carry over only half of each store's keys: b
	// answers ASK for them.
	migrate(t, b, a, s0, func(key string) bool { // "<prefix>{<tag>}<n>}:<algorithm>"
		rest := key[:strings.LastIndex(key, "}")]
		n, err := strconv.Atoi(rest[strings.LastIndex(rest, "}")+1:])
		return err == nil && n%2 == 0
	})
	round("slot in migration (ASK)", 7, func(store string) {
		if n := b.stat(t, "errorstats", "errorstat_ASK", "count"); n == 0 {
			t.Errorf("%s: the migrating node sent no ASK", store)
		}
		if n := a.stat(t, "commandstats", "cmdstat_asking", "calls"); n == 0 {
			t.Errorf("%s: the importing node received no ASKING", store)
		}
	})
}

func newClusterClient(t *testing.T, nodes []*clusterNode) *redis.ClusterClient {
	var addrs []string
	for _, n := range nodes {
		addrs = append(addrs, n.addr)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs})
	t.Cleanup(func() { c.Close() })
	return c
}

// clusterNode is one redis-server of a private cluster.
type clusterNode struct {
	addr, host string
	port, bus  int // bus: the cluster bus port
	id         string
	c          *redis.Client
}

// stat reads one counter from the node's INFO section, such as
// errorstats' "errorstat_ASK:count=3"; a counter not listed is 0.
func (n *clusterNode) stat(t *testing.T, section, name, field string) int64 {
	t.Helper()
	info, err := n.c.Info(context.Background(), section).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		values, ok := strings.CutPrefix(strings.TrimSpace(line), name+":")
		if !ok {
			continue
		}
		for _, kv := range strings.Split(values, ",") {
			if v, ok := strings.CutPrefix(kv, field+"="); ok {
				x, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("INFO %s: %q", section, line)
				}
				return x
			}
		}
	}
	return 0
}

// migrate starts moving slot s from src to dst (IMPORTING and MIGRATING)
// and moves the keys that move picks.
func migrate(t *testing.T, src, dst *clusterNode, s int, move func(key string) bool) {
	t.Helper()
	ctx := context.Background()
	if err := dst.c.Do(ctx, "cluster", "setslot", s, "importing", src.id).Err(); err != nil {
		t.Fatal(err)
	}
	if err := src.c.Do(ctx, "cluster", "setslot", s, "migrating", dst.id).Err(); err != nil {
		t.Fatal(err)
	}
	all, err := src.c.ClusterGetKeysInSlot(ctx, s, 10000).Result()
	if err != nil {
		t.Fatal(err)
	}
	total := len(all)
	keys := slices.DeleteFunc(all, func(k string) bool { return !move(k) })
	t.Logf("moving %d of slot %d's %d keys from %s to %s", len(keys), s, total, src.addr, dst.addr)
	if len(keys) == 0 {
		t.Fatalf("slot %d holds no keys on %s", s, src.addr)
	}
	args := []any{"migrate", dst.host, dst.port, "", 0, 5000, "keys"}
	for _, k := range keys {
		args = append(args, k)
	}
	if err := src.c.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("MIGRATE: %v", err)
	}
}

// startCluster starts n redis-server processes in cluster mode, splits the
// slots evenly among them and waits until they agree. They are killed at
// cleanup. Without redis-server on PATH the test skips (fails under CI).
func startCluster(t *testing.T, n int) []*clusterNode {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server is not on PATH (CI requires Redis)")
		}
		t.Skip("redis-server is not on PATH")
	}
	ctx := context.Background()
	nodes := make([]*clusterNode, n)
	for i := range nodes {
		// Two free ports: the bus port is named, since port+10000 (Redis's
		// default) may be past 65535 or in use for ephemeral ports.
		var ports [2]int
		var ls [2]net.Listener
		for j := range ls {
			l, err := net.Listen("tcp", "127.0.0.1:0") // both held, so they differ
			if err != nil {
				t.Fatal(err)
			}
			ls[j], ports[j] = l, l.Addr().(*net.TCPAddr).Port
		}
		ls[0].Close()
		ls[1].Close()
		port := ports[0]
		dir := t.TempDir()
		cmd := exec.Command("redis-server", "--port", fmt.Sprint(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--logfile", filepath.Join(dir, "redis.log"),
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", "--cluster-port", fmt.Sprint(ports[1]))
		redistest.DieWithParent(cmd)
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		nd := &clusterNode{addr: fmt.Sprintf("127.0.0.1:%d", port), host: "127.0.0.1", port: port, bus: ports[1]}
		nd.c = redis.NewClient(&redis.Options{Addr: nd.addr, MaxRetries: -1})
		t.Cleanup(func() { nd.c.Close() })
		waitFor(t, "redis-server on "+nd.addr, func() bool { return nd.c.Ping(ctx).Err() == nil })
		var err error
		if nd.id, err = nd.c.Do(ctx, "cluster", "myid").Text(); err != nil {
			t.Fatal(err)
		}
		per := 16384 / n
		hi := (i+1)*per - 1
		if i == n-1 {
			hi = 16383
		}
		if err := nd.c.Do(ctx, "cluster", "addslotsrange", i*per, hi).Err(); err != nil {
			t.Fatal(err)
		}
		nodes[i] = nd
	}
	for _, nd := range nodes[1:] {
		if err := nodes[0].c.Do(ctx, "cluster", "meet", nd.host, nd.port, nd.bus).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, nd := range nodes {
		waitFor(t, "cluster agreement on "+nd.addr, func() bool {
			info, err := nd.c.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n))
		})
	}
	return nodes
}

// waitFor polls cond until it holds; a generous bound only turns a hang
// into a failure.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
