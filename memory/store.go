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
	"fmt"
	"hash/maphash"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/holdmax"
	"github.com/sluicehq/sluice/internal/table"
	"github.com/sluicehq/sluice/internal/tick"
)

var _ sluice.Store = (*Store)(nil)

// ErrZeroStore: the Store is a zero value, not one made by New. Every
// decision on it returns this error (which is also sluice.ErrStoreNotBuilt);
// it holds no keys.
var ErrZeroStore = fmt.Errorf("memory: zero Store: make one with New: %w", sluice.ErrStoreNotBuilt)

// ErrInvalidOptions: New was given a negative MaxKeys or Shards (0 means
// the default). The Store it returned refuses every decision with it
// (which is also sluice.ErrStoreNotBuilt), as a zero Store does with
// ErrZeroStore, so a limiter built on it fails at NewLimiter.
var ErrInvalidOptions = fmt.Errorf("memory: invalid options: %w", sluice.ErrStoreNotBuilt)

// ErrFull: Acquire found MaxKeys keys with in-flight state in the key's
// shard, none of a small sample without live holders, and refused to add
// another. A key with live holders is never dropped: that would free slots
// still in use.
var ErrFull = errors.New("memory: full")

// DefaultMaxKeys is Options.MaxKeys's default.
const DefaultMaxKeys = 1_000_000

// MaxShards bounds Options.Shards. Every shard is allocated up front, so
// more than this would cost memory for no less lock contention.
const MaxShards = 1 << 16

// Options configures a Store. A nil *Options gives every default.
type Options struct {
	// Clock returns the current time. Default: the monotonic clock,
	// anchored to the wall clock when the Store is made. Tests inject a fake
	// clock here.
	Clock func() time.Time

	// MaxKeys bounds the number of keys held, so a flood of random keys
	// cannot exhaust memory. When full, inserting a key evicts one of a
	// few keys sampled (see evict): an expired one, else the one that had
	// taken the smallest share of its limit, else the soonest to expire.
	// An evicted key starts fresh, so it may admit again what it had
	// taken: at most its limit's capacity. The bound is kept per shard (MaxKeys/Shards each,
	// rounded up), so one busy shard can evict before the store as a whole
	// is full; a TakeAll never evicts its own keys, so it may leave a shard
	// over its bound by fewer keys than it has. Keys with in-flight slots are bounded apart, by the same
	// number: at the cap, a new key takes the place of a sampled key
	// without live holders, or its Acquire fails with ErrFull; a key with
	// live holders is never dropped. Any positive int is valid, up to
	// math.MaxInt (in effect no bound); a negative one is refused
	// (ErrInvalidOptions). Default (0): 1,000,000. A rate-limited
	// key costs a slot in a table kept 41 % to 81 % full: under GCRA (the
	// default algorithm) a 32-byte slot, 40 to 79 bytes besides its string;
	// under another a 64-byte one, 79 to 158 bytes; the sliding window log
	// adds its log.
	// A sweep that leaves a shard's table less than an eighth full
	// shrinks it, so a burst of keys gives its memory back once expired.
	MaxKeys int

	// Shards is the number of independently locked partitions, rounded up
	// to a power of two, at most MaxShards (a larger value is MaxShards);
	// a negative one is refused (ErrInvalidOptions). Default (0): 64.
	Shards int

	// SweepInterval is how often expired keys are removed. Default: one
	// minute. A negative value disables the sweeper (expired keys are still
	// treated as fresh, and are reclaimed on eviction).
	SweepInterval time.Duration
}

