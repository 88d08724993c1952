package bench

import (
	"context"
	"math/bits"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sethvargo/go-limiter/memorystore"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
)

// memKeys is the memory comparison's key set: 100,000 distinct keys, every
// one of them held by the store before the timed loop starts.
const memKeys = 100_000

// memContender is one in-process limiter under test.
type memContender struct {
	name string
	new  func(b *testing.B) memLimiter
}

// memLimiter is a memContender made: take decides one unit for key; held,
// when not nil, says how many keys it holds; local, when not nil, how many
// decisions it has answered from a lease.
type memLimiter struct {
	take  func(context.Context, string) bool
	held  func() int
	local func() uint64
}

// memRate per memPeriod is every memory contender's limit: 1,000 a second
// on average, burst 60,000, so every call is allowed. The period is long so
// that a lease may live as long (a lease lives at most a period): the timed
// loop comes back to each key only every 0.1–0.2 s.
const (
	memRate   = 60 * Rate
	memPeriod = time.Minute
)

var memLimit = sluice.Limit{Rate: memRate, Period: memPeriod}

// The leases of the memory comparison live a period and are of a fixed
// size, 100 units, so the timed loop finds a live lease on 99 calls in
// 100 without waiting for the demand estimate to size one.
const (
	leaseStaleness = memPeriod
	leaseSize      = 100
)

func memContenders() []memContender {
	return []memContender{
		{"go-limiter", func(b *testing.B) memLimiter {
			s, err := memorystore.New(&memorystore.Config{Tokens: memRate, Interval: memPeriod, InitialAlloc: memKeys})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close(context.Background()) })
			return memLimiter{take: func(ctx context.Context, key string) bool {
				_, _, _, ok, err := s.Take(ctx, key)
				return ok && err == nil
			}}
		}},
		{"map-mutex-gcra", func(b *testing.B) memLimiter {
			g := NewMapGCRA(memRate, memPeriod)
			return memLimiter{take: func(_ context.Context, key string) bool { return g.Take(key).Allowed }, held: g.Len}
		}},
		{"sluice-memory", func(b *testing.B) memLimiter {
			s := memory.New(nil)
			b.Cleanup(func() { s.Close() })
			return memLimiter{take: func(ctx context.Context, key string) bool {
				d, err := s.Take(ctx, key, memLimit, 1)
				return d.Allowed && err == nil
			}, held: s.Len}
		}},
		{"sluice-lease", func(b *testing.B) memLimiter {
			m := memory.New(nil)
			s, err := lease.New(m, &lease.Options{MaxStaleness: leaseStaleness, Size: leaseSize})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(func() { s.Close(context.Background()); m.Close() })
			// The memory store holds every key; a lease may have been swept.
			return memLimiter{take: func(ctx context.Context, key string) bool {
				d, err := s.Take(ctx, key, memLimit, 1)
				return d.Allowed && err == nil
			}, held: m.Len, local: func() uint64 { return s.Stats().Local }}
		}},
	}
}

// BenchmarkMemoryStore compares sluice's memory store, and leases over it,
// with sethvargo/go-limiter's memorystore and a bare map-plus-mutex GCRA
// (MapGCRA): one unit per call over 100,000 distinct keys that every
// contender already holds, serially and on GOMAXPROCS goroutines. The keys
// arrive in one order and are then walked in a seeded random one, as
// traffic comes back to its keys; the -arrival modes walk them in the
// order they arrived, which lets the hardware prefetch whatever a store
// keeps in arrival order (go-limiter's buckets, a lease), a pattern real
// traffic does not have, kept because earlier figures used it. Each
// row reports the share of its calls allowed and its process CPU time per
// call (cpu-ns/op, which other processes on a busy machine inflate far less
// than ns/op); each sluice row its ns/op and cpu-ns/op over go-limiter's
// (x-go-limiter, x-go-limiter-cpu) and over the baseline's (x-map-mutex,
// x-map-mutex-cpu) from the same run; the leased row the share of its calls
// answered from a lease (local/op).
func BenchmarkMemoryStore(b *testing.B) {
	keys, walks := memWalks(b)
	for _, mode := range memModes {
		walk := walks[mode]
		b.Run(mode, func(b *testing.B) {
			nsop, cpuop := map[string]float64{}, map[string]float64{} // ns/op and cpu-ns/op by contender
			for _, c := range memContenders() {
				b.Run(c.name, func(b *testing.B) {
					l := c.new(b)
					ctx := context.Background()
					for _, k := range keys {
						l.take(ctx, k)
					}
					if l.held != nil {
						if got := l.held(); got != memKeys {
							b.Fatalf("holds %d keys, want %d", got, memKeys)
						}
					}
					var local0 uint64
					if l.local != nil {
						local0 = l.local()
					}
					cpu := ProcessCPU()
					var ns float64
					if strings.HasPrefix(mode, "serial") {
						ns = memSerial(b, walk, l.take)
					} else {
						ns = memParallel(b, walk, l.take)
					}
					cpuNS := float64(ProcessCPU()-cpu) / float64(b.N)
					if l.local != nil {
						b.ReportMetric(float64(l.local()-local0)/float64(b.N), "local/op")
					}
					b.ReportMetric(cpuNS, "cpu-ns/op")
					nsop[c.name], cpuop[c.name] = ns, cpuNS
					for _, base := range []struct{ name, unit string }{{"go-limiter", "x-go-limiter"}, {"map-mutex-gcra", "x-map-mutex"}} {
						if nsop[base.name] > 0 && c.name != base.name {
							b.ReportMetric(ns/nsop[base.name], base.unit)
							b.ReportMetric(cpuNS/cpuop[base.name], base.unit+"-cpu")
						}
					}
				})
			}
		})
	}
}

