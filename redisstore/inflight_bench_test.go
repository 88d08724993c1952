package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// BenchmarkInFlight measures, serially on one client and the server's
// clock, an Acquire and Release pair beside one GCRA Take: the yardstick is
// a pair at most twice a Take. The key holds 9 other holders, so the
// scripts count a realistic set.
//
// interleaved times a pair and a Take in each iteration, so that both see
// the same load on a shared machine, and reports their mean times and
// ratio (pair/take, at most 2 by the yardstick).
func BenchmarkInFlight(b *testing.B) {
	client := redistest.Client(b)
	ctx := context.Background()
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(b)})
	l := sluice.Concurrent(10, time.Minute)
	for _, h := range []string{"h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8", "h9"} {
		if d, err := store.Acquire(ctx, "k", l, 1, h); err != nil || !d.Allowed {
			b.Fatalf("Acquire(%s) = %+v, %v", h, d, err)
		}
	}
	rate := sluice.PerSecond(1000) // as BenchmarkTake; allowed or not, one script run
	pair := func(b *testing.B) {
		if d, err := store.Acquire(ctx, "k", l, 1, "me"); err != nil || !d.Allowed || d.InUse != 10 {
			b.Fatalf("Acquire = %+v, %v; want allowed, 10 in use", d, err)
		}
		if ok, err := store.Release(ctx, "k", "me"); err != nil || !ok {
			b.Fatalf("Release = %v, %v", ok, err)
		}
	}
	take := func(b *testing.B) {
		if _, err := store.Take(ctx, "t", rate, 1); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("acquire_release", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			pair(b)
		}
	})
	b.Run("take", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			take(b)
		}
	})
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
		b.ReportMetric(float64(inPair.Microseconds())/n, "pair-µs")
		b.ReportMetric(float64(inTake.Microseconds())/n, "take-µs")
		b.ReportMetric(float64(inPair)/float64(inTake), "pair/take")
	})
}
