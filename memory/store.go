// Package memory is sluice's in-process Store: exact, sharded, safe for
// concurrent use, with expired keys swept and a bound on the number of keys.
// It is the embedded default and the local fallback when Redis fails.
//
// Each algorithm lives in a file named like its Redis script
// (redisstore/scripts/gcra.lua beside gcra.go): both implement the same integer
// arithmetic and a differential test holds them to the same decisions.
package memory

import (
	"context"
	"errors"
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/tick"
)

var _ sluice.Store = (*Store)(nil)

// ErrZeroStore: the Store is a zero value, not one made by New. Every
// decision on it returns this error; it holds no keys.
var ErrZeroStore = errors.New("memory: zero Store: make one with New")

// Options configures a Store. A nil *Options gives every default.
type Options struct {
	// Clock returns the current time. Default: the monotonic clock,
	// anchored to the wall clock when the Store is made. Tests inject a fake
	// clock here.
	Clock func() time.Time

	// MaxKeys bounds the number of keys held, so a flood of random keys
	// cannot exhaust memory. When full, inserting a key evicts an expired
	// key or, failing that, the sampled key closest to expiry (which then
	// starts fresh). The bound is kept per shard (MaxKeys/Shards each,
	// rounded up), so one busy shard can evict before the store as a whole
	// is full. Default: 1,000,000.
	MaxKeys int

	// Shards is the number of independently locked partitions, rounded up
	// to a power of two. Default: 64.
	Shards int

	// SweepInterval is how often expired keys are removed. Default: one
	// minute. A negative value disables the sweeper (expired keys are still
	// treated as fresh, and are reclaimed on eviction).
	SweepInterval time.Duration
}

// Store is an in-memory sluice.Store, safe for concurrent use. Build one
// with New and Close it when done to stop its sweeper. The zero value
// refuses every decision with ErrZeroStore (its Len is 0; Close and Sweep
// do nothing).
type Store struct {
	now    func() int64 // µs since the Unix epoch
	seed   maphash.Seed
	mask   uint64
	shards []shard
	stop   chan struct{}
	done   sync.WaitGroup
	once   sync.Once
}

type shard struct {
	mu      sync.Mutex
	maps    [6]map[string]*state // one per sluice.Algorithm
	n       int
	maxKeys int
	slots   map[string]*slotKey // in-flight holders by key (inflight.go)
	_       [32]byte            // keep shards on separate cache lines
}

// state is one key's state. Its fields mean what the algorithm's file says.
// expires is when the state is fresh again (µs); zero marks a fresh state,
// the in-memory twin of a missing Redis key.
type state struct {
	a, b, c int64
	expires int64
	log     ring // sliding_window_log only
}

// New returns a Store. Close it to stop the sweeper.
func New(opts *Options) *Store {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MaxKeys <= 0 {
		o.MaxKeys = 1_000_000
	}
	if o.Shards <= 0 {
		o.Shards = 64
	}
	n := 1
	for n < o.Shards {
		n <<= 1
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = time.Minute
	}
	s := &Store{now: monotonicMicros(), seed: maphash.MakeSeed(), mask: uint64(n - 1), shards: make([]shard, n), stop: make(chan struct{})}
	if o.Clock != nil {
		clock := o.Clock
		s.now = func() int64 { return clock().UnixMicro() }
	}
	per := (o.MaxKeys + n - 1) / n
	for i := range s.shards {
		s.shards[i].maxKeys = per
		for a := range s.shards[i].maps {
			s.shards[i].maps[a] = make(map[string]*state)
		}
	}
	if o.SweepInterval > 0 {
		s.done.Add(1)
		go s.sweepLoop(o.SweepInterval)
	}
	return s
}

// Close stops the sweeper. The Store still answers afterwards.
func (s *Store) Close() error {
	if s.stop == nil {
		return nil // a zero Store: no sweeper
	}
	s.once.Do(func() { close(s.stop) })
	s.done.Wait()
	return nil
}

// Len returns the number of keys held, expired or not.
func (s *Store) Len() int {
	total := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		total += sh.n
		sh.mu.Unlock()
	}
	return total
}

func (s *Store) shardIndex(key string) uint64 { return maphash.String(s.seed, key) & s.mask }

func (s *Store) shard(key string) *shard { return &s.shards[s.shardIndex(key)] }

