package bench

import (
	"context"
	"runtime"
	"runtime/metrics"
	"slices"
	"strings"
	"testing"
)

// BenchmarkMemoryStoreRounds measures what BenchmarkMemoryStore does, in
// rounds: every contender is built once, and each round walks all 100,000
// keys with each contender in turn, the order rotating from round to
// round, so that a change of the machine's load between contenders (other
// processes, other virtual machines sharing its caches) falls on all of
// them alike instead of on whichever ran at the time. One b.Loop
// iteration is one round (ns/op is a round's, all contenders together).
// Each row reports, per contender, the median over the rounds of its
// process CPU time per decision (NAME-cpu-ns) and its allocations per
// decision (NAME-allocs); for each sluice contender the median over the
// rounds of its time over go-limiter's and over the baseline's in the
// same round (NAME-x-go-limiter, NAME-x-map-mutex); the leased row also
// over the memory store's (sluice-lease-x-memory). Use -benchtime Nx for N
// rounds.
func BenchmarkMemoryStoreRounds(b *testing.B) {
	keys, walks := memWalks(b)
	for _, mode := range memModes {
		walk := walks[mode]
		parallel := strings.HasPrefix(mode, "parallel")
		b.Run(mode, func(b *testing.B) {
			cs := memContenders()
			ls := make([]memLimiter, len(cs))
			ctx := context.Background()
			for i, c := range cs {
				ls[i] = c.new(b)
				for _, k := range keys {
					ls[i].take(ctx, k)
				}
				if ls[i].held != nil {
					if got := ls[i].held(); got != memKeys {
						b.Fatalf("%s holds %d keys, want %d", c.name, got, memKeys)
					}
				}
			}
			cpu := make([][]float64, len(cs)) // per contender, per round: CPU ns per decision
			allocs := make([]uint64, len(cs))
			var w *memWorkers
			if parallel {
				w = newMemWorkers(ctx, walk, runtime.GOMAXPROCS(0))
				defer w.stop()
			}
			denied := 0
			round := 0
			for b.Loop() {
				for j := range cs {
					k := (j + round) % len(cs)
					a0, start := heapAllocs(), ProcessCPU()
					if w != nil {
						denied += w.round(ls[k].take)
					} else {
						denied += memWalkOnce(ctx, walk, ls[k].take)
					}
					cpuNS := float64(ProcessCPU()-start) / float64(len(walk))
					allocs[k] += heapAllocs() - a0
					cpu[k] = append(cpu[k], cpuNS)
				}
				round++
			}
			if denied > 0 {
				b.Fatalf("%d calls denied: every call must be allowed", denied)
			}
			idx := map[string]int{}
			for i, c := range cs {
				idx[c.name] = i
			}
			ratio := func(a, base string) float64 {
				rs := make([]float64, round)
				for i := range rs {
					rs[i] = cpu[idx[a]][i] / cpu[idx[base]][i]
				}
				return median(rs)
			}
			for i, c := range cs {
				b.ReportMetric(median(cpu[i]), c.name+"-cpu-ns")
				b.ReportMetric(float64(allocs[i])/float64(round*len(walk)), c.name+"-allocs")
			}
			for _, c := range cs {
				if strings.HasPrefix(c.name, "sluice") {
					b.ReportMetric(ratio(c.name, "go-limiter"), c.name+"-x-go-limiter")
					b.ReportMetric(ratio(c.name, "map-mutex-gcra"), c.name+"-x-map-mutex")
				}
			}
			b.ReportMetric(ratio("sluice-lease", "sluice-memory"), "sluice-lease-x-memory")
		})
	}
}

// memWalkOnce walks keys once with take and returns the calls denied.
func memWalkOnce(ctx context.Context, keys []string, take func(context.Context, string) bool) int {
	denied := 0
	for _, k := range keys {
		if !take(ctx, k) {
			denied++
		}
	}
	return denied
}

// memWorkers walk the keys on n goroutines started once, each its own
// contiguous part, so that a round allocates nothing of its own.
type memWorkers struct {
	take  func(context.Context, string) bool // the round's; set before the starts are sent
	start []chan struct{}
	done  chan int
}

func newMemWorkers(ctx context.Context, keys []string, n int) *memWorkers {
	w := &memWorkers{start: make([]chan struct{}, n), done: make(chan int, n)}
	for g := range n {
		w.start[g] = make(chan struct{})
		part := keys[g*len(keys)/n : (g+1)*len(keys)/n]
		go func() {
			for range w.start[g] {
				w.done <- memWalkOnce(ctx, part, w.take)
			}
		}()
	}
	return w
}

// round walks every part with take and returns the calls denied.
func (w *memWorkers) round(take func(context.Context, string) bool) int {
	w.take = take
	for _, s := range w.start {
		s <- struct{}{}
	}
	denied := 0
	for range w.start {
		denied += <-w.done
	}
	return denied
}

func (w *memWorkers) stop() {
	for _, s := range w.start {
		close(s)
	}
}

// heapAllocs is the number of heap objects allocated so far.
func heapAllocs() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/allocs:objects"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// median returns the median of xs (0 for none).
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}
