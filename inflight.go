package sluice

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"time"
)

// In-flight limits bound how many requests of one key are in progress at
// once, where a Limit bounds how often they start. A holder acquires a slot
// (of a weight: a request that counts as 5 takes 5 of Max), does its work
// and releases the slot. A slot not released within its hold timeout is
// freed anyway, so a crashed holder cannot keep it; a holder whose work
// may outlast the hold extends it.
//
// The guarantee: at no instant do the holders of a key weigh more than
// Max, as long as every holder releases or extends within its hold
// timeout. A holder that overruns its hold has lost its slot, and another
// request may take it while the overrunning one still works: size Hold
// well above the longest request, or extend. It is the store's guarantee:
// while a shared store is unreachable, package resilient's local fallback
// lets each of n processes hold at most max(⌊Max/n⌋, 1) more, and a
// release lost meanwhile frees its slot at its hold timeout, unless sent
// again (RetryRelease).

// Bounds that InFlightLimit.Validate enforces: quantities stay exact in
// Redis Lua's doubles, and one key's holder set stays small enough to scan.
const (
	MaxInFlight  = 1_000_000      // Max upper bound
	MaxHold      = 24 * time.Hour // Hold upper bound; longer work extends
	MaxHolderLen = 64             // bytes of a holder id
)

// Errors of in-flight limits. Bad input is refused before the store is
// touched, so it never changes or frees anything.
var (
	// ErrInvalidWeight: a weight is zero, negative or above the limit's
	// Max (it could never be admitted).
	ErrInvalidWeight = errors.New("sluice: invalid weight")
	// ErrInvalidHolder: a holder id is empty or longer than MaxHolderLen
	// bytes.
	ErrInvalidHolder = errors.New("sluice: invalid holder")
	// ErrSlotLost: Extend found the slot no longer held: released, or
	// expired at its hold timeout (and perhaps taken by someone else).
	ErrSlotLost = errors.New("sluice: slot no longer held")
)

// InFlightLimit is an in-flight policy: at most Max weight held at once
// per key, each slot freed at the latest Hold after it was acquired or last
// extended. Like Limit, it is a value passed with every call. The zero
// value is invalid (Validate refuses it).
type InFlightLimit struct {
	// Max is the most weight held at once, 1..MaxInFlight.
	Max int64
	// Hold is how long a slot stays held without Extend, from 1µs to
	// MaxHold, counted in whole microseconds (the rest is dropped).
	Hold time.Duration
}

// Concurrent returns an InFlightLimit of max slots each held at most hold.
func Concurrent(max int64, hold time.Duration) InFlightLimit {
	return InFlightLimit{Max: max, Hold: hold}
}

func (l InFlightLimit) String() string {
	return fmt.Sprintf("%d in flight (hold %v)", l.Max, l.Hold)
}

// Validate reports whether l is usable: a wrapped ErrInvalidLimit if not.
func (l InFlightLimit) Validate() error {
	if l.Max <= 0 || l.Max > MaxInFlight {
		return fmt.Errorf("%w: in-flight max %d outside 1..%d", ErrInvalidLimit, l.Max, MaxInFlight)
	}
	if l.Hold < time.Microsecond || l.Hold > MaxHold {
		return fmt.Errorf("%w: hold %v outside 1µs..%v", ErrInvalidLimit, l.Hold, MaxHold)
	}
	return nil
}

// ValidateSlot checks everything a Slots store checks before it touches its
// backend on Acquire: the key, the limit, the weight and the holder.
func ValidateSlot(key string, l InFlightLimit, weight int64, holder string) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := l.Validate(); err != nil {
		return err
	}
	if weight <= 0 || weight > l.Max {
		return fmt.Errorf("%w: weight %d outside 1..%d", ErrInvalidWeight, weight, l.Max)
	}
	return ValidateHolder(holder)
}

// ValidateHolder rejects empty holder ids and ids longer than MaxHolderLen.
func ValidateHolder(holder string) error {
	if holder == "" || len(holder) > MaxHolderLen {
		return fmt.Errorf("%w: holder of %d bytes outside 1..%d", ErrInvalidHolder, len(holder), MaxHolderLen)
	}
	return nil
}

