package bench

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// runPrefix keeps this process's keys apart from other runs on the same
// server; the contender's index keeps contenders apart.
func runPrefix(i int) string { return fmt.Sprintf("bench:%d:%d:", os.Getpid(), i) }

// BenchmarkRedis compares the Redis contenders at Goroutines goroutines over
// NumKeys keys, in one process against one server. Besides ns/op it reports
// ops/s, the share of calls allowed, the distinct keys used, and for sluice
// its throughput divided by the best peer's latest run (x-best-peer: at
// least 1 means sluice is as fast as the best peer).
func BenchmarkRedis(b *testing.B) {
	compare(b, redistest.Client(b), RedisContenders())
}

// BenchmarkMemory is the same comparison for in-process limiters; it needs
// no Redis.
func BenchmarkMemory(b *testing.B) {
	compare(b, nil, MemoryContenders())
}

func compare(b *testing.B, client redis.UniversalClient, contenders []Contender) {
	keys, err := Keys(NumKeys)
	if err != nil {
		b.Fatal(err)
	}
	latest := map[string]float64{} // each peer's latest ops/s
	for i, c := range contenders {
		take, err := c.New(client, runPrefix(i))
		if err != nil {
			b.Fatalf("%s: %v", c.Name, err)
		}
		b.Run(c.Name, func(b *testing.B) {
			ops := runParallel(b, client, take, keys)
			if c.Peer {
				latest[c.Name] = ops
				return
			}
			best := 0.0
			for _, v := range latest {
				best = max(best, v)
			}
			if best > 0 {
				b.ReportMetric(ops/best, "x-best-peer")
			}
		})
	}
}

// runParallel runs take on Goroutines goroutines (GOMAXPROCS × parallelism,
// rounded up) and returns the throughput. With a client it also reports the
// Redis server's CPU per call (redis-cpu-us/op), which counts every client
// of that server: meaningful on a server of the benchmark's own.
func runParallel(b *testing.B, client redis.UniversalClient, take TakeFunc, keys []string) float64 {
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((Goroutines + procs - 1) / procs)
	set := NewKeySet(keys)
	ctx := context.Background()
	var allowed, failed atomic.Int64
	var cpu0 time.Duration
	if client != nil {
		var err error
		if cpu0, err = RedisCPU(ctx, client); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := set.Walk()
		defer w.Done()
		var ok int64
		for pb.Next() {
			a, err := take(ctx, w.Key())
			if err != nil {
				if failed.Add(1) == 1 {
					b.Error(err)
				}
				continue // pb.Next must run dry
			}
			if a {
				ok++
			}
		}
		allowed.Add(ok)
	})
	b.StopTimer()
	if b.Failed() {
		return 0
	}
	if got, want := set.Distinct(), min(b.N, len(keys)); got != want {
		b.Fatalf("used %d distinct keys, want %d", got, want)
	}
	ops := float64(b.N) / b.Elapsed().Seconds()
	if client != nil {
		cpu1, err := RedisCPU(ctx, client)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "redis-cpu-us/op")
	}
	b.ReportMetric(ops, "ops/s")
	b.ReportMetric(float64(allowed.Load())/float64(b.N), "allowed/op")
	b.ReportMetric(float64(set.Distinct()), "keys")
	return ops
}

// TestMemoryUsage logs Redis MEMORY USAGE per limiter key for every
// algorithm and checks that the figures are plausible.
func TestMemoryUsage(t *testing.T) {
	rows, err := MeasureMemory(context.Background(), redistest.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]KeyMemory{}
	for _, r := range rows {
		t.Logf("%-36s %d key(s) %6d bytes", r.Name, r.RedisKeys, r.Bytes)
		if r.Bytes <= 0 {
			t.Errorf("%s: %d bytes", r.Name, r.Bytes)
		}
		byName[r.Name] = r
	}
	small, large := byName["sliding_window_log (10 entries)"], byName["sliding_window_log (100 entries)"]
	if large.Bytes <= small.Bytes {
		t.Errorf("sliding log: 100 entries take %d bytes, 10 take %d", large.Bytes, small.Bytes)
	}
}
