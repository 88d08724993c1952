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
// clock, an Acquire and Release pair beside one GCRA Take: the issue's
// yardstick is a pair at most twice a Take. The key holds 9 other holders,
// so the scripts prune and count a realistic set.
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
	b.Run("acquire_release", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if d, err := store.Acquire(ctx, "k", l, 1, "me"); err != nil || !d.Allowed {
				b.Fatalf("Acquire = %+v, %v", d, err)
			}
			if ok, err := store.Release(ctx, "k", "me"); err != nil || !ok {
				b.Fatalf("Release = %v, %v", ok, err)
			}
		}
	})
	b.Run("take", func(b *testing.B) {
		b.ReportAllocs()
		rate := sluice.PerSecond(1000) // as BenchmarkTake; allowed or not, one script run
		for b.Loop() {
			if _, err := store.Take(ctx, "t", rate, 1); err != nil {
				b.Fatal(err)
			}
		}
	})
}