// monotonicMicros reads the monotonic clock, anchored to the wall clock
// once: cheaper than time.Now (one clock read, not two) and immune to wall
// clock steps, which is all one process's limiter needs.
func monotonicMicros() func() int64 {
	base := time.Now()
	baseUS := base.UnixMicro()
	return func() int64 { return baseUS + int64(time.Since(base)/time.Microsecond) }
}

// check validates a request and refuses a zero Store.
func (s *Store) check(key string, limit sluice.Limit, cost int64) error {
	if err := sluice.ValidateRequest(key, limit, cost); err != nil {
		return err
	}
	if s.shards == nil {
		return ErrZeroStore
	}
	return nil
}

// Take implements sluice.Store.
func (s *Store) Take(_ context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	if err := s.check(key, limit, cost); err != nil {
		return sluice.Decision{}, err
	}
	p := newParams(limit)
	sh := s.shard(key)
	m := sh.maps[limit.Algorithm]
	sh.mu.Lock()
	now := s.now()
	st := m[key]
	if st == nil {
		var fresh state
		r := decide(&fresh, now, &p, cost, true)
		if r.allowed {
			fresh.expires = now + r.reset
			sh.insert(m, key, &fresh, now)
		}
		sh.mu.Unlock()
		return r.decision(limit), nil
	}
	if st.expires <= now { // expired but not yet swept: fresh again
		st.a, st.b, st.c, st.expires = 0, 0, 0, 0
		st.log.clear()
	}
	r := decide(st, now, &p, cost, true)
	if r.allowed {
		st.expires = now + r.reset
	}
	sh.mu.Unlock()
	return r.decision(limit), nil
}

// Peek implements sluice.Store.
func (s *Store) Peek(_ context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	if err := s.check(key, limit, cost); err != nil {
		return sluice.Decision{}, err
	}
	p := newParams(limit)
	sh := s.shard(key)
	sh.mu.Lock()
	now := s.now()
	var cp state
	if st := sh.maps[limit.Algorithm][key]; st != nil && st.expires > now {
		cp = *st // the log is only read when commit is false
	}
	r := decide(&cp, now, &p, cost, false)
	sh.mu.Unlock()
	return r.decision(limit), nil
}

// Reset implements sluice.Store.
func (s *Store) Reset(_ context.Context, key string, limit sluice.Limit) error {
	if err := sluice.ValidateKey(key); err != nil {
		return err
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if s.shards == nil {
		return ErrZeroStore
	}
	sh := s.shard(key)
	sh.mu.Lock()
	if _, ok := sh.maps[limit.Algorithm][key]; ok {
		delete(sh.maps[limit.Algorithm], key)
		sh.n--
	}
	sh.mu.Unlock()
	return nil
}

// insert adds st under key, evicting first if the shard is full.
func (sh *shard) insert(m map[string]*state, key string, st *state, now int64) {
	if sh.n >= sh.maxKeys {
		sh.evict(m, now)
	}
	m[key] = st
	sh.n++
}

// evict removes one key: the first expired one among a small random sample
// (map iteration starts at a random place), else the sample's soonest to
// expire, as Redis's volatile-ttl policy does.
func (sh *shard) evict(prefer map[string]*state, now int64) {
	const sample = 5
	var (
		victim  string
		vmap    map[string]*state
		soonest int64
		seen    int
	)
	try := func(m map[string]*state) bool {
		for k, st := range m {
			if vmap == nil || st.expires < soonest {
				victim, vmap, soonest = k, m, st.expires
			}
			seen++
			if st.expires <= now || seen >= sample {
				return true
			}
		}
		return false
	}
	if !try(prefer) {
		for _, m := range sh.maps {
			if try(m) {
				break
			}
		}
	}
	if vmap != nil {
		delete(vmap, victim)
		sh.n--
	}
}

func (s *Store) sweepLoop(every time.Duration) {
	defer s.done.Done()
	tick.Every(s.stop, every, s.Sweep)
}

// Sweep removes expired keys now. The sweeper calls it periodically.
func (s *Store) Sweep() {
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		now := s.now()
		sh.sweepSlots(now)
		for _, m := range sh.maps {
			for k, st := range m {
				if st.expires <= now {
					delete(m, k)
					sh.n--
				}
			}
		}
		sh.mu.Unlock()
	}
}
