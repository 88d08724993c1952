package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
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

// TestClusterTryAgain splits the keys of a grant (state and epoch) and of
// a ReleaseOnce (holders and released holders) between the two nodes of
// a slot in migration, as a resharding does between two MIGRATEs: Redis
// answers TRYAGAIN and runs nothing. Calls made then succeed, each run
// once, when the migration completes within their retries; while the keys
// stay split they fail with ErrResharding, before their deadline or after
// tryAgainFor.
func TestClusterTryAgain(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 2})
	nodes := clusterNodes(t, cl)
	a, b := nodes[0], nodes[1]
	var tag string
	for i := 0; ; i++ {
		if tag = fmt.Sprint("t", i); slot(tag) < 8192 { // one of a's slots
			break
		}
	}
	sl := int(slot(tag))
	s := New(cl.Client(t), &Options{Prefix: "tryagain:"})
	l := sluice.PerMinute(100)
	in := sluice.Concurrent(10, time.Minute)

	// Every key of both calls exists: a grant writes the state and a Reset
	// the epoch; of two holders, one is released once.
	if _, err := s.Grant(ctx, tag, l, 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Reset(ctx, tag, l); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Grant(ctx, tag, l, 1); err != nil {
		t.Fatal(err)
	}
	for _, h := range []string{"h1", "h2"} {
		if d, err := s.Acquire(ctx, tag, in, 1, h); err != nil || !d.Allowed {
			t.Fatalf("acquire %s: %+v %v", h, d, err)
		}
	}
	if released, _, err := s.ReleaseOnce(ctx, tag, "h1", time.Minute); err != nil || !released {
		t.Fatalf("release once h1: %v %v", released, err)
	}
	state, released := s.redisKey(tag, l.Algorithm), s.releasedKey(tag)
	for _, k := range []string{state, s.resetKey(tag, l.Algorithm), s.slotKey(tag), released} {
		if n, err := a.c.Exists(ctx, k).Result(); err != nil || n != 1 {
			t.Fatalf("key %s on %s: %d %v", k, a.addr, n, err)
		}
	}
	tryAgains := func() int64 {
		return a.stat(t, "errorstats", "errorstat_TRYAGAIN", "count") + b.stat(t, "errorstats", "errorstat_TRYAGAIN", "count")
	}

	// The state and the released holders go to b; the epoch and the
	// holders stay on a.
	migrate(t, a, b, sl, func(k string) bool { return k == state || k == released })
	before := tryAgains()
	type reply struct {
		granted  int64
		released bool
		err      error
	}
	grant, release := make(chan reply, 1), make(chan reply, 1)
	go func() {
		g, err := s.Grant(ctx, tag, l, 3)
		grant <- reply{granted: g.Granted, err: err}
	}()
	go func() {
		ok, _, err := s.ReleaseOnce(ctx, tag, "h2", time.Minute)
		release <- reply{released: ok, err: err}
	}()
	// Both calls have met TRYAGAIN before the migration completes.
	for start := time.Now(); tryAgains() < before+2; time.Sleep(2 * time.Millisecond) {
		if time.Since(start) > tryAgainFor/2 {
			t.Fatalf("%d TRYAGAIN answers after %v, want 2", tryAgains()-before, time.Since(start))
		}
	}
	finishSlot(t, a, b, sl)
	if r := <-grant; r.err != nil || r.granted != 3 {
		t.Errorf("grant while the slot migrated: granted %d, %v; want 3", r.granted, r.err)
	}
	if r := <-release; r.err != nil || !r.released {
		t.Errorf("release once while the slot migrated: %v, %v; want released", r.released, r.err)
	}
	// The grant ran once: its 3 units and the 1 granted since the Reset.
	if d, err := s.Peek(ctx, tag, l, 1); err != nil || d.Remaining != 100-4 {
		t.Errorf("peek after the migration: %+v %v, want %d remaining", d, err, 100-4)
	}
	if d, err := s.Acquire(ctx, tag, sluice.Concurrent(1, time.Minute), 1, "h3"); err != nil || !d.Allowed || d.InUse != 1 {
		t.Errorf("acquire after the release: %+v %v, want the only holder", d, err)
	}

	// Split again, for good: the calls fail with ErrResharding.
	migrate(t, b, a, sl, func(k string) bool { return k == state || k == released })
	const deadline = 300 * time.Millisecond
	dctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := time.Now()
	_, err := s.Grant(dctx, tag, l, 1)
	took := time.Since(start)
	if got := Classify(err); !errors.Is(got, ErrResharding) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("grant on keys split for good: %v (%v); want ErrResharding, before the deadline", err, got)
	}
	if took < deadline/2 || took >= deadline {
		t.Errorf("grant on keys split for good took %v: want retries up to, not past, its %v deadline", took, deadline)
	}
	start = time.Now()
	_, _, err = s.ReleaseOnce(ctx, tag, "h1", time.Minute)
	took = time.Since(start)
	if got := Classify(err); !errors.Is(got, ErrResharding) {
		t.Errorf("release once on keys split for good: %v (%v); want ErrResharding", err, got)
	}
	if took < tryAgainFor-2*tryAgainMost || took > tryAgainFor+time.Second {
		t.Errorf("release once on keys split for good took %v: want retries for about %v", took, tryAgainFor)
	}
}

// finishSlot moves slot s's keys left on src to dst and makes dst its
// owner, on both nodes.
func finishSlot(t *testing.T, src, dst *clusterNode, s int) {
	t.Helper()
	ctx := context.Background()
	keys, err := src.c.ClusterGetKeysInSlot(ctx, s, 10000).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		args := []any{"migrate", dst.host, dst.port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		if err := src.c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("MIGRATE: %v", err)
		}
	}
	for _, n := range []*clusterNode{dst, src} {
		if err := n.c.Do(ctx, "cluster", "setslot", s, "node", dst.id).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
