// Package bench compares sluice with other Go rate limiters that keep their
// state in Redis, in one run, against the same Redis server, under the same
// load: many goroutines taking one unit at a time over a fixed set of
// distinct keys.
//
// It is a separate module so that the peers' dependencies stay out of
// sluice's own go.mod. The Go benchmarks (go test -bench .) are the record;
// cmd/compare runs the same contenders in interleaved rounds and prints a
// table, which is less sensitive to a noisy machine.
package bench

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"github.com/sethvargo/go-limiter/memorystore"
	"github.com/throttled/throttled/v2"
	"github.com/throttled/throttled/v2/store/goredisstore.v9"
	ulule "github.com/ulule/limiter/v3"
	ululeredis "github.com/ulule/limiter/v3/drivers/store/redis"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
)

// The comparison's load, as the project states it: 64 goroutines over
// 10,000 keys.
const (
	Goroutines = 64
	NumKeys    = 10_000
)

// Rate and Period are every contender's limit: 1,000 per second, burst
// 1,000. At the rates a single Redis sustains, spread over 10,000 keys, no
// key comes near it, so every call is allowed and takes the write path
// (the costlier one for every contender).
const (
	Rate   = 1000
	Period = time.Second
)

// The skewed comparison's load: Goroutines goroutines over ZipfKeys keys
// drawn from a Zipf distribution of exponent ZipfS (key k, counted from 1,
// drawn with probability proportional to k^-ZipfS: the hottest key gets
// about 18 % of the calls, the coldest about 0.009 %), under ZipfRate per
// Period, burst ZipfRate: more than any one key is asked for in these runs,
// so nearly every call is allowed.
const (
	ZipfKeys = 1_000
	ZipfS    = 1.1
	ZipfRate = 1_000_000
)

// LeaseStaleness are the leases' maximum stalenesses the skewed comparison
// runs by default: the bound's excess r × D is 5 % and 25 % of a period's
// budget, and a key is leased once a process asks for 4 units within D, so
// the longer D leases more of the cold keys.
var LeaseStaleness = []time.Duration{50 * time.Millisecond, 250 * time.Millisecond}

// ErrBench marks a failed comparison (a contender error or a wrong key set).
var ErrBench = errors.New("bench: comparison failed")

// TakeFunc takes one unit for key and reports whether it was allowed.
type TakeFunc func(ctx context.Context, key string) (bool, error)

// Contender is one rate limiter under test.
type Contender struct {
	// Name identifies the library and algorithm, such as "sluice/gcra".
	Name string
	// Peer is true for other libraries, false for sluice.
	Peer bool
	// New builds the limiter on client. Every key it writes starts with
	// prefix, so contenders never share state.
	New func(client redis.UniversalClient, prefix string) (TakeFunc, error)
}

// RedisContenders returns the contenders that keep state in Redis, peers
// first. sluice runs with its defaults (concurrent calls batched into
// pipelines) and, to show what batching adds, with every call sent alone
// (redisstore.Options.MaxBatch 1), as the peers send theirs.
func RedisContenders() []Contender {
	return []Contender{
		{Name: "redis_rate/gcra", Peer: true, New: newRedisRate(Rate)},
		{Name: "ulule/fixed_window", Peer: true, New: newUlule(Rate)},
		{Name: "throttled/gcra", Peer: true, New: newThrottled(Rate)},
		{Name: "sluice/gcra", New: newSluice(sluice.GCRA, Rate, 0)},
		{Name: "sluice/fixed_window", New: newSluice(sluice.FixedWindow, Rate, 0)},
		{Name: "sluice-unbatched/gcra", New: newSluice(sluice.GCRA, Rate, 1)},
		{Name: "sluice-unbatched/fixed_window", New: newSluice(sluice.FixedWindow, Rate, 1)},
	}
}

