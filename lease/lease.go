// Package lease decides at memory speed under one shared limit: it takes
// part of a key's budget from a store in one atomic step (a lease) and
// spends it locally, without a round trip per request, and it says exactly
// how far over the limit a fleet can go.
//
// A Store asks its sluice.Granter for up to n units of a key (see "Lease
// size") and admits requests from them in memory until they are spent or
// the lease expires. A lease lives at most the key's maximum staleness D
// (Options.MaxStaleness, or Options.For per key; zero: no lease), measured
// from when its grant was sent, so no network delay stretches it; under the
// window algorithms it also ends where the window it was taken from ends.
// When the store grants nothing, the Store remembers that until the key's
// retry time or for D from the grant's send, whichever is sooner (so that
// a Reset elsewhere reaches it within D), and a request of cost n is told
// to retry when n units, not one, will be there. Unused units go back to the store, under sluice.Granter's
// return rule, on the first request an expired lease or one too small
// cannot answer, and on Close; a lease forgotten among many idle keys
// strands its units, which can only lower admissions. A live lease's last
// units that are too few for a request (GCRA and the buckets) are not
// returned, which would lose one per Interval of the lease's age: that
// request spends them with the store's exact Take of the rest, at one
// instant within the lease's life, and the next request is granted; when
// the store denies the rest, they stay for smaller requests (while that
// Take is out, the key's other requests in the process go to the store's
// Take too: a new grant would replace the lease, and they would go back
// less one unit per Interval of their age). When that
// Take comes back after the lease's life, they cannot be spent (the store
// may have taken its units after the lease ended): they go back under the
// return rule, and the request takes as many from the store too, exactly
// (units taken go together as a lease's would, within D of the Take that
// took the first of them and in one window; when the store denies, those
// taken are lost with the request, as a client's that gives up halfway,
// and so are those taken again; Stats.Lost counts them).
// When a new lease follows such a return and the granter is a
// sluice.Regranter (the Redis and memory stores are, and a resilient.Store
// over them), the return and the grant are one call: a refill is one round
// trip, which every request on the key waits for, not two.
//
// In-flight slots are never leased: a Store passes Acquire, Extend and
// Release through to its granter (ErrNoSlots when it keeps none).
//
// # Lease size
//
// Each key's demand in a process is the units it asked for per D, as an
// exponentially weighted moving average with time constant D (each request
// counts its cost, admitted or not, but a TakeAll that is denied counts
// none of its checks': a check that another one denies spends nothing, and
// leases kept for it would end unspent). A key is hot when its demand is at
// least 4 units: it then gets leases of its demand rounded up, what the
// process expects to use within D, capped at Capacity / (2 × fleet size)
// (Options.FleetSize) so no process holds more than its share of the burst,
// and at least 1; three quarters of that when the key's last grant left the
// store under half its Capacity (a lease mostly ends holding units when
// fewer requests than its demand came in its life, and those units cost
// admissions only when the store runs short). A key that is not hot, or
// whose lease would hold fewer than two requests of the request's cost, is
// not leased: the store answers the request exactly, as without leases (with
// weighted costs, a process that asks a few units per D on average is hot
// for a while after a large request, and its leases mostly end unspent). An
// idle key's demand is forgotten when it is swept: when the keys held have
// doubled, and on the clock at a request at least a second after the last
// sweep (then only keys not asked for within their D), so that a burst's
// keys and their memory go about D + 1 s after their last request, plus the
// sweep's walk of the table, about 1µs per key held (see sweepEvery for how
// far apart sweeps of a large table are). A sweep runs in a goroutine of
// its own, which Close stops: the request that finds it due only starts it,
// and it holds a shard's lock for 32 slots at a time (about 20µs), but to
// shrink the shard's table once walked (about 3ns a slot: 0.1 ms a shard
// at a million keys). A request that makes a key while the table is over
// the size that starts a sweep walks 32 slots of it too, so that a flood of
// new keys cannot outrun it. Options.Size replaces all
// this with one fixed size for every key.
//
// # The bound
//
// Cumulative admissions never exceed what the store granted minus what was
// returned: a unit is admitted once, from a lease that holds it (a request
// that spends a lease's last units with the store's is admitted at an
// instant within that lease's life, the store's units being granted or
// taken by then, or with the store's units alone). A TakeAll is admitted
// when its last store call (a grant, or the Take of its other checks) is
// back, and spends its leases' units then, each within its lease's life;
// a check whose lease ended before takes its units from the store instead,
// exactly, all or nothing with the others, and the lease's go back under
// the return rule.
//
// GCRA, TokenBucket, LeakyBucket, with burst B and I = Limit.Interval (one
// unit per I, so r = 1/I ≤ Rate/Period): over any closed interval of time
// of length t, a fleet of any number of processes admits at most
//
//	B + ⌊(t + D) / I⌋
//
// that is B + r·(t + D): the exact limiter's bound plus r·D. Proof sketch.
// Without returns: a unit admitted at time x was granted at some g ≤ x no
// earlier than its lease's send time s ≥ x − D, so the units admitted in
// [a, a+t] were granted in [a−D, a+t], and the store, an exact limiter of
// burst B, grants at most B + ⌊(t+D)/I⌋ over a closed interval of that
// length. With returns: a lease granted k units at g and returns u ≤
// max(0, unused − c) at g + age, c being the refills (one per I) that can
// fall in (g, g+age]. Compare the same history in which the lease was
// granted only the k − unused units it used: its bucket held unused more
// units, and two buckets under the same refills and takes differ by less
// only where the fuller one is capped at B, which loses at most one unit per
// refill, so the difference is still at least unused − c ≥ u at the return.
// After the return the real bucket is therefore no fuller than the
// compared one; buckets are monotone (a fuller bucket grants everything a
// less full one does, and stays fuller), so every later grant was possible
// in the history without that return. By induction over returns, the
// admissions are those of a history without returns, bounded above. A
// refill's regrant is such a return followed by such a grant at one
// instant, so it is covered as it stands. The bound is reached with
// equality (bound_test.go replays the schedule): a lease granted B−1 units
// at a−D while the next unit is 1µs away, one unit granted every I after
// it, each held by a request it cannot cover, and all spent from a on. A
// naive return (every unused unit, at any age) breaks it: a lease granted
// B, returned whole after the bucket refilled, lets the fleet take B again
// on top of the refills.
//
// Sizing does not enter the bound: the proofs hold for grants of any size
// (each is an exact take of the store's), and a lease's lifetime is D
// whatever it holds; size only moves how many units wait, unspent, in a
// process.
//
// FixedWindow: a lease never outlives the window its units were taken
// from, as the store's clock sees it, and its unused units return only into
// that window's count, so each window admits at most Rate, exactly as
// without leases; a lease's last units spent with the store's Take of the
// rest are admitted by that Take, within the window, where the store has
// counted both. SlidingWindowCounter: the same, and at any local
// admission the weighted estimate of what was admitted is at most the
// estimate at the lease's grant (or at that Take), which was within the
// limit: the estimate never exceeds the limit. Its own approximation against a true sliding
// window is unchanged. The lifetime is measured on the process's clock from
// the send, and only the rate at which clocks run enters: a Store whose
// clock runs slower than the store's by a fraction ε may spend a lease up to
// ε·D after the window ended. With a store that dates grants by its
// callers' clocks (redisstore's Options.Clock) rather than its own, a
// window's units may be spent up to the callers' skew either side of its
// edges, as seen by one clock.
//
// SlidingWindowLog cannot be leased: its units are dated when taken, so a
// leased unit spent later would leave the log early. Under MaxStaleness,
// which applies to every limit, a sliding window log's keys are answered
// exactly by the granter, as keys that are not hot. A D above zero that
// Options.For gives such a key is an explicit request for a lease that
// cannot be, and is refused with sluice.ErrGrantUnsupported (wrapping
// sluice.ErrInvalidLimit), changing nothing.
//
// # Failure policies
//
// Over a resilient.Store (or MultiStore), a live lease answers locally
// before the breaker is consulted: a Redis that is down costs a leased key
// nothing until its lease ends. Grants and returns pass through while the
// breaker lets calls through; the failure policy never grants, so when a
// grant is held back or fails (resilient.ErrNoGrant) the request is
// answered by the failure policy. So are the requests that were waiting
// for that grant, and a request whose return before a grant failed: when
// the call was sent and failed, by resilient.Store.TakeByPolicy, which
// calls nothing; none sends another call in turn to a store that is not
// answering, so a stall costs a request at most the one call it waited for
// (one timeout, as an unleased request's, not one per request queued
// before it). A TakeAll too: its grants go out together, and once one
// failed (or the policy answered the store's TakeAll of its other
// checks), its checks are answered by their live leases or, without a
// call, by the policy, not by the store's TakeAll; the policy
// answers them all or nothing in one step
// (resilient.Store.TakeAllByPolicy), and lease units are spent only when
// every check admits; a lease that ended meanwhile has the policy answer
// for its units too, and a check that another denies puts its units back
// into its lease, not to the store (stranded when the lease was granted
// again meanwhile). So does a Take whose cost went to the store's Take with
// a live lease's last units and whose Take the policy answered: denied,
// the units go back into the lease; admitted after the lease ended, the
// policy answers for its units too, not the store's Take of the whole
// cost again. A Peek whose return of an ended lease's units was held back
// or failed is answered likewise, by resilient.Store.PeekByPolicy, and a
// Peek beyond a live lease's units whose store Peek the policy denied is
// that denial (no wait after a policy's denial is asked of the store, a
// Take's top-up included). A
// request that waited for a grant that others then spent
// goes to the store's Take, not to a grant of its own in turn. A
// return held back or failed is not resent (a resent return would make
// budget); its units stay out of the store, which can only lower
// admissions. A regrant (a return and a grant in one call) held back or
// failed is such a return: not resent, its units out of the store, the
// request and those waiting for it answered by the failure policy (a
// resent grant would strand units too). Without a failure policy (an
// error other than resilient.ErrNoGrant), a grant, regrant or return that
// fails is the request's error, and the requests that were waiting for it
// get that error at once, none sending a call of its own.
//
// # What callers see
//
// A decision answered from a lease has Source sluice.SourceLease, Remaining
// the key's global figure as of the lease's grant (what the store had left
// after granting, plus the units this lease has not spent: other processes'
// spending since, at most D old, is not seen), and ResetAfter the grant's
// ResetAfter less the lease's age. Not the lease's own units: a client that
// paces itself by the rate-limit headers would otherwise read "0 left" at
// the end of every lease while the key has budget to spare. A request that a
// partial grant cannot cover is denied with a RetryAfter that is an upper
// bound (one Interval per unit of the request, since the lease's own units
// may go back to the store less the return rule's share by then; the
// window's end for the fixed window) rather than exact; for the sliding window counter, where no
// figure a lease has is an upper bound for more than one unit, the store's
// Take answers such a request, as it answers a remembered denial of one.
// Requests of that cost then go to the
// store's Take, exact, for D or until a grant covers as much. A request
// that goes to the store's Take, whatever the reason, first gives back
// what the lease holds, so that its units are in the store's answer, or,
// when the lease is live (GCRA and the buckets), asks the store for
// cost less those units and spends them with the ones it takes (a denial's
// RetryAfter is then an upper bound: one Interval more per unit of the
// lease's). Peek answers from a live lease that holds cost units without
// taking, and otherwise asks the store, counting what a live lease would
// give back before such a Take, or spend with it. A lease that has ended
// holding units, which the next request's refill would give back before
// asking the store, gives them back
// on a Peek too, once, under the return rule: how many the store takes
// back and, for the sliding window counter past their window, how much
// they weigh on its estimate, only the store knows. So in one process on
// the store's clock a Peek decides as a Take at the same instant would
// (peek_test.go checks it). Where the store dates grants by its own clock,
// a live lease's units are aged from the grant's send, before the store's
// date of it, so a Peek may count fewer of them than the Take's return
// gives back.
//
// Reset and config reloads take effect within D. Reset drops this
// process's lease and resets the key in the store; other processes' leases
// live on for at most D from their grants' sends, and their next grants
// come from the reset key; units they do not spend are never returned
// into it (a Reset starts a new epoch of the key, see sluice.Granter), so
// after a Reset the fleet admits at most what the exact limiter would from
// a fresh key plus those leases' units. Leases are kept per key and Limit,
// so a changed limit (a reloaded policy) is another lease: its first
// request asks the store under the new limit at once, and the old limit's
// lease, no longer asked, strands its units (they were taken from the
// store: this can only lower admissions) until it is swept. A Store leases under at most 2^20
// distinct limits; one met after that is answered exactly by the store (a
// program making a limit per call must not grow the Store without end).
package lease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ctxutil"
	"github.com/sluicehq/sluice/internal/table"
	"github.com/sluicehq/sluice/resilient"
)

var (
	_ sluice.MultiStore   = (*Store)(nil)
	_ sluice.Slots        = (*Store)(nil)
	_ sluice.LimitChecker = (*Store)(nil)
)

var (
	// ErrInvalidStaleness: New was given neither Options.For nor an
	// Options.MaxStaleness of at least MinStaleness, or a key's staleness
	// is below zero, between zero and MinStaleness, or longer than its
	// limit's period.
	// A call's error (and CheckLimit's) wraps sluice.ErrInvalidLimit too:
	// the limit cannot be served here, so wrappers such as a
	// resilient.Store take it for bad input, not a backend failure.
	ErrInvalidStaleness = errors.New("lease: invalid maximum staleness")
	// ErrNoGranter: the Store is a zero value, or New was given no granter
	// or one never built. It is also sluice.ErrStoreNotBuilt.
	ErrNoGranter = fmt.Errorf("lease: no granter: %w", sluice.ErrStoreNotBuilt)
	// ErrNoTakeAll: TakeAll has several checks that are not leased (or
	// whose grants a failure policy held back), and the granter is not a
	// sluice.MultiStore that could take them at once.
	ErrNoTakeAll = errors.New("lease: the granter cannot take several unleased limits at once")
	// ErrNoSlots: Acquire, Extend or Release on a Store whose granter keeps
	// no in-flight slots (is not a sluice.Slots).
	ErrNoSlots = errors.New("lease: the granter keeps no in-flight slots")
	// ErrNotReturned: Close could not give some leases' unused units back
	// to the store (unreachable, or a failure policy held the returns
	// back); the error says how many, and wraps the first failure. Those
	// units are spent for their windows, as a lease that ends unspent.
	ErrNotReturned = errors.New("lease: unused units not returned")
	// ErrInvalidOptions: New was given an option out of range (a negative
	// Size).
	ErrInvalidOptions = errors.New("lease: invalid options")
)