// Store is an in-memory sluice.Store, safe for concurrent use. Build one
// with New and Close it when done to stop its sweeper. The zero value, and
// a nil *Store alike, refuses every decision with ErrZeroStore (its Len is
// 0; Close and Sweep do nothing); one New was given invalid options
// refuses them with ErrInvalidOptions, naming the option.
type Store struct {
	maxKeys int              // Options.MaxKeys, or its default
	clock   func() time.Time // Options.Clock; nil reads the monotonic clock
	base    time.Time        // the monotonic clock's anchor
	baseUS  int64            // base, µs since the Unix epoch
	limits  limitCache
	seed    maphash.Seed
	mask    uint64
	shards  []shard
	stop    chan struct{}
	done    sync.WaitGroup
	once    sync.Once

	bad         error            // New's options were invalid: shards is nil
	sweepPaused func(walked int) // tests: called between a sweep's chunks, the lock released

	// tombLife is the longest hold the Store's acquires and extends have
	// asked for: how long a release that finds no holder keeps its
	// tombstone (inflight.go).
	tombLife holdmax.Max
}

type shard struct {
	mu      sync.Mutex
	gcra    table.Table[gcraState] // GCRA's keys (entry.go), tagged by tagOf
	tab     table.Table[state]     // every other algorithm's keys, tagged by tagOf
	n       int                    // live keys in both
	maxKeys int
	slots   map[string]*slotKey // in-flight holders by key (inflight.go)
	resets  map[resetKey]mark   // recent Resets, which returns must not undo (grant.go)
	// evicted and exhausted count evictions (see Evictions): written under
	// mu, read without it.
	evicted, exhausted atomic.Uint64
	_                  [64]byte // keep shards on separate cache lines
}

// state is one key's state. Its fields mean what the algorithm's file says.
// expires is when the state is fresh again (µs); zero marks a fresh state,
// the in-memory twin of a missing Redis key.
//
// The log is behind a pointer so that a state, padded to 48 bytes, and
// the table's 16 make one cache line per slot. A GCRA key's table keeps
// only a and fill (gcraState): half a line.
//
// c is the sliding window counter's previous count, at most sluice.MaxRate,
// so 32 bits hold it and leave room for fill.
type state struct {
	a, b    int64
	c       int32
	fill    uint32 // the share of its limit the key had taken (see fillOf)
	expires int64
	log     *ring // sliding_window_log only; nil until it logs a unit
	_       int64 // a slot of a whole cache line (internal/table)
}

// clear makes st fresh, keeping the log's buffer.
func (st *state) clear() {
	st.a, st.b, st.c, st.fill, st.expires = 0, 0, 0, 0, 0
	if st.log != nil {
		st.log.clear()
	}
}

// fillFull marks the fill of a key that had taken its whole limit (one
// being denied, or a Penalty block): fillFull | its capacity, so that
// among such keys the one whose eviction admits the fewest units goes
// first. Every other fill is at most 2³⁰.
const fillFull = 1 << 31

// fillOf is the share of its limit a key has taken after decision r: what
// evicting it would let it admit again (eviction's cost), relative to the
// limit, in units of 2⁻³⁰. It keeps its value until the key's next
// decision, so for a key left alone it overstates what the key has taken
// now, never understates it.
func fillOf(r *result, p *params) uint32 {
	taken := p.capacity - r.remaining
	switch {
	case taken >= p.capacity:
		return fillFull | uint32(min(p.capacity, fillFull-1))
	case taken <= 0:
		return 0
	}
	return uint32(uint64(taken) * p.fillPer >> 32)
}