// ZipfContenders returns the contenders of the skewed comparison, all
// under ZipfRate per Period: the peers, then sluice without leases and
// with leases (lease.Store over the Redis store with its defaults, leases
// sized by demand) of at most each staleness, under GCRA and then under
// fixed windows. A leased contender is named like "sluice-lease-50ms/gcra".
func ZipfContenders(staleness ...time.Duration) []Contender {
	cs := []Contender{
		{Name: "redis_rate/gcra", Peer: true, New: newRedisRate(ZipfRate)},
		{Name: "ulule/fixed_window", Peer: true, New: newUlule(ZipfRate)},
		{Name: "throttled/gcra", Peer: true, New: newThrottled(ZipfRate)},
	}
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.FixedWindow} {
		cs = append(cs, Contender{Name: "sluice/" + a.String(), New: newSluice(a, ZipfRate, 0)})
		for _, d := range staleness {
			cs = append(cs, Contender{Name: fmt.Sprintf("sluice-lease-%v/%v", d, a), New: newSluiceLease(a, ZipfRate, d)})
		}
	}
	return cs
}

// MemoryContenders returns in-process limiters (the client is ignored):
// sethvargo/go-limiter has no Redis store, so it is compared with sluice's
// memory store instead.
func MemoryContenders() []Contender {
	return []Contender{
		{Name: "go-limiter/token_bucket", Peer: true, New: newGoLimiter},
		{Name: "sluice-memory/gcra", New: newSluiceMemory},
	}
}

// newFunc builds a contender on a client, its keys under a prefix.
type newFunc = func(client redis.UniversalClient, prefix string) (TakeFunc, error)

func newRedisRate(rate int) newFunc {
	return func(client redis.UniversalClient, prefix string) (TakeFunc, error) {
		l := redis_rate.NewLimiter(client)
		limit := redis_rate.Limit{Rate: rate, Burst: rate, Period: Period}
		return func(ctx context.Context, key string) (bool, error) {
			// redis_rate prepends its own fixed "rate:" to the key.
			r, err := l.Allow(ctx, prefix+key, limit)
			if err != nil {
				return false, err
			}
			return r.Allowed > 0, nil
		}, nil
	}
}

func newUlule(rate int64) newFunc {
	return func(client redis.UniversalClient, prefix string) (TakeFunc, error) {
		store, err := ululeredis.NewStoreWithOptions(client, ulule.StoreOptions{Prefix: strings.TrimSuffix(prefix, ":")})
		if err != nil {
			return nil, err
		}
		l := ulule.New(store, ulule.Rate{Period: Period, Limit: rate})
		return func(ctx context.Context, key string) (bool, error) {
			c, err := l.Get(ctx, key)
			if err != nil {
				return false, err
			}
			return !c.Reached, nil
		}, nil
	}
}

func newThrottled(rate int) newFunc {
	return func(client redis.UniversalClient, prefix string) (TakeFunc, error) {
		store, err := goredisstore.NewCtx(client, prefix)
		if err != nil {
			return nil, err
		}
		// MaxBurst is the burst beyond the first request: 999 means 1,000.
		q := throttled.RateQuota{MaxRate: throttled.PerSec(rate), MaxBurst: rate - 1}
		l, err := throttled.NewGCRARateLimiterCtx(store, q)
		if err != nil {
			return nil, err
		}
		// throttled updates a key by compare-and-set and gives up after 10
		// attempts by default, which a hot key at 64 goroutines exceeds:
		// let it retry as long as it takes, so it answers every call.
		l.SetMaxCASAttemptsLimit(1_000_000)
		return func(ctx context.Context, key string) (bool, error) {
			limited, _, err := l.RateLimitCtx(ctx, key, 1)
			return !limited, err
		}, nil
	}
}

func newSluice(a sluice.Algorithm, rate int64, maxBatch int) newFunc {
	return func(client redis.UniversalClient, prefix string) (TakeFunc, error) {
		store := redisstore.New(client, &redisstore.Options{Prefix: prefix, MaxBatch: maxBatch})
		return sluiceTake(store, a, rate)
	}
}