// MinStaleness is the shortest maximum staleness: the stores' clocks count
// microseconds, and a lease must outlive at least one of them.
const MinStaleness = time.Microsecond

// Options configures a Store. MaxStaleness or For must be set.
type Options struct {
	// MaxStaleness (D) is the longest a lease lives, from when its grant
	// was sent: the most a fleet's admissions can run ahead of the store,
	// in units of time (see the package doc's bound). It must be no longer
	// than the Period of any limit the Store is used with (CheckLimit
	// refuses one it is longer than). A sliding window log, which cannot be
	// leased, is answered exactly under it. Default: none;
	// it must be at least MinStaleness when For is nil, and is unused when
	// For is set.
	MaxStaleness time.Duration

	// For, when set, is each key's maximum staleness D in place of
	// MaxStaleness (a service knows each key's policy). Zero means no
	// lease: the key is answered exactly by the granter, as without
	// leases. A D below zero, between zero and MinStaleness, or longer
	// than the limit's period is ErrInvalidStaleness on that call; a D
	// above zero for a sliding window log, which cannot be leased, is
	// sluice.ErrGrantUnsupported; both wrap sluice.ErrInvalidLimit. Being
	// per key, neither can be refused before the call (CheckLimit). It is
	// called once per decision and must be safe for concurrent use.
	// Default: nil, MaxStaleness for every key.
	For func(key string, limit sluice.Limit) time.Duration

	// Size, when positive, is how many units each grant asks for, capped
	// at a limit's Capacity and raised to a request's cost, for every key,
	// hot or not. Default: 0, sized by demand (see "Lease size" in the
	// package doc). A negative Size is refused (ErrInvalidOptions).
	Size int64

	// FleetSize returns how many processes share the store's limits (a
	// service passes its resilient.Fleet's count); an adaptive lease holds
	// at most 1/(2 × FleetSize) of a limit's Capacity. It is called once
	// per grant. Default: nil, a fleet of 1; a figure below 1 counts as 1.
	FleetSize func() int

	// Clock returns the current time. Default: time.Now's, advanced by the
	// monotonic clock alone after the first read. It measures lease
	// lifetimes and remembered denials only.
	Clock func() time.Time
}

// Store is a sluice.Store that answers from leases on a sluice.Granter. It
// is safe for concurrent use; at most one grant per key is in flight at a
// time in one Store. Build one with New and Close it to return unused
// units (and stop a sweep under way). The zero value, and a nil *Store, refuse every call with
// ErrNoGranter; their Stats are zeros and their Close does nothing.
type Store struct {
	granter   sluice.Granter
	staleness time.Duration
	stale     func(key string, limit sluice.Limit) time.Duration
	size      int64
	fleet     func() int
	clock     func() time.Time // Options.Clock; nil reads the monotonic clock
	base      time.Time        // the monotonic clock's anchor
	baseNS    int64            // base, ns since the Unix epoch

	seed     maphash.Seed
	shards   []shard // by the key's hash; nil in a zero Store
	idMu     sync.Mutex
	ids      map[sluice.Limit]*limitID    // each limit's kind in the tables, under idMu
	idCache  [256]atomic.Pointer[limitID] // ids by limitHash, read without idMu
	keys     atomic.Int64                 // leases held in all shards
	sweepAt  atomic.Int64                 // sweep idle leases when keys reaches this
	sweepDue atomic.Int64                 // or when now (ns) reaches this: see sweepEvery
	assistAt atomic.Int64                 // a key made while keys reaches this walks a chunk of the sweep
	sw       sweeper

	grants, granted, returned, lost, forfeited atomic.Uint64

	statsPaused func(walked int) // tests: called between Stats' chunks, the lock released
}

// Stats counts what a Store has done since New; every field is cumulative
// but Keys and Leased.
type Stats struct {
	Local    uint64 // decisions answered from a lease, without the store
	Grants   uint64 // grant calls sent to the store (not those a breaker held back)
	Granted  uint64 // units the store granted
	Returned uint64 // units the store took back
	Lost     uint64 // units the store took for requests that could not spend them
	// Forfeited counts the unused units that returns did not give back:
	// the return rule's keep, one unit per Interval begun since the grant
	// (the price of the bound), or all of them into a window that has
	// ended. Leases that end unspent show here.
	Forfeited uint64
	Keys      int // keys tracked now (a lease, a remembered denial, or only demand)
	Leased    int // keys with a live lease now: units to spend, within D
	// Keys and Leased count a key once per limit it is used under: twice
	// only while a reloaded policy's old limit is still tracked. Lost:
	// when a lease ends while the store's Take of the rest of a request
	// (a TakeAll's, of its other checks) is out, the request takes the
	// lease's units from the store too (see the package doc); the units
	// taken are lost when the store then denies, and those too old to go
	// with the rest when it takes them again.
}

// Stats returns the Store's counters. It is safe to call at any time; a
// zero Store reports zeros. It walks every key tracked, for Leased: read
// it per scrape, not per request. It holds a shard's lock for sweepChunk
// slots at a time, not the shard, so Leased is not one instant's count:
// a lease that starts or ends during the walk may be counted or not (it
// is at most Keys).
func (s *Store) Stats() Stats {
	if s == nil {
		return Stats{}
	}
	var local uint64
	leased := 0
	now := s.now()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		local += sh.local
		n := 0 // leased in sh
		var c table.Cursor
		for {
			from, to, restarted, ok := sh.leases.Chunk(&c, sweepChunk)
			if restarted {
				n = 0 // its keys moved: counted again
			}
			if !ok {
				break
			}
			for j := from; j < to; j++ {
				if sh.leases.Live(j) && sh.leases.At(j).live(now) {
					n++
				}
			}
			sh.mu.Unlock()
			// The lock's waiter is woken to run next on this processor:
			// yielding lets it take the lock before this walk does again.
			runtime.Gosched()
			if s.statsPaused != nil {
				s.statsPaused(to - from)
			}
			sh.mu.Lock()
		}
		sh.mu.Unlock()
		leased += n
	}
	keys := s.Len()
	return Stats{
		Local:     local,
		Grants:    s.grants.Load(),
		Granted:   s.granted.Load(),
		Returned:  s.returned.Load(),
		Lost:      s.lost.Load(),
		Forfeited: s.forfeited.Load(),
		Keys:      keys,
		Leased:    min(leased, keys),
	}
}

// minSweep is the least number of leases held before idle ones are swept.
const minSweep = 10_000

// sweepEvery is the least time between the sweeps that run on the clock,
// beside those the table's growth starts, so that the memory of a burst of
// keys is given back once they are idle, as the table shrinks (Table.Fit)
// only in a sweep. A sweep visits every key (about 1µs each), so the next
// one waits churnCost times as long as walking the last one took while keys may
// turn idle (for the longest D, plus sweepEvery, after a sweep that found
// the table a quarter larger than the last one left it, or freed a
// quarter of it: the work is paid for by that many keys come or gone),
// sweepCost times otherwise: at most 10 % and 1 % of a core.
const (
	sweepEvery = time.Second
	churnCost  = 10
	sweepCost  = 100
)

// shardCount shards the leases so that requests on different keys rarely
// share a mutex.
const shardCount = 64

// shard holds some keys' leases; mu guards the table and every field of
// its leases but refill. The table is keyed by the key and, as the entry's
// kind, its limit's id (Store.id): the key alone hashes far faster than
// the key and its Limit together.
type shard struct {
	mu     sync.Mutex
	leases table.Table[hot] // tagged by locate, kind Store.id
	local  uint64           // decisions its leases answered, counted under mu
	_      [64]byte         // keep shards on separate cache lines
}

// hot is the part of a lease that a local decision reads and writes, kept
// in the lease's table slot: the decision touches the slot's cache line and
// no other (a lease object of its own cost a second miss on every call).
// units lives only here; the rest of the lease is behind l. 32 bytes, a
// 48-byte slot: units and rest are at most a capacity, sluice.MaxRate.
type hot struct {
	l     *lease
	stop  int64 // spendable while now ≤ stop: until, and before end
	reset int64 // the last grant's send plus its ResetAfter
	units int32 // left to spend: at most the limit's capacity, sluice.MaxRate
	rest  int32 // the store's Remaining after the last grant, as units
}

// lease is one key's lease under one limit in this process. Its shard's
// mutex guards its fields and its hot part, so a decision from a live
// lease takes one mutex; refill is held across store calls, so that
// concurrent requests wait for one grant rather than each asking.
//
// Its times are ns since the Unix epoch on the Store's clock (Store.now),
// which no clock in use reads as zero: zero marks a time not set.
type lease struct {
	sh       *shard
	key      string
	tag, id  uint32       // where its hot part is in sh.leases
	gone     *hot         // its hot part once it has left the table
	limit    sluice.Limit // validated, and grantable
	capacity int64        // limit.Capacity()
	sent     int64        // when the current grant was sent
	until    int64        // spendable while now ≤ until
	end      int64        // window algorithms: spendable while now < end; 0: no end
	deny     int64        // a zero grant is remembered until then: at most D
	quiet    int64        // until then a TakeAll's refill is the store's Take (see Store.quiet)
	forTake  bool         // the current grant was made for a Take, not a TakeAll's check
	retry    int64        // when that grant's store expected a unit again
	short    int64        // a grant could not cover this cost: such costs go to the store
	shortEnd int64        // until then, D after that grant's send
	gen      uint64       // counts grants: which one units came from
	failed   uint64       // counts grants, regrants and returns that failed
	failErr  error        // the last failure's error
	byPolicy bool         // a failure policy answers for it (resilient.ErrNoGrant)
	granting bool         // a grant is out: its units will replace the lease's (see restore)
	out      int64        // units of grant outGen that top-ups and TakeAlls have out
	outGen   uint64
	// asked is the units asked since folded, not yet in demand, but those
	// spent from units since mark was set: the local path counts nothing,
	// and fold adds mark − units.
	asked, mark int64
	*refilling
}

// hot returns l's hot part: in its shard's table, which must be locked,
// or the copy made when l left it (Reset, a sweep, Close), which no
// decision spends from.
func (l *lease) hot() *hot {
	if l.gone != nil {
		return l.gone
	}
	return l.sh.leases.FindKind(l.tag, l.id, l.key)
}

// leave copies l's hot part out of the table, which must be locked, before
// its slot is removed.
func (h *hot) leave() {
	g := *h
	h.l.gone = &g
}

// setUnits sets l's units to n, first counting what the local path spent
// since mark as asked.
func (l *lease) setUnits(h *hot, n int64) {
	l.asked += l.mark - int64(h.units)
	h.units, l.mark = int32(n), n
}

// setStop derives h.stop from l's until and end.
func (l *lease) setStop(h *hot) {
	h.stop = l.until
	if l.end != 0 {
		h.stop = min(l.until, l.end-1)
	}
}

// refilling is the part of a lease that only its refills use.
type refilling struct {
	refill refillLock
	grant  sluice.Grant
	demand float64       // units this process expects to ask for within D
	folded int64         // when asked was last folded into demand
	foldD  time.Duration // the D of that fold, over which demand decays
}

// refillLock is a mutex that a waiter can leave when its context ends: a
// request queued behind another's grant keeps its own deadline. The zero
// value is not ready; newLock makes one.
type refillLock chan struct{}

func newLock() refillLock { return make(refillLock, 1) }