// New returns a Store. Close it to stop the sweeper.
func New(opts *Options) *Store {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.MaxKeys < 0 || o.Shards < 0 {
		return &Store{bad: fmt.Errorf("%w: MaxKeys %d, Shards %d: neither may be negative (0 means the default)", ErrInvalidOptions, o.MaxKeys, o.Shards)}
	}
	if o.MaxKeys == 0 {
		o.MaxKeys = DefaultMaxKeys
	}
	if o.Shards == 0 {
		o.Shards = 64
	}
	// Clamped first: rounding a larger value up to a power of two would
	// overflow (and never end), or allocate without bound.
	o.Shards = min(o.Shards, MaxShards)
	n := 1
	for n < o.Shards {
		n <<= 1
	}
	if o.SweepInterval == 0 {
		o.SweepInterval = time.Minute
	}
	base := time.Now()
	s := &Store{maxKeys: o.MaxKeys, clock: o.Clock, base: base, baseUS: base.UnixMicro(), seed: maphash.MakeSeed(), mask: uint64(n - 1), shards: make([]shard, n), stop: make(chan struct{})}
	// MaxKeys/n rounded up, without MaxKeys+n-1, which overflows near
	// math.MaxInt into a negative bound.
	per := o.MaxKeys / n
	if o.MaxKeys%n != 0 {
		per++
	}
	for i := range s.shards {
		s.shards[i].maxKeys = per
	}
	if o.SweepInterval > 0 {
		s.done.Add(1)
		go s.sweepLoop(o.SweepInterval)
	}
	return s
}

// Close stops the sweeper. The Store still answers afterwards.
func (s *Store) Close() error {
	if s.zero() {
		return nil // a zero Store: no sweeper
	}
	s.once.Do(func() { close(s.stop) })
	s.done.Wait()
	return nil
}

// Len returns the number of keys held, expired or not.
func (s *Store) Len() int {
	return s.sum(func(sh *shard) int { return sh.n })
}

// sum adds up count over the shards, each under its lock; 0 on a zero
// Store.
func (s *Store) sum(count func(*shard) int) int {
	if s.zero() {
		return 0
	}
	total := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		total += count(sh)
		sh.mu.Unlock()
	}
	return total
}

// MaxKeys returns the bound on the keys held: Options.MaxKeys, or its
// default (0 for a zero Store).
func (s *Store) MaxKeys() int {
	if s.zero() {
		return 0
	}
	return s.maxKeys
}

// Evictions counts the keys a Store evicted to stay within MaxKeys.
type Evictions struct {
	// Keys counts the keys evicted before they expired: each started its
	// limit afresh, and could admit again what it had taken.
	Keys uint64
	// Exhausted counts those of them that had taken their whole limit
	// (denying, or a Penalty block), each of which could admit its whole
	// limit again: evicted only when every key sampled had too.
	Exhausted uint64
}

// Evictions returns the keys evicted since New. It is safe to call at
// any time, and cheap: a monitor polls it.
func (s *Store) Evictions() Evictions {
	var e Evictions
	if s.zero() {
		return e
	}
	for i := range s.shards {
		e.Keys += s.shards[i].evicted.Load()
		e.Exhausted += s.shards[i].exhausted.Load()
	}
	return e
}

// zero reports whether s is a zero or nil Store, which holds nothing.
func (s *Store) zero() bool { return s == nil || s.shards == nil }

// unbuilt is what a zero Store's calls return: why New refused its
// options, else ErrZeroStore.
func (s *Store) unbuilt() error {
	if s != nil && s.bad != nil {
		return s.bad
	}
	return ErrZeroStore
}

func (s *Store) shardIndex(key string) uint64 { return maphash.String(s.seed, key) & s.mask }

func (s *Store) shard(key string) *shard { return &s.shards[s.shardIndex(key)] }

// locate hashes key once for both its shard and its tag under a, and
// starts loading the key's slot, which then arrives while the caller
// takes the shard's lock and reads the clock (over many keys, the slot is
// a cache miss, and the clock read cannot begin before earlier loads end).
func (s *Store) locate(key string, a sluice.Algorithm) (*shard, uint32) {
	h := maphash.String(s.seed, key)
	sh, tag := &s.shards[h&s.mask], tagOf(h, a)
	if a == sluice.GCRA {
		sh.gcra.Prefetch(tag)
	} else {
		sh.tab.Prefetch(tag)
	}
	return sh, tag
}

