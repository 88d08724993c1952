package lease_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
)

// BenchmarkLocal is a decision answered from a live lease: the local path,
// one goroutine and parallel, beside the memory store's own decision on
// a key of the same limit. The lease is large enough never to run out in
// the timed loop, and the memory store's key never denies.
func BenchmarkLocal(b *testing.B) {
	m := memory.New(&memory.Options{SweepInterval: -1})
	b.Cleanup(func() { m.Close() })
	l := sluice.Limit{Rate: 1e9, Period: time.Hour}
	s, err := lease.New(m, &lease.Options{MaxStaleness: time.Hour, Size: 5e8})
	if err != nil {
		b.Fatal(err)
	}
	if d, err := s.Take(ctx, "hot", l, 1); err != nil || !d.Allowed {
		b.Fatal(d, err)
	}
	for _, c := range []struct {
		name, key string
		store     sluice.Store
	}{{"lease", "hot", s}, {"memory", "mem", m}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				c.store.Take(ctx, c.key, l, 1)
			}
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					c.store.Take(ctx, c.key, l, 1)
				}
			})
		})
	}
	if got := s.Stats(); got.Grants != 1 {
		b.Fatalf("%d grants: the lease ran out", got.Grants)
	}
}