// lockCtx locks l, or returns ctx's error having not.
func (l refillLock) lockCtx(ctx context.Context) error {
	select {
	case l <- struct{}{}:
		return nil
	default:
	}
	select {
	case l <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (l refillLock) Lock()   { l <- struct{}{} }
func (l refillLock) Unlock() { <-l }
func (l refillLock) TryLock() bool {
	select {
	case l <- struct{}{}:
		return true
	default:
		return false
	}
}

// New returns a Store that leases from g. opts must set MaxStaleness or
// For. A nil g, or one never built (a nil pointer, a zero memory.Store:
// see sluice.CheckBuilt), is refused with ErrNoGranter, a negative
// Options.Size with ErrInvalidOptions.
func New(g sluice.Granter, opts *Options) (*Store, error) {
	if g == nil {
		return nil, ErrNoGranter
	}
	if err := sluice.CheckBuilt(g); err != nil {
		// A nil pointer or zero store: every refill would fail.
		return nil, fmt.Errorf("%w: %w", ErrNoGranter, err)
	}
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.For == nil && o.MaxStaleness < MinStaleness {
		return nil, fmt.Errorf("%w: %v must be at least %v", ErrInvalidStaleness, o.MaxStaleness, MinStaleness)
	}
	if o.Size < 0 {
		// Taken for 0, it would size leases by demand: not what was asked.
		return nil, fmt.Errorf("%w: Size %d is negative (0 sizes leases by demand)", ErrInvalidOptions, o.Size)
	}
	base := time.Now()
	s := &Store{granter: g, staleness: o.MaxStaleness, stale: o.For, size: o.Size, fleet: o.FleetSize, clock: o.Clock, base: base, baseNS: base.UnixNano(), seed: maphash.MakeSeed(), shards: make([]shard, shardCount), ids: map[sluice.Limit]*limitID{}}
	s.sweepAt.Store(minSweep)
	s.sweepDue.Store(s.now() + int64(sweepEvery))
	s.assistAt.Store(math.MaxInt64)
	return s, nil
}

// now is the time in ns since the Unix epoch: the injected clock's, or the
// wall clock read once and advanced by the monotonic clock alone, one clock
// read per call where time.Now makes two. Lifetimes are durations, so wall
// clock steps must not move them anyway.
func (s *Store) now() int64 {
	if s.clock != nil {
		return s.clock().UnixNano()
	}
	return s.baseNS + int64(time.Since(s.base))
}

// check validates a request against the Store and its limit, and returns
// the key's maximum staleness: zero when the key is not leased.
func (s *Store) check(key string, limit sluice.Limit, cost int64) (time.Duration, error) {
	d, err := s.staleFor(key, limit)
	if d == 0 || err != nil {
		return 0, err
	}
	return d, validate(key, limit, cost, d)
}

// staleFor returns the key's maximum staleness, not yet validated: zero
// when the key is not leased.
func (s *Store) staleFor(key string, limit sluice.Limit) (time.Duration, error) {
	if s == nil || s.granter == nil {
		return 0, ErrNoGranter
	}
	if s.stale != nil {
		return s.stale(key, limit), nil
	}
	if limit.Algorithm == sluice.SlidingWindowLog {
		// A store-wide D asks for no lease on a limit that cannot have one:
		// the granter answers it exactly, as a key that is not hot.
		return 0, nil
	}
	return s.staleness, nil
}

// CheckLimit implements sluice.LimitChecker: the error every request under
// limit would get whatever its key, so that a Limiter or middleware built
// on the Store refuses the limit up front: ErrNoGranter for a zero Store,
// sluice.ErrInvalidLimit for an invalid limit, ErrInvalidStaleness when
// MaxStaleness is longer than limit's period, and then, when the granter
// is a sluice.LimitChecker (a resilient.Store is), the granter's verdict.
// With Options.For, staleness is per key, so a key's is checked per request
// only.
func (s *Store) CheckLimit(limit sluice.Limit) error {
	if s == nil || s.granter == nil {
		return ErrNoGranter
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if s.stale == nil {
		if d, _ := s.staleFor("", limit); d > limit.Period {
			return fmt.Errorf("%w: %w: %v for %v (at most its period, %v)", ErrInvalidStaleness, sluice.ErrInvalidLimit, d, limit, limit.Period)
		}
	}
	// No key is answered without the granter (a lease is its grant): what
	// it refuses for every key fails every request.
	if c, ok := s.granter.(sluice.LimitChecker); ok {
		if err := c.CheckLimit(limit); err != nil {
			return fmt.Errorf("lease: granter: %w", err)
		}
	}
	return nil
}

// validate checks a leased request of cost on key under limit, with
// maximum staleness d.
func validate(key string, limit sluice.Limit, cost int64, d time.Duration) error {
	if err := sluice.ValidateGrant(key, limit, cost); err != nil {
		if errors.Is(err, sluice.ErrGrantUnsupported) {
			// Only Options.For leases a log (d > 0 here): the limit cannot
			// be served as configured, which callers test for with
			// ErrInvalidLimit, as for ErrInvalidStaleness.
			return fmt.Errorf("%w: %w: Options.For gave %v for %v, which cannot be leased: want 0", sluice.ErrGrantUnsupported, sluice.ErrInvalidLimit, d, limit)
		}
		return err
	}
	if d < 0 || d > 0 && d < MinStaleness || d > limit.Period {
		return fmt.Errorf("%w: %w: %v for %v (at least %v, at most its period, %v)", ErrInvalidStaleness, sluice.ErrInvalidLimit, d, limit, MinStaleness, limit.Period)
	}
	return nil
}

// locate hashes key once for both its shard and its tag in the shard's
// table, and starts loading the key's slot (as the memory store does: it
// arrives while the caller locks the shard and reads the clock).
func (s *Store) locate(key string) (*shard, uint32) {
	h := maphash.String(s.seed, key)
	sh, tag := &s.shards[h&(shardCount-1)], uint32(h>>32)
	sh.leases.Prefetch(tag)
	return sh, tag
}

// limitID is an entry of Store.idCache.
type limitID struct {
	limit sluice.Limit
	id    uint32
}

// maxLimits bounds the limits a Store leases under: a program that makes
// a new limit per call must not grow the ids without end. A limit met after
// that many is answered exactly by the store.
var maxLimits = 1 << 20

// limitHash picks a limit's entry in Store.idCache: every field moves its
// top bits.
func limitHash(l sluice.Limit) int {
	h := uint64(l.Rate)*0x9e3779b97f4a7c15 ^ uint64(l.Period)*0xc2b2ae3d27d4eb4f ^ uint64(l.Burst)*0x165667b19e3779f9 ^ (uint64(l.Algorithm)+1)*0x94d049bb133111eb
	return int(h >> 56)
}

// knownID returns limit's id, or 0 if it has none yet: one cached entry
// compared, as a rule, and no lock. Two limits in use that share an entry
// take turns in it through the Store's lock, without allocating.
func (s *Store) knownID(limit sluice.Limit) uint32 {
	c := &s.idCache[limitHash(limit)]
	if e := c.Load(); e != nil && e.limit == limit {
		return e.id
	}
	s.idMu.Lock()
	e := s.ids[limit]
	s.idMu.Unlock()
	if e == nil {
		return 0
	}
	c.Store(e)
	return e.id
}

// id returns limit's id, giving it one if it has none, or 0 once the Store
// has given maxLimits. limit must have been validated.
func (s *Store) id(limit sluice.Limit) uint32 {
	if id := s.knownID(limit); id != 0 {
		return id
	}
	s.idMu.Lock()
	e, ok := s.ids[limit]
	if !ok && len(s.ids) < maxLimits {
		e = &limitID{limit, uint32(len(s.ids) + 1)}
		s.ids[limit] = e
	}
	s.idMu.Unlock()
	if e == nil {
		return 0
	}
	return e.id
}

// lease returns key's lease under limit (id) in sh, which must be locked,
// with its hot part, making one if needed (made), its refill locked, so
// that a sweep does not forget it before its first refill; limit must
// have been validated.
func (s *Store) lease(sh *shard, tag, id uint32, key string, limit sluice.Limit) (_ *hot, made bool) {
	if h := sh.leases.FindKind(tag, id, key); h != nil {
		return h, false
	}
	l := &lease{sh: sh, key: key, tag: tag, id: id, limit: limit, capacity: limit.Capacity(), refilling: &refilling{refill: newLock()}}
	l.refill.Lock()
	s.keys.Add(1)
	return sh.leases.AddKind(tag, id, key, hot{l: l}), true
}

// drop forgets l, whose shard must be locked.
func (s *Store) drop(l *lease) {
	if l.gone != nil {
		return
	}
	l.hot().leave()
	l.sh.leases.RemoveKind(l.tag, l.id, l.key)
	s.keys.Add(-1)
}

// sweeper is the progress of a sweep, which forgets the leases that are
// idle: nothing to spend, no denial to remember, no call in flight. An
// expired lease's unused units are left with it: stranded, they can only
// lower admissions. A sweep starts when the leases held have doubled
// since the last one, so its cost per new key is constant, and on the
// clock (timed: see sweepEvery), when it forgets only keys not asked for
// within their D, whose demand has mostly decayed, so that a key asked for
// less often than every sweepEvery keeps it.
//
// The request that finds a sweep due starts it; a goroutine of its own
// walks it, sweepChunk slots of one shard at a time, the shards in turn,
// and exits when it is done (or Close stops it). A table of a million keys
// takes about a second to walk: in one request, as it was, that request
// paid all of it and the others on the shard being swept waited for a
// sixty-fourth of it. A table of a few keys is walked by that request. A
// sweep forgets the keys idle when it started. A request that makes a key
// while the table is over its growth threshold walks one chunk itself, so
// that a flood of new keys pays for the sweep it makes due and cannot
// outrun it. A key that a shard's growth moves during a sweep may be
// passed over: the next sweep has it.
type sweeper struct {
	mu      sync.Mutex      // held while a chunk is walked; guards the rest
	on      bool            // a sweep is under way
	timed   bool            // it forgets only keys not asked for within their D
	now     int64           // when it started: it forgets the keys idle then
	stop    bool            // Close: end it where it is
	done    chan struct{}   // closed when its goroutine has exited
	pos     [shardCount]int // each shard's next slot to walk; -1 once walked
	next    int             // the shard to walk a chunk of next
	left    int             // shards not yet walked
	seen    int64           // keys held when it started
	freed   int64           // keys it forgot
	longest time.Duration   // the longest D of a key it kept
	work    time.Duration   // time spent walking its chunks
	visited int             // slots walked
	sweptTo int64           // keys left by the last sweep
	churnTo int64           // until then (ns) sweeps may find keys idle
	pause   func()          // tests: called by the goroutine before each chunk
}

// sweepChunk is how many slots of one shard a sweep walks under the
// shard's lock, and the most a request walks for it: about 1µs per live
// slot on a busy host (a cache miss or two each), far less per empty one.
const sweepChunk = 32

// sweepIfDue starts a sweep when the table has doubled or the clock says
// so.
func (s *Store) sweepIfDue() {
	if s.keys.Load() >= s.sweepAt.Load() {
		s.startSweep(false)
	} else if s.now() >= s.sweepDue.Load() {
		s.startSweep(true)
	}
}

// startSweep starts a sweep in a goroutine of its own unless one is under
// way.
func (s *Store) startSweep(timed bool) {
	w := &s.sw
	if !w.mu.TryLock() {
		return // a chunk is being walked: a sweep is under way
	}
	defer w.mu.Unlock()
	if w.on {
		return
	}
	w.on, w.timed, w.stop, w.now = true, timed, false, s.now()
	w.pos, w.next, w.left = [shardCount]int{}, 0, shardCount
	w.seen, w.freed, w.longest, w.work, w.visited = s.keys.Load(), 0, 0, 0, 0
	// Until it ends, no request starts another or leaves the fast path for
	// it; one that makes a key while the table is over its threshold walks
	// a chunk.
	s.assistAt.Store(s.sweepAt.Load())
	s.sweepAt.Store(math.MaxInt64)
	s.sweepDue.Store(math.MaxInt64)
	if s.small() {
		// A chunk's worth: walked here, without a goroutine, and in order
		// with the requests (a test's schedule replays alike).
		for s.sweepChunk(); w.left > 0; s.sweepChunk() {
		}
		s.endSweep()
		return
	}
	w.done = make(chan struct{})
	go s.sweepAll(w.done, w.pause)
}

// small reports whether the table's keys and slots are few enough to walk
// in one chunk's time.
func (s *Store) small() bool {
	if s.keys.Load() > sweepChunk {
		return false
	}
	slots := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		slots += sh.leases.Slots()
		sh.mu.Unlock()
	}
	return slots <= 32*sweepChunk
}

// sweepAll walks the sweep under way to its end.
func (s *Store) sweepAll(done chan struct{}, pause func()) {
	defer close(done)
	for {
		if pause != nil {
			pause()
		}
		if !s.sweepStep() {
			return
		}
	}
}

// sweepStep walks the next chunk of the sweep under way, if any, and
// reports whether more is left.
func (s *Store) sweepStep() bool {
	w := &s.sw
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.on {
		return false
	}
	if !w.stop {
		s.sweepChunk()
		if w.left > 0 {
			return true
		}
	}
	s.endSweep()
	return false
}

// sweepChunk walks up to sweepChunk slots of the next shard not yet
// walked, forgetting the keys idle at the sweep's start there, and shrinks
// the shard's table (Table.Fit) once it has walked all of it. s.sw.mu must
// be held.
func (s *Store) sweepChunk() {
	w := &s.sw
	start, now := time.Now(), w.now
	defer func() { w.work += time.Since(start) }()
	i := w.next
	for w.pos[i] < 0 {
		i = (i + 1) % shardCount
	}
	w.next = (i + 1) % shardCount
	sh := &s.shards[i]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	j := w.pos[i]
	for end := min(j+sweepChunk, sh.leases.Slots()); j < end; j++ {
		w.visited++
		if !sh.leases.Live(j) {
			continue
		}
		h := sh.leases.At(j)
		l := h.l
		if !l.refill.TryLock() {
			continue
		}
		if !h.live(now) && now >= l.deny && (!w.timed || now-l.folded >= int64(l.foldD)) {
			h.leave()
			sh.leases.Bury(j)
			s.keys.Add(-1)
			w.freed++
		} else {
			w.longest = max(w.longest, l.foldD)
		}
		l.refill.Unlock()
	}
	if j < sh.leases.Slots() {
		w.pos[i] = j
		return
	}
	sh.leases.Fit()
	w.pos[i], w.left = -1, w.left-1
}

// endSweep ends the sweep under way and sets when the next is due. s.sw.mu
// must be held.
func (s *Store) endSweep() {
	w := &s.sw
	now := w.now
	w.on = false
	if !w.timed || 4*(w.seen-w.sweptTo) >= w.sweptTo || 4*w.freed >= w.seen {
		w.churnTo = now + int64(w.longest+sweepEvery)
	}
	w.sweptTo = s.keys.Load()
	s.assistAt.Store(math.MaxInt64)
	s.sweepAt.Store(max(minSweep, 2*w.sweptTo))
	wait := sweepCost * w.work
	if now < w.churnTo {
		wait = churnCost * w.work
	}
	s.sweepDue.Store(now + int64(max(sweepEvery, wait)))
}

// stopSweep ends the sweep under way, if any, and waits for its goroutine
// to exit.
func (s *Store) stopSweep() {
	w := &s.sw
	w.mu.Lock()
	w.stop = true
	done := w.done
	w.mu.Unlock()
	if done != nil {
		<-done
	}
}

// live reports whether h's units may be spent at now.
func (h *hot) live(now int64) bool {
	return h.units > 0 && now <= h.stop
}

// spendLocal takes cost units from h at now if it is live and holds them,
// and returns the decision. Its shard sh must be locked. counted: the
// request's cost is already in asked (the local path's is not, and reads
// nothing behind h.l).
func (h *hot) spendLocal(d *sluice.Decision, sh *shard, limit sluice.Limit, cost, now int64, counted bool) bool {
	if !h.live(now) || int64(h.units) < cost {
		return false
	}
	h.units -= int32(cost)
	if counted {
		h.l.mark -= cost
	}
	sh.local++
	h.fill(d, limit, now, true)
	return true
}

// local is the decision a lease under limit makes at now.
func (h *hot) local(limit sluice.Limit, now int64, allowed bool) sluice.Decision {
	var d sluice.Decision
	h.fill(&d, limit, now, allowed)
	return d
}

// fill writes local's decision into d, field by field: the local path's
// caller returns d from where it lies, where copying a whole Decision
// built on the stack stalls on the narrow stores that built it.
func (h *hot) fill(d *sluice.Decision, limit sluice.Limit, now int64, allowed bool) {
	d.Allowed = allowed
	d.Limit = limit
	d.Remaining = int64(h.rest) + int64(h.units)
	d.RetryAfter = 0
	d.ResetAfter = max(time.Duration(h.reset-now), 0)
	d.Source = sluice.SourceLease
}

// Take implements sluice.Store: from the key's lease when it is live and
// holds cost units, and otherwise after returning what is left of it and
// asking for a new one; a key that is not leased, exactly by the store.
func (s *Store) Take(ctx context.Context, key string, limit sluice.Limit, cost int64) (d sluice.Decision, err error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err // as every store: an ended call takes nothing, the lease's units included
	}
	stale, err := s.staleFor(key, limit)
	if err != nil {
		return sluice.Decision{}, err
	}
	if stale != 0 {
		if s.fast(&d, key, limit, cost, stale) {
			return d, nil
		}
		d, l, _, left, exact, err := s.spend(ctx, key, limit, cost, stale, false, true, false, nil)
		if left.units > 0 {
			return s.topUp(ctx, l, left, key, limit, cost, stale)
		}
		if errors.Is(err, errGrantFailed) {
			if p, ok := s.granter.(policyTaker); ok {
				return p.TakeByPolicy(ctx, key, limit, cost, causeOf(err))
			}
			exact, err = true, nil
		}
		if !exact {
			return d, err
		}
	}
	return s.granter.Take(ctx, key, limit, cost)
}

// errGrantFailed: the store did not answer this key's grant or return,
// during this request or while it waited for one (it is exact too). The
// request then goes to the granter's failure policy without another wait
// for the store when the granter can do that (policyTaker; for a TakeAll,
// policyAnswerer, see takeAllByPolicy), so that a request waits for a
// store that does not answer once, not twice; otherwise to the store's
// Take (a TakeAll's checks to its TakeAll, all or nothing).
var errGrantFailed = errors.New("lease: the store did not answer the key's grant")

// policyAnswers is errGrantFailed carrying the store's error that made it,
// which the failure policy's answer reports as its cause.
type policyAnswers struct{ cause error }

func (e *policyAnswers) Error() string {
	if e.cause == nil {
		return errGrantFailed.Error()
	}
	return errGrantFailed.Error() + ": " + e.cause.Error()
}

func (e *policyAnswers) Is(target error) bool { return target == errGrantFailed }

func (e *policyAnswers) Unwrap() error { return e.cause }

// causeOf is the store's error that errGrantFailed err carries, if any.
func causeOf(err error) error {
	if p := (*policyAnswers)(nil); errors.As(err, &p) {
		return p.cause
	}
	return nil
}

// policyTaker is a granter whose failure policy can answer a take without
// calling its backend: resilient.Store.
type policyTaker interface {
	TakeByPolicy(ctx context.Context, key string, limit sluice.Limit, cost int64, cause error) (sluice.Decision, error)
}

// policyPeeker is policyTaker's counterpart for Peek.
type policyPeeker interface {
	PeekByPolicy(ctx context.Context, key string, limit sluice.Limit, cost int64, cause error) (sluice.Decision, error)
}

// fast is spend's common case, a live lease that holds cost units, with
// nothing to copy back through spend's results: it takes the units and
// reports true with the decision in d, or reports false having changed
// nothing.
func (s *Store) fast(d *sluice.Decision, key string, limit sluice.Limit, cost int64, stale time.Duration) bool {
	if s.keys.Load() >= s.sweepAt.Load() || stale < MinStaleness || stale > limit.Period || cost < 1 {
		return false
	}
	id := s.knownID(limit)
	if id == 0 {
		return false
	}
	sh, tag := s.locate(key)
	sh.mu.Lock()
	now := s.now() // while the slot locate prefetched arrives
	ok := false
	if h := sh.leases.FindKind(tag, id, key); h != nil && cost <= int64(h.units) && now < s.sweepDue.Load() {
		ok = h.spendLocal(d, sh, limit, cost, now, false)
	}
	sh.mu.Unlock()
	return ok
}

// spend answers a request of cost from the key's lease, taking the units
// when it allows, and reports the lease and the units it took (got: of
// which grant, spendable until when). exact says the store should answer
// instead, as it does for a key that is not hot; force leases such a key
// all the same. The request is validated here (stale too), in full only
// when the key has no lease under limit yet: a lease's limit was validated
// when it was made. topUp lets the lease's last units be spent on the
// request with the store's (see refill): a TakeAll's only over a
// MultiStore, whose TakeAll takes the rest all or nothing with the other
// checks. left: see refill.
func (s *Store) spend(ctx context.Context, key string, limit sluice.Limit, cost int64, stale time.Duration, force, topUp, layered bool, turn *grantTurn) (_ sluice.Decision, _ *lease, got, left leftover, exact bool, _ error) {
	s.sweepIfDue()
	sh, tag := s.locate(key)
	id := s.knownID(limit)
	sh.mu.Lock()
	var h *hot
	made := false
	if id != 0 {
		h = sh.leases.FindKind(tag, id, key)
	}
	if h == nil || cost < 1 || cost > h.l.capacity || stale < MinStaleness || stale > limit.Period {
		sh.mu.Unlock()
		if err := validate(key, limit, cost, stale); err != nil {
			return sluice.Decision{}, nil, leftover{}, leftover{}, false, err
		}
		if id = s.id(limit); id == 0 {
			return sluice.Decision{}, nil, leftover{}, leftover{}, true, nil
		}
		if h == nil && s.keys.Load() >= s.assistAt.Load() {
			s.sweepStep() // a flood of new keys pays for the sweep it made due
		}
		sh.mu.Lock()
		h, made = s.lease(sh, tag, id, key, limit)
	}
	l := h.l
	now := s.now()
	d, got, ok := s.answer(h, cost, now, false)
	if !ok || !d.Allowed {
		l.asked += cost // not spent from units, which counts itself
	}
	if layered {
		l.holdOut(got)
	}
	if ok {
		if made {
			l.refill.Unlock()
		}
		sh.mu.Unlock()
		return d, l, got, leftover{}, false, nil
	}
	failed, grants := l.failed, l.gen
	sh.mu.Unlock()
	d, got, left, exact, err := s.refill(ctx, l, key, limit, cost, stale, force, topUp, layered, made, failed, grants, turn)
	return d, l, got, left, exact, err
}

// answer is l's decision at now without the store, when it has one: from a
// live lease that holds cost units, taking them (got), or a remembered
// denial. l's shard must be locked.
func (s *Store) answer(h *hot, cost int64, now int64, counted bool) (_ sluice.Decision, got leftover, ok bool) {
	l := h.l
	var d sluice.Decision
	if h.spendLocal(&d, l.sh, l.limit, cost, now, counted) {
		return d, leftover{cost, l.gen, h.stop, l.grant, true}, true
	}
	if d, ok := h.remembered(cost, now); ok {
		return d, leftover{}, true
	}
	return sluice.Decision{}, leftover{}, false
}

// remembered is h's remembered denial of cost at now, if one is in force
// for it. h's shard must be locked.
func (h *hot) remembered(cost, now int64) (sluice.Decision, bool) {
	l := h.l
	if now < l.deny && !exactWait(l.limit, cost) {
		return sluice.Decision{Limit: l.limit, RetryAfter: retryFor(l.limit, cost, l.retry-now), ResetAfter: max(time.Duration(h.reset-now), 0), Source: sluice.SourceDenyCache}, true
	}
	return sluice.Decision{}, false
}

// refill answers a request that l could not, once no other refill of l is
// in flight: from the lease another refill made meanwhile, or by giving
// back what is left and asking the store for a new grant, or (exact) by
// the store's Take. left.units > 0 (with exact): that Take is to be of
// cost − left.units, the lease's last units being spent with it (topUp).
// got: the lease's units an admission spent. held: the caller made l and
// holds its refill already. failed and grants are l.failed and l.gen when
// the request began to wait.
func (s *Store) refill(ctx context.Context, l *lease, key string, limit sluice.Limit, cost int64, stale time.Duration, force, topUp, layered, held bool, failed, grants uint64, turn *grantTurn) (_ sluice.Decision, got, _ leftover, exact bool, _ error) {
	if !held && !l.refill.TryLock() {
		// Another request's grant holds the key: the TakeAll's other
		// grants go without this one (see grantBatch).
		turn.leave()
		if err := l.refill.lockCtx(ctx); err != nil {
			return sluice.Decision{}, leftover{}, leftover{}, false, fmt.Errorf("lease: waiting for the key's grant: %w", err)
		}
	}
	defer l.refill.Unlock()
	if err := ctx.Err(); err != nil {
		// The lock was free, but the request is over: taking the lease's
		// units out to return them would lose them to a call refused for
		// its context.
		return sluice.Decision{}, leftover{}, leftover{}, false, err
	}
	sh := l.sh
	sh.mu.Lock()
	now := s.now()
	h := l.hot()
	if d, got, ok := s.answer(h, cost, now, true); ok {
		if layered {
			l.holdOut(got)
		}
		sh.mu.Unlock()
		return d, got, leftover{}, false, nil
	}
	if now < l.deny && exactWait(limit, cost) && !force {
		// The store's Take says when cost units will be there.
		sh.mu.Unlock()
		return sluice.Decision{}, leftover{}, leftover{}, true, nil
	}
	if l.gen != grants && h.units == 0 && !force {
		// A grant came while this request waited for it, and others spent
		// it: the store had no more to spare then. Its Take answers (one
		// round trip, beside the others queued), not a grant of its own in
		// turn: with a store slower than the limit's interval every grant
		// holds a unit or two, and requests queued a return and a grant
		// each would wait for all of those ahead of them (a 429 held for
		// hundreds of milliseconds).
		sh.mu.Unlock()
		return sluice.Decision{}, leftover{}, leftover{}, true, nil
	}
	if l.failed != failed {
		// A grant failed while this request waited for it: another would
		// cost it a second wait on a store that does not answer (each one
		// the failure policy's timeout, in turn); the failure policy
		// answers it (see errGrantFailed), or, without one, that failure's
		// error does.
		err, byPolicy := l.failErr, l.byPolicy
		sh.mu.Unlock()
		if !byPolicy {
			return sluice.Decision{}, leftover{}, leftover{}, false, fmt.Errorf("lease: the key's grant failed while this request waited for it: %w", err)
		}
		return sluice.Decision{}, leftover{}, leftover{}, true, &policyAnswers{err}
	}
	l.fold(h, now, stale)
	n := s.sizeFor(h, limit, cost)
	// A cost that a grant could not cover goes to the store's Take, all or
	// nothing with its exact RetryAfter, for D after that grant or until a
	// grant covers as much: partial grants returned at every retry would
	// lose units to the return rule each time, and such a request could
	// wait forever. After D the key is leased again.
	short := !force && l.short > 0 && cost >= l.short && now < l.shortEnd
	// While a top-up (below) has the live lease's last units out, or a
	// TakeAll's check units it may put back (holdOut), the store's Take
	// answers: a new grant would replace the lease, and the units, when
	// the store denies the rest, would go back less the return rule's
	// share (under overload, all of them).
	pending := l.out > 0 && l.outGen == l.gen && now <= h.stop
	// While another check of its TakeAlls denies (see quiet), the store's
	// Take answers a TakeAll's check with the others, all or nothing: a
	// grant would end unspent.
	hushed := layered && now < l.quiet
	toStore := !force && (n == 0 || short || pending || hushed)
	// A live lease's last units, too few for cost, are spent on this
	// request with the store's exact Take of the rest, rather than
	// returned less one per Interval of the lease's age (or, windowed,
	// whole: into nothing once another process has reset the key): with
	// weighted costs a lease mostly ends so. Not with a grant's:
	// a loaded store's grant is often too small to cover the request with
	// them, and then the grant or they are lost (returned young, or
	// dropped); the Take is all or nothing, and the next request is
	// granted. Whether they are spent so depends only on what Peek reads
	// (see stranded), not on the key's demand, so a Peek counts them as
	// the Take after it does.
	strand := stranded(h, limit, cost, now)
	if strand && topUp {
		left := leftover{int64(h.units), l.gen, h.stop, l.grant, false}
		if l.outGen != l.gen {
			l.out = 0
		}
		l.out, l.outGen = l.out+left.units, l.gen
		l.setUnits(h, 0)
		sh.mu.Unlock()
		return sluice.Decision{}, leftover{}, left, true, nil
	}
	if toStore && (h.units == 0 || strand) {
		// Nothing to give back (stranded units stay for smaller requests).
		sh.mu.Unlock()
		return sluice.Decision{}, leftover{}, leftover{}, true, nil
	}
	// The lease's units go back before an exact Take too: left out, they
	// would make the store deny what an exact limiter admits.
	old, unused := l.grant, int64(h.units)
	l.setUnits(h, 0)
	l.granting = !toStore
	sh.mu.Unlock()
	// A granter that can regrant takes the return and the grant in one
	// call: one round trip for a refill, where the request (and those
	// queued behind it) would wait for two.
	rg, one := s.granter.(sluice.Regranter)
	one = one && unused > 0 && !toStore
	if toStore {
		turn.leave() // no grant: the others go without waiting for its return
	}
	if !one {
		held, err := s.giveBack(ctx, key, limit, old, unused)
		if held || err != nil {
			l.doneGranting() // none is sent
		}
		if held {
			// The store did not answer the return: a grant now would most
			// likely wait as long again before the policy answers.
			l.fail(ctx, err, true)
			return sluice.Decision{}, leftover{}, leftover{}, true, &policyAnswers{err}
		}
		if err != nil {
			l.fail(ctx, err, false)
			return sluice.Decision{}, leftover{}, leftover{}, false, err
		}
		if toStore {
			return sluice.Decision{}, leftover{}, leftover{}, true, nil
		}
	}
	sent := s.now()
	var g sluice.Grant
	var err error
	var back int64
	switch {
	case turn.joined():
		// With the TakeAll's other grants, in one call (see grantBatch):
		// a regrant when it has units to give back (a GrantAller is a
		// Regranter, so unused is 0 here unless one), as below.
		back, g, err = turn.grant(sluice.GrantRequest{Key: key, Limit: limit, N: max(n, cost), Grant: old, Unused: unused})
	case one:
		back, g, err = rg.Regrant(ctx, key, limit, old, unused, max(n, cost))
	default:
		g, err = s.granter.Grant(ctx, key, limit, max(n, cost))
	}
	if one {
		s.returned.Add(uint64(back))
		if err == nil {
			s.forfeited.Add(uint64(max(unused-back, 0)))
		}
	}
	if err != nil {
		l.doneGranting()
	}
	if !errors.Is(err, resilient.ErrNotSent) {
		s.grants.Add(1)
	}
	if errors.Is(err, resilient.ErrNoGrant) {
		l.fail(ctx, err, true)
		if errors.Is(err, resilient.ErrNotSent) && !one {
			return sluice.Decision{}, leftover{}, leftover{}, true, nil // the breaker is open: Take is the policy's
		}
		// A regrant that failed or was held back is a return that did:
		// the policy answers, as after a return held back.
		return sluice.Decision{}, leftover{}, leftover{}, true, &policyAnswers{err}
	}
	if err != nil {
		// Those waiting for this call get its error at once: each sending
		// its own in turn would wait a timeout more on a stalled store.
		l.fail(ctx, err, false)
		if one {
			// Sent once, its outcome unknown: the request's error, as a
			// failed return's is; the units stay out of the store.
			return sluice.Decision{}, leftover{}, leftover{}, false, fmt.Errorf("lease: regrant: %w", err)
		}
		return sluice.Decision{}, leftover{}, leftover{}, false, err
	}
	s.granted.Add(uint64(g.Granted))
	sh.mu.Lock()
	defer sh.mu.Unlock()
	l.granting = false
	h = l.hot() // the table may have moved it
	h.reset = sent + int64(g.ResetAfter)
	if g.Granted == 0 {
		// Remembered for at most D, so that a Reset elsewhere reaches this
		// process within D, as a lease's units do.
		l.retry = sent + int64(g.RetryAfter)
		l.deny = sent + int64(min(g.RetryAfter, stale))
		if exactWait(limit, cost) && !force {
			return sluice.Decision{}, leftover{}, leftover{}, true, nil
		}
		return sluice.Decision{Limit: limit, RetryAfter: retryFor(limit, cost, int64(g.RetryAfter)), ResetAfter: g.ResetAfter}, leftover{}, leftover{}, false, nil
	}
	now = s.now()
	switch {
	case g.Granted < cost && !force:
		l.short, l.shortEnd = cost, sent+int64(stale)
	case g.Granted >= l.short:
		l.short = 0
	}
	l.gen++
	l.grant, h.rest = g, int32(g.Remaining)
	l.setUnits(h, g.Granted)
	l.sent, l.until, l.end = sent, sent+int64(stale), 0
	l.forTake = !layered
	if g.Window > 0 {
		l.end = sent + int64(g.Window)
	}
	l.setStop(h)
	if int64(h.units) >= cost && !h.live(now) {
		// The grant came back after its lease's end: its units stay for
		// the return rule, and the store answers this request exactly.
		return sluice.Decision{}, leftover{}, leftover{}, true, nil
	}
	if !h.live(now) || int64(h.units) < cost {
		if exactWait(limit, cost) && !force {
			// The granted units stay in the lease for smaller requests.
			return sluice.Decision{}, leftover{}, leftover{}, true, nil
		}
		d := h.local(limit, now, false)
		// cost Intervals, not cost − units: by the retry this lease's
		// units may have gone back to the store less the return rule's
		// Interval per Interval of age (sluice.ReturnAllowance).
		d.RetryAfter = time.Duration(cost) * limit.Interval()
		if g.Window > 0 {
			d.RetryAfter = max(time.Duration(l.end-now), time.Microsecond)
		}
		d.Source = sluice.SourceBackend
		return d, leftover{}, leftover{}, false, nil
	}
	h.units -= int32(cost)
	l.mark -= cost // counted in asked by spend
	d := h.local(limit, now, true)
	d.Source = sluice.SourceBackend
	got = leftover{cost, l.gen, h.stop, g, false}
	if layered {
		l.holdOut(got)
	}
	return d, got, leftover{}, false, nil
}

// stranded reports whether h, at now, holds units that a request of cost
// spends with the store's (Take, see refill): live and fewer than cost.
// Windowed limits' too: given back whole instead, they would go back
// into nothing once another process has reset the key (a new epoch),
// and the store's answer would no longer be the one Peek counted on.
// h's shard must be locked.
func stranded(h *hot, limit sluice.Limit, cost, now int64) bool {
	return h.live(now) && int64(h.units) < cost
}

// leftover is units taken out of a lease for a request: a live lease's
// last units, which refill took out of it for a request that needs more,
// or those a TakeAll's check spent. Of grant gen (g), spendable while
// now ≤ stop; local: spent as a decision from the lease (Stats.Local),
// which is not made if they go back.
type leftover struct {
	units int64
	gen   uint64
	stop  int64
	g     sluice.Grant
	local bool
}

// topUp answers a request of cost from the store's Take of cost − units
// and left's units: they are spent with the store's when it admits within
// their lease's life, and otherwise put back (a request the store denies).
// A Take that comes back after their lease's life is finished by finish.
func (s *Store) topUp(ctx context.Context, l *lease, left leftover, key string, limit sluice.Limit, cost int64, stale time.Duration) (sluice.Decision, error) {
	defer l.toppedUp(left)
	t := topped{req: sluice.Request{Key: key, Limit: limit, Cost: cost}, l: l, left: left, stale: stale}
	t.first.sent = s.now()
	d, err := s.granter.Take(ctx, key, limit, cost-left.units)
	if pol, ok := s.granter.(policyAnswerer); ok && err == nil && byPolicy([]sluice.Decision{d}) {
		// The store did not answer: asking it again (a return, finish's
		// Take, a sliding window counter's wait) would wait once more.
		if !d.Allowed {
			s.putBackHere(l, left)
			d.Remaining += left.units // as Peek counts them
			return d, nil
		}
		ds := []sluice.Decision{d}
		t.at = 0
		return oneOf(s.takeAllByPolicy(ctx, pol, nil, []sluice.Request{t.req}, ds, nil, nil, nil, []topped{t}, true))
	}
	if err != nil || !d.Allowed {
		perr := s.putBack(ctx, l, left, key, limit) // still the lease's, for smaller requests
		if err != nil {
			return d, err
		}
		if perr != nil {
			return sluice.Decision{}, perr
		}
		return s.withUnits(ctx, d, key, limit, cost, left.units) // as Peek counts them
	}
	t.first.back, t.first.reset = s.now(), d.ResetAfter
	if t.first.back <= left.stop {
		return d, nil
	}
	ds := []sluice.Decision{d}
	if _, err := s.finish(ctx, nil, []topped{t}, ds, t.first.back); err != nil {
		return sluice.Decision{}, err
	}
	return ds[0], nil
}

// oneOf is the one decision of ds, or err.
func oneOf(ds []sluice.Decision, err error) (sluice.Decision, error) {
	if err != nil {
		return sluice.Decision{}, err
	}
	return ds[0], nil
}

// topped is an admitted request that holds units of a lease (left, of l),
// spendable only while that lease lives, and the units the store took for
// the rest of its cost, by first (none when left covers the cost). Its
// answer is out[at] of finish's out.
type topped struct {
	req   sluice.Request // the whole cost
	l     *lease
	left  leftover
	stale time.Duration
	first span
	at    int
}

// finish answers requests, all or nothing, that the store admitted (or
// their leases did) with the last call coming back at back, when a lease
// had ended by then: its units cannot be spent (the store may have taken
// its units after the lease ended), so they go back under the return rule,
// and the request takes as many from the store too, exactly, rather than
// being denied with the store's units taken for nothing. That Take comes
// back later still, so every lease's units are looked at again after it.
// Units taken go together as a lease's would: within stale of the send of
// the Take that took the first of them, and for the window algorithms in
// one window; otherwise the last Take's units are kept, and the rest taken
// again (after finishRounds, or when the units kept are already too old,
// the whole cost: an exact Take). Denied, the leases' units still held go
// back, the units taken are lost with the requests, as a client's that
// gives up halfway, and a request's wait is for its whole cost. out holds
// the requests' answers, and gets the store's. ok: every request was
// admitted.
func (s *Store) finish(ctx context.Context, multi sluice.MultiStore, ts []topped, out []sluice.Decision, back int64) (ok bool, _ error) {
	// held is what a request holds of its cost from the store: units
	// taken, the send of the Take that took the first of them, and the
	// Take that says which window they count in.
	type held struct {
		units, since int64
		at           span
	}
	hs := make([]held, len(ts))
	for i, t := range ts {
		hs[i] = held{t.req.Cost - t.left.units, t.first.sent, t.first}
	}
	// giveUp puts back the leases' units still held, for a request that is
	// not admitted.
	giveUp := func() error {
		var errs []error
		for i := range ts {
			if t := &ts[i]; t.left.units > 0 {
				errs = append(errs, s.putBack(ctx, t.l, t.left, t.req.Key, t.req.Limit))
				out[t.at].Remaining += t.left.units // as Peek counts them
				t.left.units = 0
			}
		}
		return errors.Join(errs...)
	}
	for round := 0; ; round++ {
		var open []int // the requests that need more from the store
		for i := range ts {
			t := &ts[i]
			if t.left.units > 0 && back > t.left.stop {
				err := s.putBack(ctx, t.l, t.left, t.req.Key, t.req.Limit)
				t.left.units = 0
				if err != nil {
					return false, errors.Join(err, giveUp())
				}
			}
			if hs[i].units+t.left.units < t.req.Cost {
				open = append(open, i)
			}
		}
		if len(open) == 0 {
			return true, nil
		}
		now := s.now()
		need := make([]sluice.Request, len(open))
		for j, i := range open {
			h, t := &hs[i], ts[i]
			if round >= finishRounds || now > h.since+int64(t.stale) || windowed(t.req.Limit) && h.at.windowEnd(t.req.Limit) <= now {
				s.lost.Add(uint64(h.units))
				h.units = 0 // too old, or of a window that may have ended
			}
			need[j] = t.req
			need[j].Cost -= h.units
		}
		sent := s.now()
		got, err := s.takeRest(ctx, multi, need)
		if err != nil {
			return false, errors.Join(err, giveUp())
		}
		back = s.now()
		ok = true
		for j, i := range open {
			out[ts[i].at], ok = got[j], ok && got[j].Allowed
		}
		if !ok {
			var lost int64 // what the store took for the requests
			for i := range hs {
				lost += hs[i].units
			}
			for j := range open {
				if got[j].Allowed {
					lost += need[j].Cost
				}
			}
			s.lost.Add(uint64(lost))
			errs := []error{giveUp()}
			for _, i := range open {
				if t := ts[i]; !out[t.at].Allowed && hs[i].units > 0 {
					out[t.at], err = s.waitFor(ctx, out[t.at], t.req.Key, t.req.Limit, t.req.Cost, hs[i].units)
					errs = append(errs, err)
				}
			}
			return false, errors.Join(errs...)
		}
		for j, i := range open {
			h, t := &hs[i], ts[i]
			this := span{sent, back, got[j].ResetAfter}
			switch {
			case h.units == 0:
				*h = held{t.req.Cost, sent, this}
			case back <= h.since+int64(t.stale) && sameWindow(t.req.Limit, h.at, this):
				h.units = t.req.Cost
			default:
				s.lost.Add(uint64(h.units))
				*h = held{need[j].Cost, sent, this} // the rest again
			}
		}
	}
}

// takeRest takes reqs from the store, all or nothing, for finish: in one
// TakeAll, or from a granter that has none (TakeAll's checks were all
// leased then) one at a time, until one denies, the rest then Peeked; the
// units of those taken before it are lost with the request.
func (s *Store) takeRest(ctx context.Context, multi sluice.MultiStore, reqs []sluice.Request) ([]sluice.Decision, error) {
	if multi != nil || len(reqs) < 2 {
		return s.exactly(ctx, multi, reqs, true)
	}
	return s.oneByOne(ctx, reqs, true, true)
}

// finishRounds is how many Takes finish sends, at most, before the whole
// cost's (only a store whose calls straddle a window's end each time, or
// last near D, needs more than one).
const finishRounds = 3

// span is a Take that admitted: sent and answered (back) on the Store's
// clock, and its decision's ResetAfter.
type span struct {
	sent, back int64
	reset      time.Duration
}

// windowEnd is the earliest the window that t counted in can end, under
// a window algorithm: reset after t's instant, which lies between sent
// and back, and for the sliding window counter a period sooner (the key
// is fresh once that window's count has weighed for a period more); less
// a µs for the stores' rounding.
func (t span) windowEnd(limit sluice.Limit) int64 {
	end := t.sent + int64(t.reset-time.Microsecond)
	if limit.Algorithm == sluice.SlidingWindowCounter {
		end -= int64(limit.Period)
	}
	return end
}

// sameWindow reports whether a and b surely counted in one window: each
// window's end lies within its Take's sent..back after its ResetAfter,
// and two windows' ends lie a period apart. Always true for the
// algorithms without windows.
func sameWindow(limit sluice.Limit, a, b span) bool {
	if !windowed(limit) {
		return true
	}
	lo := min(a.sent+int64(a.reset), b.sent+int64(b.reset))
	hi := max(a.back+int64(a.reset), b.back+int64(b.reset))
	// The stores count µs: a µs either way for their rounding.
	return hi-lo < int64(limit.Period-2*time.Microsecond)
}

// windowed reports whether limit's algorithm counts in windows.
func windowed(limit sluice.Limit) bool {
	return limit.Algorithm == sluice.FixedWindow || limit.Algorithm == sluice.SlidingWindowCounter
}

// putBack puts left's units back into l when it still holds their grant
// (a lease that has ended gives them back on its next refill); otherwise
// it gives them back now, under the return rule, rather than strand them.
// Only a return the store refused is an error; one a failure policy held
// back leaves them out of the store, which can only lower admissions.
func (s *Store) putBack(ctx context.Context, l *lease, left leftover, key string, limit sluice.Limit) error {
	if l.restore(left.gen, left.units, left.local) {
		return nil
	}
	if _, err := s.giveBack(ctx, key, limit, left.g, left.units); err != nil && !errors.Is(err, resilient.ErrNoGrant) {
		return err
	}
	return nil
}

// exactWait reports whether a denial of cost units under limit must come
// from the store's Take: for the sliding window counter, when n > 1 units
// will be there depends on the previous window's count, which a lease
// does not know (the window's end is too early: that count then weighs in
// full), and no figure the lease has is an upper bound.
func exactWait(limit sluice.Limit, cost int64) bool {
	return limit.Algorithm == sluice.SlidingWindowCounter && cost > 1
}

// retryFor is the wait for cost units on a key whose first unit is wait
// ns away (at least 1µs): for the bucket algorithms and GCRA, one Interval
// more per further unit; for the window algorithms, whose wait is the
// window's end, the same wait.
func retryFor(limit sluice.Limit, cost, wait int64) time.Duration {
	d := max(time.Duration(wait), time.Microsecond)
	if limit.Algorithm != sluice.FixedWindow && limit.Algorithm != sluice.SlidingWindowCounter {
		d += time.Duration(cost-1) * limit.Interval()
	}
	return d
}

// restore puts back cost units that spend took from grant gen, and
// reports whether it did: only while l still holds that grant. local:
// spend answered from the lease, a local decision that is now not made.
func (l *lease) restore(gen uint64, cost int64, local bool) bool {
	l.sh.mu.Lock()
	defer l.sh.mu.Unlock()
	if local {
		l.sh.local-- // no decision was made after all
	}
	if l.gen != gen || l.granting {
		// A grant under way would land on them: their grant's units go
		// back to the store.
		return false
	}
	h := l.hot()
	h.units += int32(cost)
	l.mark += cost // still asked
	return true
}

// hotUnits is the demand, in units expected within D, from which a key is
// leased: below it a lease would save few round trips and strand units.
const hotUnits = 4

// fold adds the units asked since the last fold to l's demand: an
// exponentially weighted moving average, with time constant d, of the
// units this process asks for the key per d. Over a gap dt the old figure
// keeps the weight e^(−dt/d) and the rate seen over the gap, scaled to d,
// takes the rest; a gap of zero adds what was asked.
func (l *lease) fold(h *hot, now int64, d time.Duration) {
	l.setUnits(h, int64(h.units))
	dt := time.Duration(now - l.folded)
	switch {
	case l.folded == 0:
		l.demand = float64(l.asked)
	case dt <= 0:
		l.demand += float64(l.asked)
	default:
		w := -math.Expm1(-float64(dt) / float64(d))
		l.demand = l.demand*(1-w) + float64(l.asked)*w*float64(d)/float64(dt)
	}
	// A denied TakeAll takes its cost out after a fold may have counted it
	// (unask): asked, and so the sum, can be negative.
	l.demand = max(l.demand, 0)
	l.asked, l.folded, l.foldD = 0, now, d
}

// sizeFor is how many units a grant for h's lease asks to cover a request of
// cost, at most Capacity, or 0 when the store should answer the request
// exactly. Options.Size, raised to cost, when set. Otherwise 0 for a key
// that is not hot (demand below hotUnits), and for a hot one its demand
// rounded up, capped at Capacity / (2 × fleet size), at least 1, and scarce
// of that (rounded up) when the lease's last grant left the store under half
// the limit's Capacity; 0 again when that is under twice cost, since such a
// lease would be a Take that strands what is left of it: too few for another
// such request. A lease mostly ends holding units when fewer requests than
// its demand came in its life; they are lost (the return rule gives nothing
// back at that age), which costs admissions only when the store runs short:
// then a smaller lease strands fewer, at the price of more grants.
func (s *Store) sizeFor(h *hot, limit sluice.Limit, cost int64) int64 {
	if s.size > 0 {
		return min(max(s.size, cost), limit.Capacity())
	}
	l := h.l
	if l.demand < hotUnits {
		return 0
	}
	fleet := 1
	if s.fleet != nil {
		fleet = max(s.fleet(), 1)
	}
	n := min(int64(math.Ceil(l.demand)), max(limit.Capacity()/int64(2*fleet), 1))
	if l.gen > 0 && int64(h.rest) < limit.Capacity()/2 {
		n = int64(math.Ceil(float64(n) * scarce))
	}
	if n < 2*cost {
		return 0
	}
	return n
}

// scarce is the share of its size a lease holds when the store has little
// left (see sizeFor): on simulated fleets offered the limit, it cut the
// units lost by a third to a half, for 6–8 % more store calls.
const scarce = 0.75

// giveBack returns unused units of g, once: on an error they stay out of
// the store (a resent return could make budget). A return a failure policy
// held back or saw fail (resilient.ErrNoGrant) is reported as held, with
// that error for the policy's answer to report, but is no error of the
// request's: the policy has counted it.
func (s *Store) giveBack(ctx context.Context, key string, limit sluice.Limit, g sluice.Grant, unused int64) (held bool, _ error) {
	if unused == 0 {
		return false, nil
	}
	n, err := s.granter.Return(ctx, key, limit, g, unused)
	if errors.Is(err, resilient.ErrNoGrant) {
		return true, err
	}
	if err != nil {
		return false, fmt.Errorf("lease: return: %w", err)
	}
	s.returned.Add(uint64(n))
	s.forfeited.Add(uint64(max(unused-n, 0)))
	return false, nil
}

// TakeAll implements sluice.MultiStore, all-or-nothing: a leased check's
// units are taken from its lease first and put back when another check
// denies, and the checks not leased go to the granter's TakeAll, only once
// every leased one admits (otherwise they are Peeked). While a check holds
// a live lease's units, the key's refills are the store's Take (see
// holdOut), so that they go back into that lease; units put back after
// their lease was regranted (it had ended) go back to the store under the
// return rule. A live lease whose units
// are too few for its check spends them with the store's Take of the rest,
// as Take does (see refill), in that TakeAll: when it denies, the lease
// keeps them. The leases' units are spent when the request is admitted,
// once the last store call is back: when a lease has ended by then, finish
// takes their number from the store too (one at a time from a granter that
// is not a MultiStore; see takeRest). A granter that is not a
// sluice.MultiStore gets every check with a staleness above zero leased,
// hot or not, and at most one with none (ErrNoTakeAll otherwise; a limit
// met after the Store's 2^20th is never leased, see the package doc). Two
// checks on one key under one algorithm are sluice.ErrInvalidKey. Over a
// MultiStore, when other checks deny for D or longer, a GCRA or bucket
// check's lease gives its units back at once (not one granted for a Take:
// the key's single requests spend it), and for D that key's refills in
// TakeAlls are the store's Take with the others, not grants (see quiet).
// The checks that need a grant (or a refill) send theirs at once, in one
// GrantAll over a sluice.GrantAller (see grantBatch), so a batching store
// sends them together: one round trip for all, not one per check; the checks their leases answer take their units once
// those calls are back, not holding them meanwhile (see spendAll); with
// no call, a check's remembered denial answers the TakeAll without taking
// any lease's units (see allLocal). Over a failure policy (resilient), a
// TakeAll sends no call after those grants once one failed: the policy
// answers what the leases cannot (see "Failure policies" in the package
// doc).
func (s *Store) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if s == nil || s.granter == nil {
		return nil, ErrNoGranter
	}
	multi, _ := s.granter.(sluice.MultiStore)
	stale := make([]time.Duration, len(reqs))
	unleased := 0
	for i, r := range reqs {
		d, err := s.check(r.Key, r.Limit, r.Cost)
		if err == nil && d == 0 {
			unleased++
			err = sluice.ValidateRequest(r.Key, r.Limit, r.Cost)
		}
		if err != nil {
			return nil, fmt.Errorf("lease: request %d: %w", i, err)
		}
		stale[i] = d
	}
	if err := sluice.ValidateRequests(reqs); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	if multi == nil && unleased > 1 {
		return nil, ErrNoTakeAll
	}
	out := make([]sluice.Decision, len(reqs))
	asked := make([]*lease, len(reqs))   // each leased check's lease, whose demand its cost counts in
	spent := make([]leftover, len(reqs)) // the units each held lease's check took
	if unleased == 0 {
		if ok, err := s.allLocal(ctx, reqs, stale, multi, out, asked, spent); err != nil {
			return nil, err
		} else if ok {
			return out, nil
		}
	}
	held := make([]*lease, len(reqs))
	// stalled: the store did not answer a call of this TakeAll's (a
	// grant or return it sent or waited for, or the call the failure
	// policy answered), and each call more would wait another timeout.
	// The policy then answers what the leases cannot (takeAllByPolicy),
	// and units go back into their leases only (putBackHere).
	pol, _ := s.granter.(policyAnswerer)
	stalled := false
	var cause error // the failed call's error, for the policy's answers
	// putBack puts back the units the held leases' checks took: into
	// their lease, or, when it was regranted meanwhile (by requests
	// answered while this one's store call was out), to the store under
	// the return rule. Dropped, they were lost to a fixed window until its
	// end: under overload most of what it had.
	putBack := func() error {
		var errs []error
		for i, l := range held {
			if l != nil {
				errs = append(errs, s.putBackOnce(ctx, stalled, l, spent[i], reqs[i].Key, reqs[i].Limit))
				out[i].Remaining += reqs[i].Cost
			}
		}
		return errors.Join(errs...)
	}
	var exact []sluice.Request
	var at []int
	var tops []topped
	defer func() {
		for _, t := range tops {
			t.l.toppedUp(t.left)
		}
	}()
	var topAt []int // each top-up's index in reqs
	// putLeft puts the units of the top-ups back, which the requests
	// could not spend (a failed call, or another check's denial).
	putLeft := func() error {
		var errs []error
		for _, t := range tops {
			errs = append(errs, s.putBackOnce(ctx, stalled, t.l, t.left, t.req.Key, t.req.Limit))
		}
		return errors.Join(errs...)
	}
	all := true
	// With a MultiStore, a live lease's last units too few for the check
	// go with the store's Take of the rest, all or nothing with the other
	// exact checks, as Take spends them: returned, young as they are, the
	// return rule would keep one per Interval of their age (at a high
	// rate, all of them).
	var buf [4]spendResult
	var res []spendResult
	if len(reqs) <= len(buf) {
		res = buf[:len(reqs)]
	} else {
		res = make([]spendResult, len(reqs))
	}
	s.spendAll(ctx, reqs, stale, multi, res)
	defer func() {
		for _, r := range res {
			if r.got.units > 0 {
				r.l.toppedUp(r.got)
			}
		}
	}()
	var failed error // the first check's error: every check's units go back
	for i, r := range reqs {
		if stale[i] > 0 {
			d, l, got, left, ex, err := res[i].d, res[i].l, res[i].got, res[i].left, res[i].exact, res[i].err
			asked[i] = l
			if left.units > 0 {
				tops, topAt = append(tops, topped{req: r, l: l, left: left, stale: stale[i]}), append(topAt, i)
				r.Cost -= left.units
			}
			if errors.Is(err, errGrantFailed) {
				if pol != nil && !stalled {
					// The checks after it are answered by their leases
					// or, without a call, by the policy.
					stalled, cause = true, causeOf(err)
				}
				ex, err = true, nil
			}
			if err != nil {
				failed = cmp.Or(failed, err)
				continue
			}
			if !ex {
				out[i], all = d, all && d.Allowed
				if d.Allowed {
					held[i], spent[i] = l, got
				}
				continue
			}
		}
		exact, at = append(exact, r), append(at, i)
	}
	if failed != nil {
		return nil, errors.Join(failed, putBack(), putLeft())
	}
	var holds []topped // the leases' units the admitted checks hold
	for i, l := range held {
		if l != nil {
			holds = append(holds, topped{req: reqs[i], l: l, left: spent[i], stale: stale[i], at: i})
		}
	}
	if stalled {
		// A top-up's check goes to the policy whole, its units back into
		// its lease: the policy's units and a lease's do not make one
		// decision.
		for k, i := range topAt {
			s.putBackHere(tops[k].l, tops[k].left)
			exact[slices.Index(at, i)].Cost = reqs[i].Cost
		}
		return s.takeAllByPolicy(ctx, pol, cause, reqs, out, asked, at, exact, holds, all)
	}
	sent := s.now()
	ds, err := s.exactly(ctx, multi, exact, all)
	if err != nil {
		return nil, errors.Join(err, putBack(), putLeft())
	}
	back := s.now()
	for j, d := range ds {
		out[at[j]], all = d, all && d.Allowed
	}
	stalled = pol != nil && byPolicy(ds)
	if !all {
		if err := errors.Join(putBack(), putLeft()); err != nil {
			return nil, err
		}
		unask(asked, reqs)
		for k, i := range topAt {
			t := tops[k]
			if out[i].Allowed || stalled {
				// A Peek of the rest, as Peek counts them; or the policy's
				// answer, the store not asked again for the wait.
				out[i].Remaining += t.left.units
				continue
			}
			if out[i], err = s.withUnits(ctx, out[i], t.req.Key, t.req.Limit, t.req.Cost, t.left.units); err != nil {
				return nil, err
			}
		}
		if multi != nil && !stalled {
			// (Without a MultiStore a check must be leased: a lease given
			// back would be granted again at the next request. A policy's
			// denial says nothing of the store's keys.)
			if err := s.quietAll(ctx, reqs, stale, asked, out); err != nil {
				return nil, err
			}
		}
		return out, nil
	}
	// The leases' units are spent now, as the request is admitted: not
	// those of a lease that ended while the store's call, or another
	// check's grant, was out (see finish).
	late := false
	for _, h := range holds {
		late = late || back > h.left.stop
	}
	for _, t := range tops {
		late = late || back > t.left.stop
	}
	if !late {
		return out, nil
	}
	for k, i := range topAt {
		t := tops[k]
		t.first, t.at = span{sent, back, out[i].ResetAfter}, i
		holds = append(holds, t)
	}
	if stalled {
		// The policy answered the store's call: it answers for the ended
		// leases' units too, rather than a Take of them from the store.
		return s.takeAllByPolicy(ctx, pol, nil, reqs, out, asked, nil, nil, holds, true)
	}
	ok, err := s.finish(ctx, multi, holds, out, back)
	if err != nil {
		return nil, err
	}
	if !ok {
		// The checks the store answered alone are lost too (a top-up's
		// rest is finish's).
		var lost int64
		for j, i := range at {
			if !slices.Contains(topAt, i) {
				lost += exact[j].Cost
			}
		}
		s.lost.Add(uint64(lost))
	}
	return out, nil
}

