package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// replicated starts a master with one replica: a one-master cluster, whose
// master a plain client can use too.
func replicated(t testing.TB) (master, replica *redistest.Node) {
	t.Helper()
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 1, Replicas: 1})
	return cl.Nodes[0], cl.Nodes[1]
}

// TestWaitReplicas: with Options.WaitReplicas a take is reported once the
// replica has it, on a Client and a ClusterClient, alone or in TakeAll,
// also when the script cache was flushed;
// one the replicas do not acknowledge in time fails with ErrNotReplicated
// and stays charged. Peeks and refunds do not wait.
func TestWaitReplicas(t *testing.T) {
	ctx := context.Background()
	master, replica := replicated(t)
	onReplica := redis.NewClient(&redis.Options{Addr: replica.Addr,
		OnConnect: func(ctx context.Context, c *redis.Conn) error { return c.ReadOnly(ctx).Err() }})
	t.Cleanup(func() { onReplica.Close() })
	clients := map[string]redis.UniversalClient{
		"client":  redis.NewClient(&redis.Options{Addr: master.Addr}),
		"cluster": redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{master.Addr}}),
	}
	l := sluice.PerMinute(10)
	for name, c := range clients {
		t.Cleanup(func() { c.Close() })
		t.Run(name, func(t *testing.T) {
			prefix := redistest.Prefix(t)
			s := redisstore.New(c, &redisstore.Options{Prefix: prefix, WaitReplicas: 1})
			if d, err := s.Take(ctx, "k", l, 1); err != nil || d.Remaining != 9 {
				t.Fatalf("take: %+v %v", d, err)
			}
			if n, err := onReplica.Exists(ctx, s.Keys("k", l)[0]).Result(); err != nil || n != 1 {
				t.Errorf("replica holds the key: %d %v, want 1", n, err)
			}
			direct := redis.NewClient(&redis.Options{Addr: master.Addr})
			defer direct.Close()
			if err := direct.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			if d, err := s.Take(ctx, "k", l, 1); err != nil || d.Remaining != 8 {
				t.Fatalf("take after SCRIPT FLUSH: %+v %v", d, err)
			}
			reqs := []sluice.Request{{Key: "{t}a", Limit: l, Cost: 1}, {Key: "{t}b", Limit: l.WithAlgorithm(sluice.FixedWindow), Cost: 2}}
			if ds, err := s.TakeAll(ctx, reqs); err != nil || ds[1].Remaining != 8 {
				t.Fatalf("take all: %+v %v", ds, err)
			}

			// Two replicas asked for, one there: the take fails in
			// WaitTimeout and stays charged.
			two := redisstore.New(c, &redisstore.Options{Prefix: prefix, WaitReplicas: 2, WaitTimeout: 20 * time.Millisecond})
			start := time.Now()
			if _, err := two.Take(ctx, "k", l, 1); !errors.Is(err, redisstore.ErrNotReplicated) {
				t.Errorf("take that one replica acknowledged, two asked for: %v, want ErrNotReplicated", err)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("failed take took %v, want about WaitTimeout (20ms)", took)
			}
			if d, err := two.Peek(ctx, "k", l, 1); err != nil || d.Remaining != 7 {
				t.Errorf("peek after the unreplicated take: %+v %v, want it charged (7 left)", d, err)
			}
		})
	}
	t.Run("unsupported client", func(t *testing.T) {
		ring := redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": master.Addr}})
		t.Cleanup(func() { ring.Close() })
		s := redisstore.New(ring, &redisstore.Options{Prefix: redistest.Prefix(t), WaitReplicas: 1})
		if _, err := s.Take(ctx, "k", l, 1); !errors.Is(err, redisstore.ErrWaitUnsupported) {
			t.Errorf("take on a Ring: %v, want ErrWaitUnsupported", err)
		}
	})
}

// BenchmarkTakeWait measures what Options.WaitReplicas costs: Take on a
// master with one replica, without and with WAIT, serially and from 64
// goroutines. Without WAIT, "batched" is the default and "alone" MaxBatch 1
// (WAIT turns batching off); "deadline" gives each call a context that can
// end, so the call goes on a goroutine of its own. GCRA, 1,000/s, over
// 10,000 keys (always allowed).
func BenchmarkTakeWait(b *testing.B) {
	master, _ := replicated(b)
	client := redis.NewClient(&redis.Options{Addr: master.Addr})
	b.Cleanup(func() { client.Close() })
	prefix := redistest.Prefix(b)
	keys := make([]string, benchKeys)
	for i := range keys {
		keys[i] = "user:" + time.Duration(i).String()
	}
	l := sluice.Limit{Algorithm: sluice.GCRA, Rate: 1000, Period: time.Second}
	stores := []struct {
		name string
		s    *redisstore.Store
	}{
		{"batched", redisstore.New(client, &redisstore.Options{Prefix: prefix})},
		{"alone", redisstore.New(client, &redisstore.Options{Prefix: prefix, MaxBatch: 1})},
		{"wait1", redisstore.New(client, &redisstore.Options{Prefix: prefix, WaitReplicas: 1})},
	}
	for _, st := range stores {
		b.Run(st.name+"/serial", func(b *testing.B) { benchSerial(b, st.s, l, keys) })
		b.Run(st.name+"/serial_deadline", func(b *testing.B) {
			benchSerialCtx(b, st.s, l, keys)
		})
		b.Run(st.name+"/parallel", func(b *testing.B) { benchParallel(b, st.s, l, keys) })
	}
}
