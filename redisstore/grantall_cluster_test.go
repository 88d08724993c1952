package redisstore

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/storetest"
)

// TestGrantAllCluster: on a Redis Cluster of three masters, a GrantAll
// whose keys live on every master sends one batch to each, the three side
// by side, each grant once, and each result is what Grant or Regrant alone
// answers (a second Store, with the same clock, makes those calls). With
// a slot moved behind the clients' backs (their slot maps stale), the
// grants follow MOVED, and each is still taken once in Redis.
func TestGrantAllCluster(t *testing.T) {
	ctx := context.Background()
	cl := redistest.StartCluster(t, nil)
	nodes := clusterNodes(t, cl)
	sends := &nodeSends{n: map[string][2]int{}}
	meet := &pipelineMeet{want: len(nodes), met: make(chan struct{})}
	cc := cl.Client(t)
	cc.OnNewNode(func(c *redis.Client) {
		c.AddHook(sends.hook(c.Options().Addr))
		c.AddHook(meet)
	})
	clock := storetest.NewClock(storetest.T0)
	prefix := redistest.Prefix(t)
	all := New(cc, &Options{Prefix: prefix + "all:", Clock: clock.Now})
	alone := New(cl.Client(t), &Options{Prefix: prefix + "one:", Clock: clock.Now})
	l := sluice.PerMinute(10)

	// Two keys on each master, in start order: "{tag}", its tag in the
	// master's share of the slots.
	var keys []string
	for m := range nodes {
		for i := 0; len(keys) < 2*(m+1); i++ {
			tag := fmt.Sprint("g", i)
			if s := int(slot(tag)); s >= m*16384/len(nodes) && s < (m+1)*16384/len(nodes) {
				keys = append(keys, "{"+tag+"}")
			}
		}
	}

	// Every key leased 3 units, in both Stores; the calls also give the
	// batched Store its slot map, and so its lanes.
	grants := make([]sluice.Grant, len(keys))
	for i, k := range keys {
		a, err := all.Grant(ctx, k, l, 3)
		if err != nil {
			t.Fatal(err)
		}
		b, err := alone.Grant(ctx, k, l, 3)
		if err != nil || !reflect.DeepEqual(a, b) {
			t.Fatalf("%s: grant %+v, %v; the other Store's %+v", k, b, err, a)
		}
		grants[i] = a
	}

	// grantAll sends reqs with the batched Store and each alone with the
	// other, and checks that each result is the same.
	grantAll := func(step string, reqs []sluice.GrantRequest) {
		t.Helper()
		res := all.GrantAll(ctx, reqs)
		for i, r := range reqs {
			var want sluice.GrantResult
			if r.Unused > 0 {
				want.Returned, want.Grant, want.Err = alone.Regrant(ctx, r.Key, r.Limit, r.Grant, r.Unused, r.N)
			} else {
				want.Grant, want.Err = alone.Grant(ctx, r.Key, r.Limit, r.N)
			}
			if res[i].Err != nil || want.Err != nil || !reflect.DeepEqual(res[i], want) {
				t.Errorf("%s, %s: GrantAll's %+v; alone %+v", step, r.Key, res[i], want)
			}
		}
	}

	// Regrants (2 of 3 units back, 4 taken) and grants (2), every master's
	// in one batch, side by side.
	reqs := make([]sluice.GrantRequest, len(keys))
	for i, k := range keys {
		reqs[i] = sluice.GrantRequest{Key: k, Limit: l, N: 2}
		if i%2 == 0 {
			reqs[i] = sluice.GrantRequest{Key: k, Limit: l, N: 4, Grant: grants[i], Unused: 2}
		}
	}
	sends.reset()
	meet.armed.Store(true)
	grantAll("every master", reqs)
	meet.armed.Store(false)
	for _, n := range nodes {
		if got := sends.get(n.addr); got != [2]int{1, 2} {
			t.Errorf("%s: %d sends of %d grants; want 1 of 2", n.addr, got[0], got[1])
		}
	}
	if meet.alone.Load() {
		t.Error("the masters' batches went one after another")
	}

	// The first key's slot moved to the second master; the clients still
	// map it to the first.
	a, b := nodes[0], nodes[1]
	s0 := int(slot(keys[0][1 : len(keys[0])-1]))
	migrate(t, a, b, s0, func(string) bool { return true })
	for _, n := range nodes {
		if err := n.c.Do(ctx, "cluster", "setslot", s0, "node", b.id).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := a.c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range reqs {
		reqs[i] = sluice.GrantRequest{Key: keys[i], Limit: l, N: 1}
	}
	grantAll("slot moved", reqs)
	if n := a.stat(t, "errorstats", "errorstat_MOVED", "count"); n == 0 {
		t.Error("the old master sent no MOVED")
	}
	// 3 taken, then 2 back and 4 or 2 more, then 1: 4 left either way.
	for _, k := range keys {
		for _, s := range []*Store{all, alone} {
			d, err := s.Peek(ctx, k, l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Remaining != 4 {
				t.Errorf("%s: %d left; want 4 (each grant taken once)", k, d.Remaining)
			}
		}
	}
}

// nodeSends is a go-redis hook for a cluster's node clients that counts,
// per node, sends of scripts (a command alone or a pipeline) and the
// scripts in them.
type nodeSends struct {
	mu sync.Mutex
	n  map[string][2]int
}

func (h *nodeSends) reset() { h.mu.Lock(); clear(h.n); h.mu.Unlock() }

func (h *nodeSends) get(addr string) [2]int { h.mu.Lock(); defer h.mu.Unlock(); return h.n[addr] }

func (h *nodeSends) count(addr string, cmds []redis.Cmder) {
	if cmds[0].Name() != "evalsha" {
		return // a connection's handshake, a PING
	}
	h.mu.Lock()
	v := h.n[addr]
	h.n[addr] = [2]int{v[0] + 1, v[1] + len(cmds)}
	h.mu.Unlock()
}

func (h *nodeSends) hook(addr string) redis.Hook { return nodeHook{h, addr} }

type nodeHook struct {
	h    *nodeSends
	addr string
}

func (n nodeHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (n nodeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		n.h.count(n.addr, []redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (n nodeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n.h.count(n.addr, cmds)
		return next(ctx, cmds)
	}
}
