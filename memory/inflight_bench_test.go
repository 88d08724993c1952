package memory_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// BenchmarkInFlight measures an Acquire and Release pair on one key beside
// 9 other holders, with a holder id made beforehand.
func BenchmarkInFlight(b *testing.B) {
	ctx := context.Background()
	s := memory.New(nil)
	defer s.Close()
	l := sluice.Concurrent(10, time.Minute)
	for _, h := range []string{"h1", "h2", "h3", "h4", "h5", "h6", "h7", "h8", "h9"} {
		if d, err := s.Acquire(ctx, "k", l, 1, h); err != nil || !d.Allowed {
			b.Fatalf("Acquire(%s) = %+v, %v", h, d, err)
		}
	}
	b.Run("acquire_release", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if d, err := s.Acquire(ctx, "k", l, 1, "me"); err != nil || !d.Allowed {
				b.Fatalf("Acquire = %+v, %v", d, err)
			}
			if ok, err := s.Release(ctx, "k", "me"); err != nil || !ok {
				b.Fatalf("Release = %v, %v", ok, err)
			}
		}
	})
	b.Run("acquire_release_alone", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if d, err := s.Acquire(ctx, "alone", l, 1, "me"); err != nil || !d.Allowed {
				b.Fatalf("Acquire = %+v, %v", d, err)
			}
			if ok, err := s.Release(ctx, "alone", "me"); err != nil || !ok {
				b.Fatalf("Release = %v, %v", ok, err)
			}
		}
	})
}