// spendResult is what spend reported for one of a TakeAll's checks.
type spendResult struct {
	d         sluice.Decision
	l         *lease
	got, left leftover
	exact     bool
	err       error
}

// spendAll spends each of reqs with a staleness above zero (see spend),
// for TakeAll: from the leases alone when they can answer every check;
// otherwise the checks that need a store call send them all at once, each
// a call of its own, so a batching store sends them together, and a
// layered request waits about one round trip for its grants rather than
// one per check, and the others are answered from their leases after.
// Each call is still sent once, and a check that another denies puts its
// units back (TakeAll); a store that does not answer costs the calls one
// wait, side by side.
func (s *Store) spendAll(ctx context.Context, reqs []sluice.Request, stale []time.Duration, multi sluice.MultiStore, res []spendResult) {
	var buf [4]int
	calls := buf[:0] // the checks that need the store
	for i, r := range reqs {
		if stale[i] == 0 {
			continue
		}
		if d, l, got, ok := s.fromLease(r.Key, r.Limit, r.Cost, stale[i], fromHeld); ok {
			res[i] = spendResult{d: d, l: l, got: got}
			continue
		}
		calls = append(calls, i)
	}
	if len(calls) == 0 {
		return
	}
	// The units the leases answered with go back into them until the calls
	// are back, and are taken then: held meanwhile, the leases looked short
	// to the key's other requests, which went to the store (see holdOut).
	var lbuf [4]int
	again := lbuf[:0]
	for i := range res {
		if r := &res[i]; r.got.units > 0 && r.l.untake(r.got, true) {
			*r = spendResult{}
			again = append(again, i)
		}
	}
	if len(calls) == 1 {
		res[calls[0]] = s.spendOne(ctx, reqs[calls[0]], stale[calls[0]], multi, nil)
	} else {
		s.spendTogether(ctx, reqs, stale, multi, calls, res)
	}
	for _, i := range again {
		r := reqs[i]
		if d, l, got, ok := s.fromLease(r.Key, r.Limit, r.Cost, stale[i], fromHeld); ok {
			res[i] = spendResult{d: d, l: l, got: got}
			continue
		}
		if denied(res, stale) {
			// Spent meanwhile, for a request another check denies: the
			// store's Peek says what it would have said (TakeAll).
			res[i] = spendResult{exact: true}
			continue
		}
		res[i] = s.spendOne(ctx, r, stale[i], multi, nil) // spent meanwhile: a call of its own
	}
}

