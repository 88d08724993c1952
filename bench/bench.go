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
		{Name: "redis_rate/gcra", Peer: true, New: newRedisRate},
		{Name: "ulule/fixed_window", Peer: true, New: newUlule},
		{Name: "throttled/gcra", Peer: true, New: newThrottled},
		{Name: "sluice/gcra", New: newSluice(sluice.GCRA, 0)},
		{Name: "sluice/fixed_window", New: newSluice(sluice.FixedWindow, 0)},
		{Name: "sluice-unbatched/gcra", New: newSluice(sluice.GCRA, 1)},
		{Name: "sluice-unbatched/fixed_window", New: newSluice(sluice.FixedWindow, 1)},
	}
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

func newRedisRate(client redis.UniversalClient, prefix string) (TakeFunc, error) {
	l := redis_rate.NewLimiter(client)
	limit := redis_rate.Limit{Rate: Rate, Burst: Rate, Period: Period}
	return func(ctx context.Context, key string) (bool, error) {
		// redis_rate prepends its own fixed "rate:" to the key.
		r, err := l.Allow(ctx, prefix+key, limit)
		if err != nil {
			return false, err
		}
		return r.Allowed > 0, nil
	}, nil
}

func newUlule(client redis.UniversalClient, prefix string) (TakeFunc, error) {
	store, err := ululeredis.NewStoreWithOptions(client, ulule.StoreOptions{Prefix: strings.TrimSuffix(prefix, ":")})
	if err != nil {
		return nil, err
	}
	l := ulule.New(store, ulule.Rate{Period: Period, Limit: Rate})
	return func(ctx context.Context, key string) (bool, error) {
		c, err := l.Get(ctx, key)
		if err != nil {
			return false, err
		}
		return !c.Reached, nil
	}, nil
}

func newThrottled(client redis.UniversalClient, prefix string) (TakeFunc, error) {
	store, err := goredisstore.NewCtx(client, prefix)
	if err != nil {
		return nil, err
	}
	// MaxBurst is the burst beyond the first request: 999 means 1,000.
	q := throttled.RateQuota{MaxRate: throttled.PerSec(Rate), MaxBurst: Rate - 1}
	l, err := throttled.NewGCRARateLimiterCtx(store, q)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, key string) (bool, error) {
		limited, _, err := l.RateLimitCtx(ctx, key, 1)
		return !limited, err
	}, nil
}

func newSluice(a sluice.Algorithm, maxBatch int) func(redis.UniversalClient, string) (TakeFunc, error) {
	return func(client redis.UniversalClient, prefix string) (TakeFunc, error) {
		store := redisstore.New(client, &redisstore.Options{Prefix: prefix, MaxBatch: maxBatch})
		return sluiceTake(store, a)
	}
}

func newSluiceMemory(redis.UniversalClient, string) (TakeFunc, error) {
	// The sweeper is left on, as a user would run it.
	return sluiceTake(memory.New(nil), sluice.GCRA)
}

func sluiceTake(store sluice.Store, a sluice.Algorithm) (TakeFunc, error) {
	l, err := sluice.NewLimiter(store, sluice.Limit{Algorithm: a, Rate: Rate, Period: Period}, nil)
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

// KeySet hands out keys to many goroutines in strict rotation, so the first
// min(calls, len) calls use distinct keys, and counts the distinct keys
// actually used, so a run can prove the key set is what it claims.
type KeySet struct {
	keys []string
	next atomic.Uint64
	mu   sync.Mutex
	used []uint64 // bitset over keys
}

// NewKeySet returns a KeySet over keys, which must be distinct (see Keys).
func NewKeySet(keys []string) *KeySet {
	return &KeySet{keys: keys, used: make([]uint64, (len(keys)+63)/64)}
}

// Walk returns one goroutine's view of s. It is not safe for concurrent use;
// call Done when the goroutine finishes.
func (s *KeySet) Walk() *Walk { return &Walk{set: s, used: make([]uint64, len(s.used))} }

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
	set  *KeySet
	used []uint64
}

// Key returns the next key in the rotation.
func (w *Walk) Key() string {
	i := (w.set.next.Add(1) - 1) % uint64(len(w.set.keys))
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

// Run drives take from goroutines goroutines over keys for about d and
// reports the throughput. Any error stops the run.
func Run(ctx context.Context, name string, take TakeFunc, keys []string, goroutines int, d time.Duration) (Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	set := NewKeySet(keys)
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
	if r.Keys != len(keys) {
		return r, fmt.Errorf("%w: %s used %d distinct keys, want %d", ErrBench, name, r.Keys, len(keys))
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
