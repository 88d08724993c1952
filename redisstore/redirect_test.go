package redisstore

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

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
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 2})
	nodes := clusterNodes(t, cl)
	a, b := nodes[0], nodes[1]

	// A hash tag in one of a's slots: every key below is "{<tag>}<n>", so
	// its Redis keys' hash tag is <tag>.
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
		{"batched", New(cl.Client(t), &Options{Prefix: prefix + "b:", Clock: clock.Now, MaxInFlight: 1})},
		{"unbatched", New(cl.Client(t), &Options{Prefix: prefix + "u:", Clock: clock.Now, MaxBatch: 1})},
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
					key := fmt.Sprintf("{%s}%d", tag, k)
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
	migrate(t, b, a, s0, func(key string) bool { // "<prefix>[{<tag>}<n>]:<algorithm>"
		rest := key[:strings.LastIndex(key, "]")]
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

// clusterNode is one master of a private cluster, with a client of its
// own for the slot commands.
type clusterNode struct {
	addr, host string
	port       int
	id         string
	c          *redis.Client
}

// clusterNodes wraps the cluster's nodes, in start order: the first holds
// the lower half of the slots.
func clusterNodes(t *testing.T, cl *redistest.Cluster) []*clusterNode {
	t.Helper()
	var nodes []*clusterNode
	for _, n := range cl.Nodes {
		host, port, err := net.SplitHostPort(n.Addr)
		if err != nil {
			t.Fatal(err)
		}
		nd := &clusterNode{addr: n.Addr, host: host, c: redis.NewClient(&redis.Options{Addr: n.Addr, MaxRetries: -1})}
		t.Cleanup(func() { nd.c.Close() })
		if nd.port, err = strconv.Atoi(port); err != nil {
			t.Fatal(err)
		}
		if nd.id, err = nd.c.Do(context.Background(), "cluster", "myid").Text(); err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, nd)
	}
	return nodes
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