// NewHolderID returns a random 128-bit holder id (32 hex digits): ids
// nobody can guess, so nobody can release another's slot.
func NewHolderID() string {
	var b [16]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// SlotDecision is the outcome of an Acquire. The examples use
// Concurrent(10, 30s) with 8 held and an acquire of weight 3 at t=0, the
// oldest holders (weight 1 each) acquired at t=-20s and t=-10s.
type SlotDecision struct {
	// Allowed reports whether the slot was acquired. Example: false.
	Allowed bool
	// Limit is the policy the decision was made under.
	Limit InFlightLimit
	// InUse is the weight held after the decision, this holder's included
	// when Allowed. Example: 8.
	InUse int64
	// Remaining is Max − InUse, never below zero. Example: 2.
	Remaining int64
	// RetryAfter is zero when Allowed, and when a release of this holder
	// came first (the store's tombstone refused it). Otherwise it is an
	// ESTIMATE: the wait
	// until enough held weight reaches its hold timeout for this request
	// to fit, were no holder to release or extend. Holders usually release
	// sooner (a slot may free at any instant) and may extend, so it is
	// neither a lower nor an upper bound; it is what a Retry-After header
	// can honestly say. Example: 10s (the t=-20s holder's hold ends at
	// t=10s, freeing the one unit needed).
	RetryAfter time.Duration
	// Expired is the weight of the holders this call found past their hold
	// timeout and removed: slots that crashed or overran holders never
	// released, for a metric of expired holds. An Acquire is the only call
	// that removes them (Extend and Release take an expired holder for gone
	// and leave it), so each expired hold is counted once, by the next
	// Acquire on its key; a hold on a key nobody acquires again is dropped
	// uncounted (with the Redis key's expiry, or the memory store's sweep).
	// Example: 0.
	Expired int64
	// Source: as Decision.Source.
	Source Source
	// ReleaseDropped is set by AcquireSlot alone, on an error or a failure
	// policy's denial, whose holder the store may hold all the same: its
	// release (ReleaseAbandoned) was not sent, MaxBackgroundReleases being
	// at work already (ErrRetriesFull), so a slot held stays held to its
	// hold timeout. Count and log it as a release not sent again
	// (SlotEvent.NotRetried). Example: false.
	ReleaseDropped bool
}

// Slots is implemented by stores that keep in-flight slots: the memory
// store (one process) and the Redis store (a fleet). Contract as Store's:
// keys opaque, bad input a wrapped sentinel error that changes nothing,
// errors backend failures only, safe for concurrent use. A key's slots are
// independent of its rate-limit state.
//
// A holder is identified by an id the caller generates (NewHolderID), so
// a resent Acquire of the same holder is harmless: it refreshes the hold
// and counts once. Most callers want AcquireSlot, which generates it and
// returns a Slot handle.
type Slots interface {
	// Acquire adds holder with weight to key's holders if the weight fits
	// under limit.Max, holding until now+limit.Hold. If holder already
	// holds, its hold is refreshed and it counts once, with its first
	// weight.
	Acquire(ctx context.Context, key string, limit InFlightLimit, weight int64, holder string) (SlotDecision, error)
	// Extend moves holder's hold timeout to now+limit.Hold. It reports
	// false, changing nothing, if holder does not hold (released, expired,
	// or never acquired).
	Extend(ctx context.Context, key string, limit InFlightLimit, holder string) (bool, error)
	// Release frees holder's slot. It reports false, freeing nothing, if
	// holder does not hold: an unknown or forged id never frees another's
	// slot. The memory and Redis stores then leave a tombstone of holder,
	// which refuses its next acquire (an acquire that reaches the store
	// after its abandoned release holds nothing): see docs/inflight.md.
	Release(ctx context.Context, key string, holder string) (bool, error)
}

// Slot is a held slot: a handle from AcquireSlot. Release it when the work
// is done; Release and Extend are safe from any goroutine. The zero value,
// and a nil *Slot (AcquireSlot's with a denial or an error), hold nothing:
// Release does nothing, Extend is ErrSlotLost.
type Slot struct {
	store    Slots
	key      string
	limit    InFlightLimit
	weight   int64
	holder   string
	released atomic.Bool
}

// AcquireSlot acquires a slot of weight for key under limit with a fresh
// holder id. It returns a nil Slot when the decision denies. A nil store
// is an error matching both ErrStoreNotBuilt and ErrInvalidLimit, as for
// NewLimiter.
func AcquireSlot(ctx context.Context, store Slots, key string, limit InFlightLimit, weight int64) (*Slot, SlotDecision, error) {
	if store == nil {
		return nil, SlotDecision{}, errNilStore
	}
	holder := NewHolderID()
	d, err := store.Acquire(ctx, key, limit, weight, holder)
	if err != nil || !d.Allowed {
		// The store may hold the holder all the same: an error after the
		// acquire ran, or a failure policy's denial after the backend's.
		if (err != nil && ValidateSlot(key, limit, weight, holder) == nil) || d.Source == SourceFallback || d.Source == SourceFailClosed {
			d.ReleaseDropped = TryReleaseAbandoned(store, key, holder) != nil
		}
		return nil, d, err
	}
	return &Slot{store: store, key: key, limit: limit, weight: weight, holder: holder}, d, nil
}

// abandoner is a store in front of another (a failure policy's), which
// sends an abandoned holder's release where its acquire may have run,
// past its own breaker and timeout: ReleaseAbandoned hands it the holder.
// A tryAbandoner also reports a release it could not start; an abandoner
// alone is taken to have started it.
type abandoner interface {
	AbandonSlot(key, holder string)
}

type tryAbandoner interface {
	TryAbandonSlot(key, holder string) error
}

// releasing bounds the background releases (ReleaseAbandoned's and
// RetryRelease's) at work at once. They are cheap (a goroutine, mostly
// asleep), and an outage under load makes many: one dropped keeps its
// slot, if held, until its hold timeout.
var releasing = make(chan struct{}, MaxBackgroundReleases)

// MaxBackgroundReleases is how many releases ReleaseAbandoned and
// RetryRelease have at work at once, at most, together.
const MaxBackgroundReleases = 1024

// releaseTry bounds one background release.
const releaseTry = 5 * time.Second

// ReleaseAbandoned frees holder's slot, if it holds one, after an Acquire
// of it returned an error and the holder is given up (never resent): the
// store may have run the acquire all the same (a timeout after the command
// was sent), and then nobody would release it before its hold timeout. It
// returns at once and releases in the background, with a timeout of its
// own, and once more a second later if nothing was held yet (the acquire
// may reach the store after the first release; an abandoned id is never
// reused, so a second release cannot free a later holder). A release that
// finds nothing leaves a tombstone in the memory and Redis stores, so that
// the acquire, reaching the store only after it, is refused. At most
// MaxBackgroundReleases run at once, with RetryRelease's; beyond that, and
// if both releases fail, the slot frees at its hold timeout. A closed
// store (ErrStoreClosed) is not sent the second. A process that stops
// drops the releases still at work: see WaitReleases. It does not say
// when it drops one: TryReleaseAbandoned does.
func ReleaseAbandoned(store Slots, key, holder string) {
	_ = TryReleaseAbandoned(store, key, holder)
}

// TryReleaseAbandoned is ReleaseAbandoned that reports a release it could
// not start: ErrRetriesFull when MaxBackgroundReleases are at work
// already, so that the caller counts and logs it as a release not sent
// again (AcquireSlot reports it as SlotDecision.ReleaseDropped). A store
// in front of another (resilient's) is handed the holder by its
// TryAbandonSlot, or AbandonSlot, which reports nothing. A nil store is
// an error matching both ErrStoreNotBuilt and ErrInvalidLimit.
func TryReleaseAbandoned(store Slots, key, holder string) error {
	if store == nil {
		return errNilStore
	}
	if a, ok := store.(tryAbandoner); ok {
		return a.TryAbandonSlot(key, holder)
	}
	if a, ok := store.(abandoner); ok {
		a.AbandonSlot(key, holder)
		return nil
	}
	// Never woken by WaitReleases: the second release is for an acquire
	// that may still be on its way.
	if !releaseLater(releasing, store, key, holder, 0, time.Time{}, false, func(try int, _ time.Duration, held bool, err error) (time.Duration, bool) {
		return time.Second, try == 0 && !held && !hopeless(err)
	}, nil) {
		return ErrRetriesFull
	}
	return nil
}

// hopeless reports whether err says no release to the store can ever
// succeed: never built, or closed.
func hopeless(err error) bool {
	return errors.Is(err, ErrStoreNotBuilt) || errors.Is(err, ErrStoreClosed)
}

// Backoff of RetryRelease: the first retry after retryFirst, each wait
// then doubled up to retryMax.
const (
	retryFirst = 100 * time.Millisecond
	retryMax   = 3 * time.Second
)

// retryJitter: each wait of RetryRelease is shortened by up to
// 1/retryJitter of it at random. Releases that failed together (an
// outage) would otherwise be tried again together, forever: behind a
// half-open circuit breaker (package resilient's) one was let through and
// the others refused, to wait a whole backoff more, so that they drained
// one per 3 s. And a retry waiting ends when a release to its store is
// answered (the store is back), tried within retryFirst at random.
const retryJitter = 2

// ErrRetriesFull: MaxBackgroundReleases releases are already at work in
// the background; the slot frees at its hold timeout.
var ErrRetriesFull = errors.New("sluice: too many releases being retried")

// RetryRelease frees holder's slot in the background after a Release of
// it failed (the store unreachable or stalled, a breaker open, a timeout
// leaving the outcome unknown), so that the slot does not stay held, and
// refuse others, until its hold timeout. until is when the store frees it
// anyway: the hold's end, as last acquired or extended. It returns at
// once, and tries 100ms later, then at waits doubling up to 3s, each
// shortened by up to half at random (releases that failed together are
// not tried together) and ended early, within 100ms at random, when the
// store answers another release (it is back), each try bounded by 5s,
// until the store answers (held or not: a release whose
// answer came is never sent again), fails with ErrStoreNotBuilt or
// ErrStoreClosed (no try ever will succeed), or until has passed. Sending
// a release again is safe because a holder id is never reused
// (NewHolderID): one that ran already frees nothing more. WaitReleases
// wakes a retry waiting between tries: it tries at once, then keeps its
// backoff.
// done, if not nil, is called once with the store's answer (whether holder
// held its slot then), on the background goroutine; it is not called when
// no answer came. Bad input is refused (ErrInvalidKey, ErrInvalidHolder;
// for a nil store an error matching both ErrStoreNotBuilt and
// ErrInvalidLimit), and at most MaxBackgroundReleases run
// at once, with ReleaseAbandoned's: beyond that, ErrRetriesFull. An until
// already past sends nothing (nil). A process that stops drops the
// releases still at work: see WaitReleases.
func RetryRelease(store Slots, key, holder string, until time.Time, done func(held bool)) error {
	if store == nil {
		return errNilStore
	}
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := ValidateHolder(holder); err != nil {
		return err
	}
	if !time.Now().Before(until) {
		return nil
	}
	if !releaseLater(releasing, store, key, holder, retryFirst, until, true, func(_ int, wait time.Duration, _ bool, err error) (time.Duration, bool) {
		wait = min(2*wait, retryMax)
		return wait, err != nil && !hopeless(err) && time.Now().Add(wait).Before(until)
	}, done) {
		return ErrRetriesFull
	}
	return nil
}

// releaseLater sends holder's release in the background, after first and
// then after each wait again says (given the try's number, the wait
// before it and its answer), until again says no more; each try is
// bounded by releaseTry and until (if not zero). done gets the answer of
// the last try, if it came. With wakeable, the first WaitReleases that
// finds it waiting between tries ends that wait (once: a store still
// down is not tried in a loop by a caller polling WaitReleases). At most
// cap(slots) run at once: false if there is no room.
func releaseLater(slots chan struct{}, store Slots, key, holder string, first time.Duration, until time.Time, wakeable bool,
	again func(try int, wait time.Duration, held bool, err error) (time.Duration, bool), done func(held bool)) bool {
	select {
	case slots <- struct{}{}:
	default:
		return false
	}
	background.add()
	go func() {
		defer func() { <-slots; background.done() }()
		// A retry's waits are jittered, and end when a release to the
		// same store is answered (see retryJitter).
		retry := wakeable
		wait := first
		for try := 0; ; try++ {
			if wait > 0 {
				var woken, answered <-chan struct{}
				if wakeable {
					woken = background.wakes()
				}
				leave := func() {}
				sleep := wait
				if retry {
					answered, leave = background.answers(store)
					sleep -= mrand.N(wait/retryJitter + 1)
				}
				t := time.NewTimer(sleep)
				select {
				case <-t.C:
				case <-woken:
					t.Stop()
					wakeable = false
				case <-answered:
					t.Stop()
					time.Sleep(mrand.N(retryFirst)) // not all at once
				}
				leave()
			}
			deadline := time.Now().Add(releaseTry)
			if !until.IsZero() && until.Before(deadline) {
				deadline = until
			}
			ctx, cancel := context.WithDeadline(context.Background(), deadline)
			held, err := store.Release(ctx, key, holder)
			cancel()
			if err == nil {
				background.answer(store)
			}
			var more bool
			if wait, more = again(try, wait, held, err); !more {
				if err == nil && done != nil {
					done(held)
				}
				return
			}
		}
	}()
	return true
}

// background counts the releases at work in the background, for
// WaitReleases: a process that stops drops them, and their slots stay held
// to their hold timeout.
var background pendingReleases

type pendingReleases struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed when n drops to 0; nil while 0
	wake chan struct{} // closed by WaitReleases; nil until asked for
	// back holds, for each store with retries waiting, the channel
	// closed when a release to it is answered.
	back map[Slots]*storeBack
}