// newSluiceLease is sluice with leases of at most staleness over the Redis
// store with its defaults.
func newSluiceLease(a sluice.Algorithm, rate int64, staleness time.Duration) newFunc {
	return func(client redis.UniversalClient, prefix string) (TakeFunc, error) {
		store, err := lease.New(redisstore.New(client, &redisstore.Options{Prefix: prefix}), &lease.Options{MaxStaleness: staleness})
		if err != nil {
			return nil, err
		}
		return sluiceTake(store, a, rate)
	}
}

func newSluiceMemory(redis.UniversalClient, string) (TakeFunc, error) {
	// The sweeper is left on, as a user would run it.
	return sluiceTake(memory.New(nil), sluice.GCRA, Rate)
}

func sluiceTake(store sluice.Store, a sluice.Algorithm, rate int64) (TakeFunc, error) {
	l, err := sluice.NewLimiter(store, sluice.Limit{Algorithm: a, Rate: rate, Period: Period}, nil)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, key string) (bool, error) {
		d, err := l.Allow(ctx, key)
		return d.Allowed, err
	}, nil
}

func newGoLimiter(redis.UniversalClient, string) (TakeFunc, error) {
	store, err := memorystore.New(&memorystore.Config{Tokens: Rate, Interval: Period})
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, key string) (bool, error) {
		_, _, _, ok, err := store.Take(ctx, key)
		return ok, err
	}, nil
}

// Keys returns n distinct keys of the same length, and fails if they are not
// distinct: the key set must be what the figures claim.
func Keys(n int) ([]string, error) {
	keys := make([]string, n)
	seen := make(map[string]struct{}, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("user:%08d", i)
		seen[keys[i]] = struct{}{}
	}
	if len(seen) != n {
		return nil, fmt.Errorf("%w: %d distinct keys, want %d", ErrBench, len(seen), n)
	}
	return keys, nil
}

// KeySet hands out keys to many goroutines, and counts the distinct keys
// actually used, so a run can prove the key set is what it claims. Made by
// NewKeySet, it hands them out in strict rotation, so the first min(calls,
// len) calls use distinct keys; made by NewZipfKeySet, each goroutine draws
// them from a Zipf distribution.
type KeySet struct {
	keys  []string
	next  atomic.Uint64
	draws [][]int32 // Zipf: each walk's drawn indexes, replayed in a loop
	mu    sync.Mutex
	used  []uint64 // bitset over keys
}

// NewKeySet returns a KeySet over keys, which must be distinct (see Keys).
func NewKeySet(keys []string) *KeySet {
	return &KeySet{keys: keys, used: make([]uint64, (len(keys)+63)/64)}
}

// zipfDraws is how many indexes each of a Zipf KeySet's streams holds:
// drawn before the run, so drawing costs the timed loop nothing.
const zipfDraws = 1 << 16

// NewZipfKeySet returns a KeySet over keys (distinct, see Keys) whose walks
// draw key k (from 0) with probability proportional to (k+1)^-s, s > 1.
// There are streams seeded streams of draws, the same in every run; walks
// take them in turn.
func NewZipfKeySet(keys []string, s float64, streams int) *KeySet {
	set := NewKeySet(keys)
	set.draws = make([][]int32, streams)
	for i := range set.draws {
		z := rand.NewZipf(rand.New(rand.NewPCG(uint64(i), 1)), s, 1, uint64(len(keys)-1))
		d := make([]int32, zipfDraws)
		for j := range d {
			d[j] = int32(z.Uint64())
		}
		set.draws[i] = d
	}
	return set
}

// Walk returns one goroutine's view of s. It is not safe for concurrent use;
// call Done when the goroutine finishes.
func (s *KeySet) Walk() *Walk {
	w := &Walk{set: s, used: make([]uint64, len(s.used))}
	if s.draws != nil {
		w.draws = s.draws[(s.next.Add(1)-1)%uint64(len(s.draws))]
	}
	return w
}