// denied reports whether a leased check of res is denied.
func denied(res []spendResult, stale []time.Duration) bool {
	for j, r := range res {
		if stale[j] > 0 && r.err == nil && !r.exact && r.l != nil && !r.d.Allowed {
			return true
		}
	}
	return false
}

// spendTogether is spendAll's calls, each on a goroutine of its own (kept
// apart, with copies of what they read, so that a TakeAll its leases
// answer allocates nothing for them). Over a sluice.GrantAller their
// grants go in one call of it (see grantBatch).
func (s *Store) spendTogether(ctx context.Context, reqs []sluice.Request, stale []time.Duration, multi sluice.MultiStore, calls []int, res []spendResult) {
	type call struct {
		r     sluice.Request
		stale time.Duration
		turn  *grantTurn
		got   spendResult
	}
	cs := make([]call, len(calls))
	ga, _ := s.granter.(sluice.GrantAller)
	var batch *grantBatch
	if ga != nil {
		batch = newGrantBatch(len(calls))
	}
	var wg sync.WaitGroup
	for j, i := range calls {
		c := &cs[j]
		c.r, c.stale = reqs[i], stale[i]
		if batch != nil {
			c.turn = &grantTurn{b: batch}
		}
		wg.Go(func() {
			defer c.turn.leave()
			c.got = s.spendOne(ctx, c.r, c.stale, multi, c.turn)
		})
	}
	if batch != nil {
		batch.send(ctx, ga)
	}
	wg.Wait()
	for j, i := range calls {
		res[i] = cs[j].got
	}
}

