package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// On a Cluster, Partition names the master that holds a key's state, for
// plain keys, tagged ones, ones with a "}" but no tag ("}" was stored
// "{}}:gcra", each algorithm's key in a slot of its own, and had none) and
// a Prefix with a hash tag of its own; "" before the client has a slot
// map, and always on a standalone server.
func TestPartitionNamesKeysMaster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, nil)
	keys := []string{"a", "b", "user:1", "user:2", "ip:10.0.0.1", "{t1}:a", "api:{t1}:b", "a}b", "{}x", "x{y", "}"}
	lim := sluice.PerMinute(10)
	for _, prefix := range []string{"", "p{tag}:", "p{:"} {
		s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: prefix})
		if p := s.Partition("a"); p != "" {
			t.Errorf("prefix %q: Partition before any call = %q, want \"\"", prefix, p)
		}
		masters := map[string]bool{}
		for _, k := range keys {
			if _, err := s.Take(context.Background(), k, lim, 1); err != nil {
				t.Fatal(err)
			}
			want := cl.MasterOf(t, s.Keys(k, lim)[0]).Addr
			if got := s.Partition(k); got != want {
				t.Errorf("prefix %q: Partition(%q) = %q, want %q (the master holding %q)", prefix, k, got, want, s.Keys(k, lim)[0])
			}
			if want != "" {
				masters[want] = true
			}
		}
		if prefix == "" && len(masters) < 2 {
			t.Errorf("keys on %d master(s): pick keys that spread", len(masters))
		}
	}
	one := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	if _, err := one.Take(context.Background(), "a", lim, 1); err != nil {
		t.Fatal(err)
	}
	if p := one.Partition("a"); p != "" {
		t.Errorf("standalone: Partition = %q, want \"\"", p)
	}
}

// A TakeAll whose keys span masters and that fails on one master names
// the key it failed on (sluice.KeyFailure), in either order, so that a
// breaker per master charges that master, not the one that answered.
func TestTakeAllNamesFailedKey(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Args: []string{"--cluster-require-full-coverage", "no"}})
	s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	lim := sluice.PerMinute(10)
	ctx := context.Background()
	byMaster := map[string]string{}
	for i := 0; len(byMaster) < 2; i++ {
		k := fmt.Sprint("k", i)
		if _, err := s.Take(ctx, k, lim, 1); err != nil {
			t.Fatal(err)
		}
		byMaster[cl.MasterOf(t, s.Keys(k, lim)[0]).Addr] = k
	}
	var down, live string
	for _, k := range byMaster {
		if down == "" {
			down = k
		} else {
			live = k
		}
	}
	stopped := cl.MasterOf(t, s.Keys(down, lim)[0])
	stopped.Pause(t)
	defer stopped.Resume(t)
	for _, keys := range [][]string{{live, down}, {down, live}} {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := s.TakeAll(cctx, []sluice.Request{{Key: keys[0], Limit: lim, Cost: 1}, {Key: keys[1], Limit: lim, Cost: 1}})
		cancel()
		kf, ok := errors.AsType[sluice.KeyFailure](err)
		if !ok || kf.FailedKey() != down {
			t.Errorf("TakeAll(%v) with %q's master stopped: %v; want a sluice.KeyFailure naming %q", keys, down, err, down)
		}
	}
}