// storeBack is what the retries of one store wait on: ch, closed when the
// store answers a release, and how many wait.
type storeBack struct {
	ch      chan struct{}
	waiting int
}

// answers returns the channel closed when a release to store is next
// answered, and the function to call once done waiting on it. Only stores
// that are pointers are told apart (any other could panic as a map key):
// for others the channel is nil.
func (p *pendingReleases) answers(store Slots) (<-chan struct{}, func()) {
	if reflect.TypeOf(store).Kind() != reflect.Pointer {
		return nil, func() {}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.back == nil {
		p.back = make(map[Slots]*storeBack)
	}
	b := p.back[store]
	if b == nil {
		b = &storeBack{ch: make(chan struct{})}
		p.back[store] = b
	}
	b.waiting++
	return b.ch, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if b.waiting--; b.waiting == 0 && p.back[store] == b {
			delete(p.back, store)
		}
	}
}

// answer wakes the retries waiting on store: it answered a release.
func (p *pendingReleases) answer(store Slots) {
	if reflect.TypeOf(store).Kind() != reflect.Pointer {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if b := p.back[store]; b != nil {
		close(b.ch)
		delete(p.back, store)
	}
}

// wakes returns the channel the next WaitReleases closes.
func (p *pendingReleases) wakes() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wake == nil {
		p.wake = make(chan struct{})
	}
	return p.wake
}

