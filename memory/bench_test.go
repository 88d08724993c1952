package memory_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// numKeys is the size of the wide key set. The key strings are made once,
// before any timing, and every benchmark checks with Store.Len that the
// store really holds that many keys: a benchmark that claims 100,000 keys
// but hits one measures a hot key twice.
const numKeys = 100_000

var benchKeys = sync.OnceValue(func() []string {
	keys := make([]string, numKeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%06d", i)
	}
	return keys
})

// benchLimit is 100 units per second under a. The sliding log keeps up to
// 100 entries per key (80 MB over the wide key set).
func benchLimit(a sluice.Algorithm) sluice.Limit {
	return sluice.Limit{Algorithm: a, Rate: 100, Period: time.Second}
}

type keySet struct {
	name string
	keys func() []string
}

var keySets = []keySet{
	{"hot", func() []string { return []string{"hot"} }},
	{"100k", benchKeys},
}

// warmStore returns a store in which every key already exists and is fresh
// again, so the timed loop measures the steady-state hot path and never
// inserts. It takes each key's full capacity an hour in the past: the state
// is allocated (the sliding log's ring at its full size) and has expired by
// the time the clock returns to now. The sweeper is off so no key leaves.
func warmStore(b *testing.B, l sluice.Limit, keys []string) *memory.Store {
	b.Helper()
	past := true
	s := memory.New(&memory.Options{
		SweepInterval: -1,
		Clock: func() time.Time {
			if past { // written only before the timed goroutines start
				return time.Now().Add(-time.Hour)
			}
			return time.Now()
		},
	})
	b.Cleanup(func() { s.Close() })
	ctx := context.Background()
	for _, k := range keys {
		if d, err := s.Take(ctx, k, l, l.Capacity()); err != nil || !d.Allowed {
			b.Fatalf("warm %q: %+v, %v", k, d, err)
		}
	}
	past = false
	checkLen(b, s, len(keys))
	return s
}

func checkLen(b *testing.B, s *memory.Store, want int) {
	b.Helper()
	if got := s.Len(); got != want {
		b.Fatalf("store holds %d keys, want %d", got, want)
	}
}

// takeFunc is one rate-limit call, so the Store and the Limiter share the
// benchmark loops.
type takeFunc func(ctx context.Context, key string) (sluice.Decision, error)

// benchParallel is storetest.BenchSerial on GOMAXPROCS goroutines, each starting at a
// different place in keys.
func benchParallel(b *testing.B, keys []string, take takeFunc) {
	ctx := context.Background()
	var allowed, n atomic.Int64
	var worker atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := int(worker.Add(1)*7919) % len(keys)
		var ok, calls int64
		for pb.Next() {
			d, err := take(ctx, keys[i])
			if err != nil {
				b.Error(err)
				return
			}
			if d.Allowed {
				ok++
			}
			calls++
			if i++; i == len(keys) {
				i = 0
			}
		}
		allowed.Add(ok)
		n.Add(calls)
	})
	b.ReportMetric(float64(allowed.Load())/float64(max(n.Load(), 1)), "allowed/op")
}

// BenchmarkTake measures Store.Take for every algorithm on one hot key and
// over 100,000 keys, serially and on GOMAXPROCS goroutines. The hot path
// (existing key) must allocate nothing.
func BenchmarkTake(b *testing.B) {
	for _, a := range sluice.Algorithms() {
		b.Run(a.String(), func(b *testing.B) {
			l := benchLimit(a)
			for _, ks := range keySets {
				b.Run(ks.name, func(b *testing.B) {
					keys := ks.keys()
					s := warmStore(b, l, keys)
					take := func(ctx context.Context, key string) (sluice.Decision, error) {
						return s.Take(ctx, key, l, 1)
					}
					b.Run("serial", func(b *testing.B) { storetest.BenchSerial(b, context.Background(), keys, take) })
					b.Run("parallel", func(b *testing.B) { benchParallel(b, keys, take) })
					checkLen(b, s, len(keys))
				})
			}
		})
	}
}

// BenchmarkLimiterAllow measures sluice.Limiter.Allow over the memory store
// with GCRA: the library's front door, key validation included. An empty
// prefix costs no allocation; a prefix costs one for the joined key.
func BenchmarkLimiterAllow(b *testing.B) {
	l := benchLimit(sluice.GCRA)
	for _, prefix := range []string{"", "api:"} {
		name := "noprefix"
		if prefix != "" {
			name = "prefix"
		}
		b.Run(name, func(b *testing.B) {
			for _, ks := range keySets {
				b.Run(ks.name, func(b *testing.B) {
					keys := ks.keys()
					stored := make([]string, len(keys))
					for i, k := range keys {
						stored[i] = prefix + k
					}
					s := warmStore(b, l, stored)
					lim, err := sluice.NewLimiter(s, l, &sluice.Options{Prefix: prefix})
					if err != nil {
						b.Fatal(err)
					}
					b.Run("serial", func(b *testing.B) { storetest.BenchSerial(b, context.Background(), keys, lim.Allow) })
					b.Run("parallel", func(b *testing.B) { benchParallel(b, keys, lim.Allow) })
					checkLen(b, s, len(keys))
				})
			}
		})
	}
}