// now is the time in µs since the Unix epoch: the injected clock's, or the
// monotonic clock anchored to the wall clock once, which is cheaper than
// time.Now (one clock read, not two) and immune to wall clock steps, all
// one process's limiter needs.
func (s *Store) now() int64 {
	if s.clock != nil {
		return s.clock().UnixMicro()
	}
	return s.baseUS + int64(time.Since(s.base)/time.Microsecond)
}

// check validates a request, refuses a zero Store, and returns the limit's
// params. It checks exactly what sluice.ValidateRequest does, in that order,
// but validates a limit only the first time it meets it.
func (s *Store) check(key string, limit sluice.Limit, cost int64) (*params, error) {
	if s == nil { // no cache to validate through
		if err := sluice.ValidateRequest(key, limit, cost); err != nil {
			return nil, err
		}
		return nil, s.unbuilt()
	}
	if err := sluice.ValidateKey(key); err != nil {
		return nil, err
	}
	p, err := s.limits.params(limit)
	if err != nil {
		return nil, err
	}
	if cost < 1 || cost > p.capacity {
		return nil, limit.ValidateCost(cost)
	}
	if s.shards == nil {
		return nil, s.unbuilt()
	}
	return p, nil
}

// ctxErr is ctx's error: a call whose context has ended changes nothing
// and says why, as on Redis. A nil context never ends.
func ctxErr(ctx context.Context) error {
	if ctx == nil {
		return nil
	}
	return ctx.Err()
}

// Take implements sluice.Store.
func (s *Store) Take(ctx context.Context, key string, limit sluice.Limit, cost int64) (d sluice.Decision, err error) {
	if err := ctxErr(ctx); err != nil {
		return sluice.Decision{}, err
	}
	// The common case checks inline what check does (sluice.ValidateKey
	// is the length test); anything it does not pass goes through check,
	// for check's error. A nil s finds no params, so its only cost here
	// is the nil check that reading s.limits needs anyway.
	p := s.lookup(limit)
	if p == nil || len(key) == 0 || len(key) > sluice.MaxKeyLen || cost < 1 || cost > p.capacity || s.shards == nil {
		var err error
		if p, err = s.check(key, limit, cost); err != nil {
			return sluice.Decision{}, err
		}
	}
	sh, tag := s.locate(key, limit.Algorithm)
	sh.mu.Lock()
	now := s.now()
	var r result
	if p.alg == sluice.GCRA {
		r = sh.takeGCRA(tag, key, now, p, cost)
	} else if st := sh.tab.Find(tag, key); st != nil {
		if st.expires <= now { // expired but not yet swept: fresh again
			st.clear()
		}
		r = decide(st, now, p, cost, true)
		if r.allowed {
			st.expires = now + r.reset
		}
		st.fill = fillOf(&r, p)
	} else {
		r = sh.takeFresh(tag, key, now, p, cost)
	}
	sh.mu.Unlock()
	r.fill(&d, limit)
	return d, nil
}

// takeGCRA is Take's decision on a GCRA key, in its compact slot. The
// caller holds sh.mu.
func (sh *shard) takeGCRA(tag uint32, key string, now int64, p *params, cost int64) result {
	g := sh.gcra.Find(tag, key)
	if g == nil {
		return sh.takeFresh(tag, key, now, p, cost)
	}
	var st state
	if g.tat > now { // else expired but not yet swept: fresh again
		st.a, st.expires = g.tat, g.tat
	}
	r := gcra(&st, now, p, cost, true)
	g.tat, g.fill = st.a, fillOf(&r, p)
	return r
}

// lookup is s.limits.lookup, nil for a nil s.
func (s *Store) lookup(limit sluice.Limit) *params {
	if s == nil {
		return nil
	}
	return s.limits.lookup(limit)
}

// takeFresh decides a take on a key the shard does not hold, adding the
// key if the take is allowed. The caller holds sh.mu.
func (sh *shard) takeFresh(tag uint32, key string, now int64, p *params, cost int64) result {
	var fresh state
	r := decide(&fresh, now, p, cost, true)
	if r.allowed {
		fresh.expires = now + r.reset
		fresh.fill = fillOf(&r, p)
		sh.insert(tag, key, p.alg, &fresh, now)
	}
	return r
}