// spendOne is spend for one of TakeAll's checks; turn: its grant's place
// in the TakeAll's grantBatch (nil: none).
func (s *Store) spendOne(ctx context.Context, r sluice.Request, stale time.Duration, multi sluice.MultiStore, turn *grantTurn) spendResult {
	d, l, got, left, ex, err := s.spend(ctx, r.Key, r.Limit, r.Cost, stale, multi == nil, multi != nil, true, turn)
	return spendResult{d, l, got, left, ex, err}
}

// How fromLease answers a check from its lease.
const (
	fromHeld   = iota // taking the units, held out (holdOut); a denial counted as spend counts it
	fromTaken         // taking them, not held out, a denial not counted (see allLocal)
	fromPeeked        // taking nothing: an admission's verdict is a Peek's
)

// fromLease answers a check from its key's lease alone, as spend does
// before any store call: a live lease that holds cost units, taking them
// (got) unless how is fromPeeked, or a remembered denial. ok is false, with
// nothing changed, when the check needs spend's refill (or its
// validation).
func (s *Store) fromLease(key string, limit sluice.Limit, cost int64, stale time.Duration, how int) (_ sluice.Decision, _ *lease, got leftover, ok bool) {
	s.sweepIfDue()
	id := s.knownID(limit)
	if id == 0 || cost < 1 || stale < MinStaleness || stale > limit.Period {
		return sluice.Decision{}, nil, leftover{}, false
	}
	sh, tag := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	h := sh.leases.FindKind(tag, id, key)
	if h == nil || cost > h.l.capacity {
		return sluice.Decision{}, nil, leftover{}, false
	}
	now := s.now()
	if how == fromPeeked {
		if h.live(now) && int64(h.units) >= cost {
			return h.local(limit, now, true), h.l, leftover{}, true
		}
		d, ok := h.remembered(cost, now)
		return d, h.l, leftover{}, ok
	}
	d, got, ok := s.answer(h, cost, now, false)
	if how == fromHeld {
		if ok && !d.Allowed {
			h.l.asked += cost // as spend counts it
		}
		h.l.holdOut(got)
	}
	return d, h.l, got, ok
}

