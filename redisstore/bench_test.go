package redisstore_test

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// benchKeys is the wide key set, the size the bench module's comparison
// uses.
const benchKeys = 10_000

// benchGoroutines is how many callers the parallel benchmarks run, as in the
// bench module's comparison: one caller per core would measure round-trip
// latency, not what Redis and the client sustain.
const benchGoroutines = 64

// BenchmarkTake measures Store.Take for every algorithm on the standalone
// Redis with the server's clock (the default), on one hot key and over
// 10,000 keys, serially and from 64 goroutines, the latter with concurrent
// calls batched into pipelines (the default) and with every call alone
// (MaxBatch 1). The limit is 1,000/s: the hot key is mostly denied, the wide
// set always allowed (allowed/op says which path ran).
func BenchmarkTake(b *testing.B) {
	client := redistest.Client(b)
	prefix := redistest.Prefix(b)
	wide := make([]string, benchKeys)
	seen := make(map[string]bool, benchKeys)
	for i := range wide {
		wide[i] = fmt.Sprintf("user:%08d", i)
		seen[wide[i]] = true
	}
	if len(seen) != benchKeys {
		b.Fatalf("%d distinct keys, want %d", len(seen), benchKeys)
	}
	keySets := []struct {
		name string
		keys []string
	}{{"hot", []string{"hot"}}, {"10k", wide}}

	for _, a := range sluice.Algorithms() {
		l := sluice.Limit{Algorithm: a, Rate: 1000, Period: time.Second}
		store := redisstore.New(client, &redisstore.Options{Prefix: prefix + a.String() + ":"})
		alone := redisstore.New(client, &redisstore.Options{Prefix: prefix + a.String() + ":", MaxBatch: 1})
		for _, ks := range keySets {
			b.Run(a.String()+"/"+ks.name, func(b *testing.B) {
				b.Run("serial", func(b *testing.B) { benchSerial(b, store, l, ks.keys) })
				b.Run("parallel", func(b *testing.B) { benchParallel(b, store, l, ks.keys) })
				b.Run("parallel_unbatched", func(b *testing.B) { benchParallel(b, alone, l, ks.keys) })
			})
		}
	}
}

func benchSerial(b *testing.B, s *redisstore.Store, l sluice.Limit, keys []string) {
	benchSerialIn(b, context.Background(), s, l, keys)
}

// benchSerialCtx is benchSerial with a context that can end (it never
// does), as a request's context: the path that bounds a call by it.
func benchSerialCtx(b *testing.B, s *redisstore.Store, l sluice.Limit, keys []string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	benchSerialIn(b, ctx, s, l, keys)
}

func benchSerialIn(b *testing.B, ctx context.Context, s *redisstore.Store, l sluice.Limit, keys []string) {
	storetest.BenchSerial(b, ctx, keys, func(ctx context.Context, key string) (sluice.Decision, error) { return s.Take(ctx, key, l, 1) })
}

// benchParallel hands keys out in strict rotation through a shared counter,
// so the first min(b.N, len(keys)) calls use distinct keys whatever the
// scheduling.
func benchParallel(b *testing.B, s *redisstore.Store, l sluice.Limit, keys []string) {
	ctx := context.Background()
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((benchGoroutines + procs - 1) / procs)
	var next, allowed, failed atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var ok int64
		for pb.Next() {
			key := keys[(next.Add(1)-1)%int64(len(keys))]
			d, err := s.Take(ctx, key, l, 1)
			if err != nil {
				if failed.Add(1) == 1 {
					b.Error(err)
				}
				continue
			}
			if d.Allowed {
				ok++
			}
		}
		allowed.Add(ok)
	})
	b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed/op")
}

// BenchmarkPing is the round trip that every serial Take above includes: a
// PING on the same client, as a yardstick for a busy machine's latency.
func BenchmarkPing(b *testing.B) {
	client := redistest.Client(b)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if err := client.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}