// Peek implements sluice.Store.
func (s *Store) Peek(ctx context.Context, key string, limit sluice.Limit, cost int64) (d sluice.Decision, err error) {
	if err := ctxErr(ctx); err != nil {
		return sluice.Decision{}, err
	}
	p, err := s.check(key, limit, cost)
	if err != nil {
		return d, err
	}
	sh, tag := s.locate(key, limit.Algorithm)
	sh.mu.Lock()
	now := s.now()
	var cp state
	if e := sh.find(tag, key, p.alg); e.found() {
		if cp = e.get(); cp.expires <= now { // the log is only read when commit is false
			cp = state{}
		}
	}
	r := decide(&cp, now, p, cost, false)
	sh.mu.Unlock()
	r.fill(&d, limit)
	return d, nil
}

// Reset implements sluice.Store.
func (s *Store) Reset(ctx context.Context, key string, limit sluice.Limit) error {
	if err := ctxErr(ctx); err != nil {
		return err
	}
	if err := sluice.ValidateKey(key); err != nil {
		return err
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if s.zero() {
		return s.unbuilt()
	}
	sh, tag := s.locate(key, limit.Algorithm)
	sh.mu.Lock()
	if sh.remove(tag, key, limit.Algorithm) {
		sh.n--
		sh.markReset(key, limit, s.now())
	}
	sh.mu.Unlock()
	return nil
}

// insert adds st under key and algorithm a, evicting first if the shard
// is full, and returns where it now lives (valid until the next insert).
func (sh *shard) insert(tag uint32, key string, a sluice.Algorithm, st *state, now int64) ref {
	return sh.insertKeeping(tag, key, a, st, now, nil)
}

// insertKeeping is insert, evicting none of keep's keys: a TakeAll's own
// keys, whose takes an eviction would forget. With none other to evict,
// the shard holds more than maxKeys, by fewer keys than the call has.
func (sh *shard) insertKeeping(tag uint32, key string, a sluice.Algorithm, st *state, now int64, keep []sluice.Request) ref {
	if sh.n >= sh.maxKeys {
		sh.evict(now, keep)
	}
	sh.n++
	return sh.add(tag, key, a, st)
}

// evict removes one key not in keep: of a small random sample, the one
// whose loss admits the least. An evicted key starts fresh, admitting
// again what it had taken, so: an expired key (fresh already), else the
// one that had taken the smallest share of its limit, else, among equals,
// the soonest to expire (the least time its state had left to count). A
// key that had taken its whole limit (denying, or a Penalty block) thus
// goes only when every key sampled had too, and then the one of the
// smallest capacity first: a flood of new keys, one unit each, evicts its
// own keys, not the keys it wants afresh, even when each of its keys is
// spent by its one unit (a limit of 1 a day).
//
// keep's keys are not candidates, and a TakeAll with many keys in a small
// shard can fill a sample with them: up to evictRounds samples are drawn
// until SampleSize distinct candidates are seen, and a key that had taken
// its whole limit goes only when that many were; else the shard holds more
// than maxKeys for now (by fewer keys than the call has). Drawn once, a
// sample of a TakeAll's own keys and a denied key evicted the denied key,
// though the shard held keys that had taken next to nothing.
func (sh *shard) evict(now int64, keep []sluice.Request) {
	var victim candidate
	var v *state
	found := false
	var seen [table.SampleSize]candidate
	n := 0
draw:
	for range evictRounds {
		cs, m := sh.sample()
		for _, c := range cs[:m] {
			if kept(keep, sh.key(c)) || slices.Contains(seen[:n], c) {
				continue
			}
			if n < len(seen) {
				seen[n] = c
				n++
			}
			st := sh.at(c)
			if st.expires <= now {
				victim, v, found = c, nil, true
				break draw
			}
			if v == nil || st.fill < v.fill || st.fill == v.fill && st.expires < v.expires {
				victim, v, found = c, &st, true
			}
		}
		if keep == nil || n >= len(seen) {
			break
		}
	}
	if !found || v != nil && v.fill >= fillFull && keep != nil && n < len(seen) {
		return
	}
	if v != nil { // not expired: its limit starts afresh
		sh.evicted.Add(1)
		if v.fill >= fillFull {
			sh.exhausted.Add(1)
		}
	}
	sh.drop(victim)
	sh.n--
}

// evictRounds is how many samples evict draws at most for a TakeAll whose
// own keys crowd them.
const evictRounds = 4

func kept(keep []sluice.Request, key string) bool {
	for _, r := range keep {
		if r.Key == key {
			return true
		}
	}
	return false
}

func (s *Store) sweepLoop(every time.Duration) {
	defer s.done.Done()
	tick.Every(s.stop, every, s.Sweep)
}

// Sweep removes the expired keys, in-flight holders and Reset marks now.
// The sweeper calls it periodically. It holds a shard's lock for
// sweepChunk entries at a time, so that a request on the shard waits for
// a chunk's walk (under a microsecond), not the shard's (0.3 ms or more at
// a million keys over 64 shards); and, once the shard is walked, to shrink
// its table when it is left less than an eighth full (0.05-0.1 ms at that
// size). A key expired when Sweep reaches its shard goes, though its table
// grows or shrinks meanwhile (table.Cursor); one that expires while the
// shard is walked may stay until the next sweep, as a fresh key.
func (s *Store) Sweep() {
	if s.zero() {
		return
	}
	for i := range s.shards {
		s.shards[i].sweep(s)
	}
}

// sweepChunk is how many slots, in-flight keys or Reset marks of a shard a
// sweep walks under the shard's lock: about 10ns a slot, more for a key it
// removes.
const sweepChunk = 32

// sweep removes sh's expired keys, holders and marks, sweepChunk entries
// per hold of sh.mu.
func (sh *shard) sweep(s *Store) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	h := sweepHold{s: s, sh: sh}
	sh.sweepSlots(now, &h)
	sh.sweepResets(now, &h)
	sweepTable(&sh.gcra, func(g *gcraState) bool { return g.tat <= now }, &h)
	sweepTable(&sh.tab, func(st *state) bool { return st.expires <= now }, &h)
}