// allLocal answers a TakeAll whose checks are all leased from their leases
// alone, with no call, when they can: every check admitted from its live
// lease, the units spent at once (none held out: no call comes between
// the take and the admission); or a check that a remembered denial
// answers, and then the TakeAll is denied without taking any lease's
// units: the checks before it put theirs back, those after it are
// answered as a Peek would, and no check counts in its key's demand (a
// denied TakeAll counts none, see unask). ok is false, with nothing
// changed (its units put back, as a denied TakeAll's), when a check needs
// the store, or a lease ended before the last check's answer: TakeAll's
// other path answers then. got and ls are scratch of len(reqs).
func (s *Store) allLocal(ctx context.Context, reqs []sluice.Request, stale []time.Duration, multi sluice.MultiStore, out []sluice.Decision, ls []*lease, got []leftover) (ok bool, err error) {
	deny := -1 // the first check a remembered denial answers
	stop := int64(math.MaxInt64)
	n := len(reqs)
	for i, r := range reqs {
		how := fromTaken
		if deny >= 0 {
			how = fromPeeked
		}
		d, l, g, ok := s.fromLease(r.Key, r.Limit, r.Cost, stale[i], how)
		if !ok {
			n = i
			break
		}
		out[i], ls[i], got[i] = d, l, g
		if g.units > 0 {
			stop = min(stop, g.stop)
		}
		if !d.Allowed && deny < 0 {
			deny = i
		}
	}
	if n == len(reqs) && deny < 0 && s.now() <= stop {
		return true, nil
	}
	// Denied, or answered elsewhere: the units go back as they came.
	for i := range n {
		g := got[i]
		if g.units == 0 {
			continue
		}
		out[i].Remaining += g.units
		if ls[i].untake(g, false) {
			continue
		}
		// The lease ended or was granted again meanwhile: back as a denied
		// TakeAll's units go back, not counted in demand.
		if err := s.putBack(ctx, ls[i], g, reqs[i].Key, reqs[i].Limit); err != nil {
			return false, err
		}
		unask(ls[i:i+1], reqs[i:i+1])
	}
	if n < len(reqs) || deny < 0 {
		clear(out)
		clear(ls)
		clear(got)
		return false, nil
	}
	if multi != nil {
		if err := s.quietAll(ctx, reqs, stale, ls, out); err != nil {
			return false, err
		}
	}
	return true, nil
}

// policyAnswerer is a granter whose failure policy answers takes, peeks
// and TakeAlls without calling its backend: resilient.Store.
type policyAnswerer interface {
	policyTaker
	policyPeeker
	TakeAllByPolicy(ctx context.Context, reqs []sluice.Request, cause error) ([]sluice.Decision, error)
}

// byPolicy reports whether a failure policy made any of ds: the store's
// call for them failed or was held back.
func byPolicy(ds []sluice.Decision) bool {
	for _, d := range ds {
		switch d.Source {
		case sluice.SourceFallback, sluice.SourceFailOpen, sluice.SourceFailClosed:
			return true
		}
	}
	return false
}

// takeAllByPolicy ends a TakeAll while the store does not answer (see
// TakeAll's stalled), with no store call: the failure policy answers the
// checks at (need[j] for reqs[at[j]]), taken all or nothing when admit
// holds, else Peeked; holds are the admitted checks' leases' units. While
// every check admits, a lease that has ended cannot spend its units: they
// go back into it and the policy answers for them, with the others (or in
// turn, for a lease that ended during the policy's answer: what the policy
// took before is then lost if it denies, which can only lower admissions).
// Denied, every lease's units go back into it. cause is the failed call's
// error.
func (s *Store) takeAllByPolicy(ctx context.Context, pol policyAnswerer, cause error, reqs []sluice.Request, out []sluice.Decision, asked []*lease, at []int, need []sluice.Request, holds []topped, admit bool) ([]sluice.Decision, error) {
	for {
		if admit {
			now := s.now()
			live := holds[:0]
			for _, h := range holds {
				if now <= h.left.stop {
					live = append(live, h)
					continue
				}
				s.putBackHere(h.l, h.left)
				r := h.req
				r.Cost = h.left.units
				at, need = append(at, h.at), append(need, r)
			}
			holds = live
		}
		if len(need) > 0 {
			ds, err := policyAnswer(ctx, pol, need, admit, cause)
			if err != nil {
				for _, h := range holds {
					s.putBackHere(h.l, h.left)
				}
				return nil, err
			}
			for j, i := range at {
				out[i], admit = ds[j], admit && ds[j].Allowed
			}
		}
		if !admit {
			break
		}
		if len(need) == 0 {
			return out, nil
		}
		at, need = nil, nil
	}
	for _, h := range holds {
		s.putBackHere(h.l, h.left)
		out[h.at].Remaining += h.left.units // as Peek counts them
	}
	unask(asked, reqs)
	return out, nil
}

