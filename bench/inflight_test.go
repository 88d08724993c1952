package bench

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// BenchmarkInFlight measures, serially on one goroutine, one client and the
// server's clock, an in-flight Acquire and Release pair beside one GCRA
// Take: the yardstick is a pair at most twice a Take (two round trips are
// unavoidable, so each call must cost about one Take). The key holds 9
// other holders, so the scripts count a realistic set.
//
// acquire_release and take also report Redis's CPU per op (redis-cpu-µs,
// from INFO cpu: use a server of your own). interleaved times a pair and a
// Take in each iteration, so that both see the same load on a shared
// machine, and reports their mean times and ratio (pair/take).
func BenchmarkInFlight(b *testing.B) {
	client := redistest.Client(b)
	ctx := context.Background()
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(b)})
	l := sluice.Concurrent(10, time.Hour) // outlasts a -count 10 run
	for _, h := range []string{"h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8", "h9"} {
		if d, err := store.Acquire(ctx, "k", l, 1, h); err != nil || !d.Allowed {
			b.Fatalf("Acquire(%s) = %+v, %v", h, d, err)
		}
	}
	// An admitted Take, which writes its key as an acquire and a release
	// do: a denied one writes nothing and is cheaper.
	rate := sluice.PerSecond(1_000_000)
	pair := func(b *testing.B) {
		if d, err := store.Acquire(ctx, "k", l, 1, "me"); err != nil || !d.Allowed || d.InUse != 10 {
			b.Fatalf("Acquire = %+v, %v; want allowed, 10 in use", d, err)
		}
		if ok, err := store.Release(ctx, "k", "me"); err != nil || !ok {
			b.Fatalf("Release = %v, %v", ok, err)
		}
	}
	take := func(b *testing.B) {
		if d, err := store.Take(ctx, "t", rate, 1); err != nil || !d.Allowed {
			b.Fatalf("Take = %+v, %v; want allowed", d, err)
		}
	}
	serial := func(op func(*testing.B)) func(*testing.B) {
		return func(b *testing.B) {
			b.ReportAllocs()
			before, err := RedisCPU(ctx, client)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				op(b)
			}
			after, err := RedisCPU(ctx, client)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64((after-before).Nanoseconds())/1e3/float64(b.N), "redis-cpu-µs")
		}
	}
	b.Run("acquire_release", serial(pair))
	b.Run("take", serial(take))
	b.Run("interleaved", func(b *testing.B) {
		var inPair, inTake time.Duration
		for b.Loop() {
			t0 := time.Now()
			pair(b)
			t1 := time.Now()
			take(b)
			inPair, inTake = inPair+t1.Sub(t0), inTake+time.Since(t1)
		}
		n := float64(b.N)
		b.ReportMetric(float64(inPair.Nanoseconds())/1e3/n, "pair-µs")
		b.ReportMetric(float64(inTake.Nanoseconds())/1e3/n, "take-µs")
		b.ReportMetric(float64(inPair)/float64(inTake), "pair/take")
	})
}