// sweepTable removes the keys of t that expired says have, a chunk at a
// time (h), and shrinks t if they leave it less than an eighth full.
func sweepTable[V any](t *table.Table[V], expired func(*V) bool, h *sweepHold) {
	var c table.Cursor
	for {
		from, to, _, ok := t.Chunk(&c, sweepChunk-h.n)
		if !ok {
			break
		}
		for i := from; i < to; i++ {
			if t.Live(i) && expired(t.At(i)) {
				t.Bury(i)
				h.sh.n--
			}
		}
		h.walked(to - from)
	}
	t.Fit()
}

// sweepHold counts what a sweep walked under one hold of a shard's lock.
type sweepHold struct {
	s  *Store
	sh *shard
	n  int
}

// walked counts n more entries, and lets the lock go for a moment once
// the hold has walked sweepChunk.
func (h *sweepHold) walked(n int) {
	if h.n += n; h.n < sweepChunk {
		return
	}
	h.sh.mu.Unlock()
	// The lock's waiter is woken to run next on this processor: yielding
	// lets it take the lock before this walk does again. Without it a
	// request could wait out a run of chunks (p99.9 270µs while sweeps
	// ran, in one run; 3-4µs with it).
	runtime.Gosched()
	if h.s.sweepPaused != nil {
		h.s.sweepPaused(h.n)
	}
	h.n = 0
	h.sh.mu.Lock()
}
