package redisstore

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

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