// wakeAll wakes the retries waiting between tries.
func (p *pendingReleases) wakeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.wake != nil {
		close(p.wake)
		p.wake = nil
	}
}

func (p *pendingReleases) add() {
	p.mu.Lock()
	if p.n == 0 {
		p.idle = make(chan struct{})
	}
	p.n++
	p.mu.Unlock()
}

func (p *pendingReleases) done() {
	p.mu.Lock()
	if p.n--; p.n == 0 {
		close(p.idle)
		p.idle = nil
	}
	p.mu.Unlock()
}

func (p *pendingReleases) state() (int, chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n, p.idle
}

// PendingReleases returns how many releases RetryRelease and
// ReleaseAbandoned have at work in the background now.
func PendingReleases() int {
	n, _ := background.state()
	return n
}

// WaitReleases waits until no release is at work in the background
// (RetryRelease's, ReleaseAbandoned's), or until ctx ends, and returns how
// many still were: releases a process that stops now drops, whose slots
// stay held until their hold timeout. Call it at shutdown, after the
// server's own Shutdown (no request may start another) and before the
// store is closed, with the time left to stop: each release ends once the
// store answers it or its hold has passed, so with the store still
// unreachable the wait lasts until ctx ends. Releases started meanwhile
// are waited for too. An ended ctx returns the count at once. The retries
// of RetryRelease waiting between tries try at once, so that a store back
// already does not hold a stop for up to a backoff (3s) more; each then
// keeps its backoff while the wait lasts.
func WaitReleases(ctx context.Context) int {
	background.wakeAll()
	for {
		n, idle := background.state()
		if n == 0 || ctx.Err() != nil {
			return n
		}
		select {
		case <-idle:
		case <-ctx.Done():
		}
	}
}