// policyAnswer answers reqs by the failure policy, which calls nothing:
// with take, all or nothing in one step (TakeAllByPolicy: no other
// request takes between its checks), else each Peeked.
func policyAnswer(ctx context.Context, pol policyAnswerer, reqs []sluice.Request, take bool, cause error) ([]sluice.Decision, error) {
	if take {
		return pol.TakeAllByPolicy(ctx, reqs, cause)
	}
	out := make([]sluice.Decision, len(reqs))
	for i, r := range reqs {
		var err error
		if out[i], err = pol.PeekByPolicy(ctx, r.Key, r.Limit, r.Cost, cause); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// putBackHere puts left's units back into l when it still holds their
// grant, and otherwise leaves them out of the store, with no call to it
// (it is not answering): that can only lower admissions.
func (s *Store) putBackHere(l *lease, left leftover) {
	l.restore(left.gen, left.units, left.local)
}

// putBackOnce is putBack, or putBackHere while the store does not answer.
func (s *Store) putBackOnce(ctx context.Context, stalled bool, l *lease, left leftover, key string, limit sluice.Limit) error {
	if stalled {
		s.putBackHere(l, left)
		return nil
	}
	return s.putBack(ctx, l, left, key, limit)
}

// quietAll quiets (see quiet) the GCRA and bucket leases of a denied
// TakeAll's checks that another check denies for D or longer. asked holds
// the leases its checks were asked from.
func (s *Store) quietAll(ctx context.Context, reqs []sluice.Request, stale []time.Duration, asked []*lease, out []sluice.Decision) error {
	var errs []error
	for i, r := range reqs {
		if asked[i] == nil || windowed(r.Limit) {
			// A window's units go back whole while it lasts, and a lease
			// of it quieted would send every request to the store while
			// another check denies.
			continue
		}
		var wait time.Duration // until every other check could admit
		for j, d := range out {
			if j != i && !d.Allowed {
				wait = max(wait, d.RetryAfter)
			}
		}
		if wait < stale[i] {
			continue // a lease granted now could still be spent
		}
		errs = append(errs, s.quiet(ctx, asked[i], r.Key, r.Limit, stale[i]))
	}
	return errors.Join(errs...)
}

// quiet is for a GCRA or bucket lease whose TakeAll another check denied
// for D or longer: no TakeAll can spend its units while it lives, nor
// a new lease's (layered checks mostly come together), and a lease that
// ends unspent goes back less one unit per Interval of its age. Under a
// spent fixed window that lost about all the GCRA refilled meanwhile:
// every D, each process's refill for a request the window then denied.
// So its units go back now, young, and for D its TakeAlls' refills are
// the store's Take, all or nothing with the other checks, not grants.
// A lease granted for a Take keeps them: the key's single requests
// spend it. Returns keep the bound (see "The bound"); exact Takes are exact.
func (s *Store) quiet(ctx context.Context, l *lease, key string, limit sluice.Limit, stale time.Duration) error {
	sh := l.sh
	sh.mu.Lock()
	now := s.now()
	h := l.hot()
	if l.gone != nil {
		sh.mu.Unlock()
		return nil
	}
	l.quiet = max(l.quiet, now+int64(stale))
	if h.units == 0 || l.granting || l.forTake {
		// A Take's lease is spent by the key's Takes: given back young at
		// every such denial, it lost a unit per Interval of its age.
		sh.mu.Unlock()
		return nil
	}
	old, unused := l.grant, int64(h.units)
	l.setUnits(h, 0)
	sh.mu.Unlock()
	if _, err := s.giveBack(ctx, key, limit, old, unused); err != nil && !errors.Is(err, resilient.ErrNoGrant) {
		return err
	}
	return nil
}

// unask takes a denied TakeAll's costs out of its leased checks' demand.
// A check that another one keeps denying spends nothing; counted, those
// requests kept its key leased, and every lease ended unspent and went
// back less the return rule's unit per Interval begun: about a unit per D
// lost, which drained a key that refills slower than that. A check denied
// by its own store is at its limit, where a lease grants nothing anyway.
func unask(ls []*lease, reqs []sluice.Request) {
	for i, l := range ls {
		if l != nil {
			l.sh.mu.Lock()
			l.asked -= reqs[i].Cost
			l.sh.mu.Unlock()
		}
	}
}

// exactly answers TakeAll's checks that are not leased: taken, all or
// nothing, when take is set, and otherwise Peeked.
func (s *Store) exactly(ctx context.Context, multi sluice.MultiStore, reqs []sluice.Request, take bool) ([]sluice.Decision, error) {
	if take && len(reqs) > 1 {
		if multi == nil { // leased checks whose grants a failure policy held back
			return nil, ErrNoTakeAll
		}
		return multi.TakeAll(ctx, reqs)
	}
	return s.oneByOne(ctx, reqs, take, false)
}

// oneByOne asks the granter about each of reqs in turn: Take while take
// holds, else Peek; with untilDenied, Peek from the first denial on.
func (s *Store) oneByOne(ctx context.Context, reqs []sluice.Request, take, untilDenied bool) ([]sluice.Decision, error) {
	out := make([]sluice.Decision, len(reqs))
	for i, r := range reqs {
		var err error
		if take {
			out[i], err = s.granter.Take(ctx, r.Key, r.Limit, r.Cost)
		} else {
			out[i], err = s.granter.Peek(ctx, r.Key, r.Limit, r.Cost)
		}
		if err != nil {
			return nil, err
		}
		if untilDenied {
			take = take && out[i].Allowed
		}
	}
	return out, nil
}

// Peek implements sluice.Store: a live lease that holds cost units answers
// without taking; otherwise the store does, counting the units a live
// lease would give back before a Take of cost (under the return rule),
// after a lease that has ended has given back what it holds, as that Take
// would first.
func (s *Store) Peek(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := ctx.Err(); err != nil {
		return sluice.Decision{}, err
	}
	stale, err := s.check(key, limit, cost)
	if err != nil {
		return sluice.Decision{}, err
	}
	if stale == 0 {
		return s.granter.Peek(ctx, key, limit, cost)
	}
	var k int64 // units the live lease would give back before a Take
	for settled := false; ; settled = true {
		d, units, ended, ok := s.peekLease(key, limit, cost)
		if ok {
			return d, nil
		}
		k = units
		if ended == nil || settled {
			break
		}
		// The lease has ended holding units, which the Take after this
		// Peek would give back before asking the store: give them back
		// now, as it would, so that the store's answer counts them. How
		// many it takes back, and for the sliding window counter past the
		// lease's window how much they weigh, only the store knows.
		held, err := s.settle(ctx, ended, key, limit)
		if held {
			if p, ok := s.granter.(policyPeeker); ok {
				// The store did not answer the return: asking it again
				// would cost the Peek a second wait (see errGrantFailed).
				return p.PeekByPolicy(ctx, key, limit, cost, err)
			}
		} else if err != nil {
			return sluice.Decision{}, err
		}
	}
	if k == 0 {
		return s.granter.Peek(ctx, key, limit, cost)
	}
	// A Take of cost would return the lease's units first (refill), of
	// which the store would take back k, or spend k of them with the
	// store's: count them, as that Take would.
	d, err := s.granter.Peek(ctx, key, limit, cost-k)
	if err != nil || d.Allowed || byPolicy([]sluice.Decision{d}) {
		// A policy's denial is the answer: the store did not answer, and
		// asking it for the wait would wait once more.
		d.Remaining += k
		return d, err
	}
	return s.withUnits(ctx, d, key, limit, cost, k)
}

// withUnits is d, the store's denial of cost − k units, as the answer to
// a request of cost with k units of a lease to spend: Take's and Peek's
// alike, so that they agree.
func (s *Store) withUnits(ctx context.Context, d sluice.Decision, key string, limit sluice.Limit, cost, k int64) (sluice.Decision, error) {
	d, err := s.waitFor(ctx, d, key, limit, cost, k)
	d.Remaining += k
	return d, err
}

// waitFor is d, the store's denial of cost − k units, with the wait for
// cost units: an upper bound, since k units may be gone by then.
func (s *Store) waitFor(ctx context.Context, d sluice.Decision, key string, limit sluice.Limit, cost, k int64) (sluice.Decision, error) {
	switch limit.Algorithm {
	case sluice.SlidingWindowCounter:
		if byPolicy([]sluice.Decision{d}) {
			// The store did not answer: asking it for the wait would wait
			// once more. The policy's answer stands.
			break
		}
		// When cost units will be there depends on the previous window's
		// count: the store's wait for all of them is an upper bound.
		full, err := s.granter.Peek(ctx, key, limit, cost)
		if err != nil {
			return sluice.Decision{}, err
		}
		d.RetryAfter = max(d.RetryAfter, full.RetryAfter)
	case sluice.FixedWindow: // the window's end, whatever the cost
	default:
		// One Interval for each of the k units.
		d.RetryAfter += time.Duration(k) * limit.Interval()
	}
	return d, nil
}

// peekLease looks at key's lease under limit for a Peek of cost: ok with
// the decision when it is live and holds cost units; otherwise the units a
// live lease would give back before a Take of cost, under the return rule,
// or spend with the store's, or the lease when it has ended holding units.
func (s *Store) peekLease(key string, limit sluice.Limit, cost int64) (_ sluice.Decision, k int64, ended *lease, ok bool) {
	id := s.knownID(limit)
	if id == 0 {
		return sluice.Decision{}, 0, nil, false
	}
	sh, tag := s.locate(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	now := s.now()
	h := sh.leases.FindKind(tag, id, key)
	if h != nil {
		// As a Take would answer: from a live lease that holds cost units,
		// else from a remembered denial.
		if h.live(now) && int64(h.units) >= cost {
			return h.local(limit, now, true), 0, nil, true
		}
		if d, ok := h.remembered(cost, now); ok {
			return d, 0, nil, true
		}
	}
	switch {
	case h == nil || h.units == 0:
	case !h.live(now):
		ended = h.l
	case stranded(h, limit, cost, now):
		// Spent with the store's (see refill).
		k = int64(h.units)
	default:
		k = sluice.ReturnAllowance(limit, int64(h.units), (now-h.l.sent)/1e3)
	}
	return sluice.Decision{}, k, ended, false
}

// settle gives back the units that l, ended, still holds, as the refill of
// the next request on it would: once, under its refill lock, and never
// again (a return that fails leaves them out of the store, which can only
// lower admissions). A lease refilled meanwhile, or gone from its table
// (Reset drops its units, Close returns them), is left alone. held: a
// failure policy held back or saw fail this return, or a grant or return
// of l's while the Peek waited for its lock; the error is then that
// call's, for the policy's answer to report.
func (s *Store) settle(ctx context.Context, l *lease, key string, limit sluice.Limit) (held bool, _ error) {
	l.sh.mu.Lock()
	failed := l.failed
	l.sh.mu.Unlock()
	if err := l.refill.lockCtx(ctx); err != nil {
		return false, fmt.Errorf("lease: waiting for the key's grant: %w", err)
	}
	defer l.refill.Unlock()
	if err := ctx.Err(); err != nil {
		return false, err // the units stay for a request that can give them back
	}
	sh := l.sh
	sh.mu.Lock()
	h := l.hot()
	live := h.live(s.now())
	if !live && l.failed != failed {
		err, byPolicy := l.failErr, l.byPolicy
		sh.mu.Unlock()
		if !byPolicy {
			return false, fmt.Errorf("lease: the key's grant failed while this request waited for it: %w", err)
		}
		return true, err
	}
	if l.gone != nil || h.units == 0 || live {
		sh.mu.Unlock()
		return false, nil
	}
	old, unused := l.grant, int64(h.units)
	l.setUnits(h, 0)
	sh.mu.Unlock()
	held, err := s.giveBack(ctx, key, limit, old, unused)
	if held || err != nil {
		// As after a refill's return that failed: requests waiting for
		// this key go to the failure policy, or get this error, rather
		// than call again.
		l.fail(ctx, err, held)
	}
	return held, err
}

// holdOut records that a TakeAll's check took got's units out of l, whose
// shard must be locked, until the TakeAll admits or puts them back
// (toppedUp): meanwhile l's refills are the store's Take (see refill's
// pending). A grant would replace the lease, and the units, when another
// check denies, would go back to the store less the return rule's unit
// per Interval of their age: on a fast limit, all of them.
func (l *lease) holdOut(got leftover) {
	if got.units == 0 {
		return
	}
	if l.outGen != got.gen {
		l.out = 0
	}
	l.out, l.outGen = l.out+got.units, got.gen
}

// untake puts back got's units, which fromLease took (a local decision,
// counted in holdOut when held), as if they had not been taken, and
// reports whether it did: only while l still holds their grant.
func (l *lease) untake(got leftover, held bool) bool {
	l.sh.mu.Lock()
	defer l.sh.mu.Unlock()
	if l.gen != got.gen || l.granting || l.gone != nil {
		return false
	}
	l.hot().units += int32(got.units)
	if got.local {
		l.sh.local--
	}
	if held && l.outGen == got.gen {
		l.out -= got.units
	}
	return true
}

// toppedUp records that a top-up's units, left, are spent or put back.
func (l *lease) toppedUp(left leftover) {
	l.sh.mu.Lock()
	if l.outGen == left.gen {
		l.out -= left.units
	}
	l.sh.mu.Unlock()
}

// doneGranting records that l's grant is back, or was never sent.
func (l *lease) doneGranting() {
	l.sh.mu.Lock()
	l.granting = false
	l.sh.mu.Unlock()
}

// fail records that a grant, regrant or return of l's failed with err
// (byPolicy: a failure policy answers it, and reports err as the cause),
// for the requests waiting for l's
// refill lock, which the caller holds. A call that failed for its own context
// says nothing of the store: those waiting call it themselves.
func (l *lease) fail(ctx context.Context, err error, byPolicy bool) {
	if !byPolicy && ctx.Err() != nil {
		return
	}
	l.sh.mu.Lock()
	l.failed++
	l.failErr, l.byPolicy = err, byPolicy
	l.sh.mu.Unlock()
}

// Reset implements sluice.Store: it drops this process's lease (its units
// are not returned) and resets the key in the store. Other processes'
// leases live on for at most MaxStaleness.
//
// The lease is dropped first, whatever ctx: a ctx cancelled or past its
// deadline, before or during the call, still drops it, and Reset returns
// the store's error, ctx's included, when the store's reset may or may not
// have happened. Dropping can only lower admissions (the lease's unused
// units are stranded, not returned), so it is safe whatever became of the
// store's reset; call Reset again to be sure the key was reset.
func (s *Store) Reset(ctx context.Context, key string, limit sluice.Limit) error {
	ctx = ctxutil.OrBackground(ctx)
	if s == nil || s.granter == nil {
		return ErrNoGranter
	}
	if id := s.knownID(limit); id != 0 {
		sh, tag := s.locate(key)
		sh.mu.Lock()
		if h := sh.leases.FindKind(tag, id, key); h != nil {
			s.drop(h.l)
		}
		sh.mu.Unlock()
	}
	return s.granter.Reset(ctx, key, limit)
}

// Len returns the number of keys the Store tracks (a lease, a remembered
// denial, or only the key's demand), idle ones not yet swept included.
func (s *Store) Len() int {
	if s == nil {
		return 0
	}
	return int(s.keys.Load())
}

// closeReturns is how many leases Close gives back at once.
const closeReturns = 16

// Close gives every lease's unused units back to the store, up to
// closeReturns (16) leases at once, and forgets the leases; the Store
// still answers afterwards. Once a return fails (the store unreachable,
// ctx ended, or a failure policy holding returns back), Close sends no
// more: with Redis stopped it returns after about one return's time (the
// client's timeouts, 7 s with go-redis's defaults, unless ctx ends
// sooner), not one per lease; the returns still out then are abandoned
// (one may still reach the store). Units not known given back are spent
// for their windows, as those of a lease that ends unspent: Close then
// returns ErrNotReturned, saying how many units of how many leases,
// wrapping the first failure.
func (s *Store) Close(ctx context.Context) error {
	if s == nil {
		return nil
	}
	ctx, cancel := context.WithCancel(ctxutil.OrBackground(ctx))
	defer cancel()
	s.stopSweep()
	var leases []*lease
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n := len(leases)
		for i := range sh.leases.Slots() {
			if sh.leases.Live(i) {
				h := sh.leases.At(i)
				h.leave()
				leases = append(leases, h.l)
			}
		}
		sh.leases = table.Table[hot]{}
		s.keys.Add(int64(-(len(leases) - n)))
		sh.mu.Unlock()
	}
	var (
		mu          sync.Mutex
		first       error
		units, kept int64
		wg          sync.WaitGroup
		turns       = make(chan struct{}, closeReturns)
		failed      atomic.Bool
	)
	keep := func(unused int64, err error) {
		mu.Lock()
		defer mu.Unlock()
		units += unused
		kept++
		if first == nil {
			first = err
		}
	}
	for _, l := range leases {
		l.refill.Lock()
		l.sh.mu.Lock()
		g, unused := l.grant, int64(l.gone.units)
		l.gone.units = 0
		l.sh.mu.Unlock()
		if unused == 0 {
			l.refill.Unlock()
			continue
		}
		turns <- struct{}{}
		if failed.Load() {
			<-turns
			l.refill.Unlock()
			keep(unused, nil)
			continue
		}
		wg.Go(func() {
			defer func() { <-turns; l.refill.Unlock() }()
			// A return a failure policy held back is no error of a
			// request's (giveBack reports it held), but its units did
			// not go back.
			if _, err := s.giveBack(ctx, l.key, l.limit, g, unused); err != nil {
				if !failed.Swap(true) {
					cancel() // the returns still out wait on the same store
				}
				keep(unused, err)
			}
		})
	}
	wg.Wait()
	if kept == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d units of %d leases: %w", ErrNotReturned, units, kept, first)
}