// Distinct returns how many distinct keys finished walks used.
func (s *KeySet) Distinct() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, w := range s.used {
		n += bits.OnesCount64(w)
	}
	return n
}

// Walk is one goroutine's use of a KeySet. Its bookkeeping is local, so it
// adds no contention beyond the shared counter.
type Walk struct {
	set   *KeySet
	used  []uint64
	draws []int32 // Zipf: this walk's stream
	pos   int
}

// Key returns the next key in the rotation, or the next drawn.
func (w *Walk) Key() string {
	var i uint64
	if w.draws != nil {
		i = uint64(w.draws[w.pos])
		w.pos = (w.pos + 1) % len(w.draws)
	} else {
		i = (w.set.next.Add(1) - 1) % uint64(len(w.set.keys))
	}
	w.used[i>>6] |= 1 << (i & 63)
	return w.set.keys[i]
}

// Done merges the keys this walk used into its KeySet.
func (w *Walk) Done() {
	w.set.mu.Lock()
	defer w.set.mu.Unlock()
	for i, b := range w.used {
		w.set.used[i] |= b
	}
}

// Result is one timed run of a contender.
type Result struct {
	Name    string
	Calls   int64
	Allowed int64
	Keys    int // distinct keys used
	Elapsed time.Duration
}

// OpsPerSec is the run's throughput.
func (r Result) OpsPerSec() float64 { return float64(r.Calls) / r.Elapsed.Seconds() }

// Run drives take from goroutines goroutines over set's keys (a fresh
// KeySet each run) for about d and reports the throughput. A rotation must
// use as many distinct keys as it made calls, up to all of them. Any error
// stops the run.
func Run(ctx context.Context, name string, take TakeFunc, newSet func() *KeySet, goroutines int, d time.Duration) (Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	set := newSet()
	keys := set.keys
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		calls    int64
		allowed  int64
	)
	deadline := time.Now().Add(d)
	start := time.Now()
	for range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := set.Walk()
			defer w.Done()
			var n, ok int64
			var err error
			for time.Now().Before(deadline) && ctx.Err() == nil {
				var a bool
				if a, err = take(ctx, w.Key()); err != nil {
					cancel()
					break
				}
				n++
				if a {
					ok++
				}
			}
			mu.Lock()
			defer mu.Unlock()
			calls += n
			allowed += ok
			if err != nil && firstErr == nil {
				firstErr = fmt.Errorf("%w: %s: %w", ErrBench, name, err)
			}
		}()
	}
	wg.Wait()
	r := Result{Name: name, Calls: calls, Allowed: allowed, Keys: set.Distinct(), Elapsed: time.Since(start)}
	if firstErr != nil {
		return r, firstErr
	}
	if want := min(int(r.Calls), len(keys)); set.draws == nil && r.Keys != want {
		return r, fmt.Errorf("%w: %s used %d distinct keys, want %d", ErrBench, name, r.Keys, want)
	}
	return r, nil
}

// RedisCPU returns the CPU time the Redis server has used since it started
// (user and system, all threads), from INFO cpu. The difference across a run
// divided by the calls is Redis's cost per call, which a busy machine blurs
// far less than throughput; it counts every client of the server, so use a
// server of your own.
func RedisCPU(ctx context.Context, client redis.UniversalClient) (time.Duration, error) {
	info, err := client.Info(ctx, "cpu").Result()
	if err != nil {
		return 0, err
	}
	var total float64
	found := 0
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return 0, fmt.Errorf("%w: INFO cpu %s: %q", ErrBench, k, v)
		}
		total += f
		found++
	}
	if found != 2 {
		return 0, fmt.Errorf("%w: INFO cpu lacks used_cpu_sys or used_cpu_user", ErrBench)
	}
	return time.Duration(total * float64(time.Second)), nil
}

// Median returns the median of xs (the mean of the middle two for an even
// count). xs is sorted in place.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	m := len(xs) / 2
	if len(xs)%2 == 1 {
		return xs[m]
	}
	return (xs[m-1] + xs[m]) / 2
}
