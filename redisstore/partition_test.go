package redisstore_test

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// On a Cluster, Partition names the master that holds a key's state, for
// plain keys, tagged ones, ones Redis hashes oddly and a Prefix with a
// hash tag of its own; "" for a key whose algorithms' keys lie in slots
// apart, before the client has a slot map, and always on
// a standalone server.
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
			if k == "}" && prefix == "" {
				want = "" // "sluice:{}}:gcra": Redis hashes the whole key, each algorithm's apart
			}
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