// Key, Limit, Weight and Holder report what s was acquired with (zero
// values for a nil Slot, which AcquireSlot returns with a denial).
func (s *Slot) Key() string {
	if s == nil {
		return ""
	}
	return s.key
}

func (s *Slot) Limit() InFlightLimit {
	if s == nil {
		return InFlightLimit{}
	}
	return s.limit
}

func (s *Slot) Weight() int64 {
	if s == nil {
		return 0
	}
	return s.weight
}

func (s *Slot) Holder() string {
	if s == nil {
		return ""
	}
	return s.holder
}

// Release frees the slot. The first call that succeeds releases it; later
// calls (and calls racing with it) do nothing and return nil. A failed
// call may be retried. Releasing a slot already freed at its hold timeout
// is not an error. A nil Slot (a denial's) has nothing to release: nil,
// so `defer slot.Release(ctx)` may come before the check of the denial.
func (s *Slot) Release(ctx context.Context) error {
	if s == nil || s.store == nil || !s.released.CompareAndSwap(false, true) {
		return nil
	}
	if _, err := s.store.Release(ctx, s.key, s.holder); err != nil {
		s.released.Store(false)
		return err
	}
	return nil
}

// Extend moves the slot's hold timeout to now + its limit's Hold. It
// returns ErrSlotLost if the slot was released or its hold had already
// run out.
func (s *Slot) Extend(ctx context.Context) error {
	if s == nil || s.store == nil || s.released.Load() {
		return ErrSlotLost
	}
	ok, err := s.store.Extend(ctx, s.key, s.limit, s.holder)
	if err != nil {
		return err
	}
	if !ok {
		return ErrSlotLost
	}
	return nil
}