// memModes are the memory comparison's walks: serial or on GOMAXPROCS
// goroutines, over the keys in a seeded random order or in arrival order.
var memModes = []string{"serial", "parallel", "serial-arrival", "parallel-arrival"}

// memWalks returns the keys in arrival order and each mode's walk over them.
func memWalks(b *testing.B) ([]string, map[string][]string) {
	keys, err := Keys(memKeys)
	if err != nil {
		b.Fatal(err)
	}
	shuffled := append([]string(nil), keys...)
	r := rand.New(rand.NewPCG(1, 2))
	r.Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	walks := map[string][]string{}
	for _, mode := range memModes {
		walks[mode] = shuffled
		if strings.HasSuffix(mode, "-arrival") {
			walks[mode] = keys
		}
	}
	return keys, walks
}

// memWalk is one goroutine's walk over the keys, from start on, counting
// its calls, the ones allowed and the keys used.
type memWalk struct {
	keys       []string
	i          int
	calls, oks int
	used       []uint64 // bitset over keys
}

func newMemWalk(keys []string, start int) *memWalk {
	return &memWalk{keys: keys, i: start % len(keys), used: make([]uint64, (len(keys)+63)/64)}
}

func (w *memWalk) step(ctx context.Context, take func(context.Context, string) bool) {
	if take(ctx, w.keys[w.i]) {
		w.oks++
	}
	w.used[w.i>>6] |= 1 << (w.i & 63)
	w.calls++
	if w.i++; w.i == len(w.keys) {
		w.i = 0
	}
}

func memSerial(b *testing.B, keys []string, take func(context.Context, string) bool) float64 {
	ctx := context.Background()
	w := newMemWalk(keys, 0)
	b.ReportAllocs()
	for b.Loop() {
		w.step(ctx, take)
	}
	return memReport(b, w.calls, w.oks, w.used, min(w.calls, len(keys)))
}

// memParallel is memSerial on GOMAXPROCS goroutines, each walking the keys
// from its own place in them.
func memParallel(b *testing.B, keys []string, take func(context.Context, string) bool) float64 {
	ctx := context.Background()
	var (
		mu         sync.Mutex
		used       = make([]uint64, (len(keys)+63)/64)
		calls, oks int
		worker     atomic.Int64
	)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := newMemWalk(keys, int(worker.Add(1)*7919))
		for pb.Next() {
			w.step(ctx, take)
		}
		mu.Lock()
		defer mu.Unlock()
		calls += w.calls
		oks += w.oks
		for j, u := range w.used {
			used[j] |= u
		}
	})
	// Each goroutine's walk is contiguous, so together they cover at least
	// as many keys as the busiest one called.
	return memReport(b, calls, oks, used, 0)
}

// memReport reports the share allowed and the distinct keys used, fails
// when fewer than want keys were used, and returns ns/op.
func memReport(b *testing.B, n, allowed int, used []uint64, want int) float64 {
	distinct := 0
	for _, w := range used {
		distinct += bits.OnesCount64(w)
	}
	if distinct < want {
		b.Fatalf("used %d distinct keys, want %d", distinct, want)
	}
	b.ReportMetric(float64(allowed)/float64(max(n, 1)), "allowed/op")
	b.ReportMetric(float64(distinct), "keys")
	return float64(b.Elapsed().Nanoseconds()) / float64(max(b.N, 1))
}
