package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ctxutil"
)

var _ sluice.Slots = (*Store)(nil)

// The in-flight scripts, each now.lua and its body. A key's holders are one
// ZSET (see inflight_acquire.lua for its layout): one key to read, write
// and expire, so that acquire and release each cost about one take.
var (
	acquireScript = newTakeScript(mustRead("now.lua") + mustRead("inflight_acquire.lua"))
	extendScript  = newTakeScript(mustRead("now.lua") + mustRead("inflight_extend.lua"))
	releaseScript = newScript(mustRead("now.lua") + mustRead("inflight_release.lua"))
	// releaseOnceScript calls the release as a function of its own KEYS
	// and ARGV, so that the release is written once.
	releaseOnceScript = newScript(mustRead("now.lua") + "local function release(KEYS, ARGV)\n" +
		mustRead("inflight_release.lua") + "\nend\n" + mustRead("inflight_release_once.lua"))
)

// slotKey returns the Redis key of key's in-flight holders, apart from
// every algorithm's key.
func (s *Store) slotKey(key string) string {
	return s.keyOf(key, "if2")
}

// SlotKeys returns the Redis keys that hold key's in-flight slots (one),
// for inspecting TTLs or checking what was written. It does not validate.
func (s *Store) SlotKeys(key string) []string {
	if s == nil {
		s = &Store{}
	}
	return []string{s.slotKey(key)}
}

// Acquire implements sluice.Slots, in one script run (inflight_acquire.lua).
// Like a take it is never sent twice by the client; a caller that resends
// it after an error, with the same holder id, counts once.
func (s *Store) Acquire(ctx context.Context, key string, l sluice.InFlightLimit, weight int64, holder string) (sluice.SlotDecision, error) {
	if err := sluice.ValidateSlot(key, l, weight, holder); err != nil {
		return sluice.SlotDecision{}, err
	}
	a := slotArgsOf(l)
	c, err := s.slotCall(acquireScript, key)
	if err != nil {
		return sluice.SlotDecision{}, fmt.Errorf("redisstore: in-flight acquire: %w", err)
	}
	s.tombLife.Cover(l.Hold)
	defer c.recycle()
	c.argv[5], c.argv[6], c.argv[7], c.argv[8] = a.max, a.hold, weight, holder
	sent := s.young.clock()
	v, err := s.runSlot(ctx, c, 9, 5)
	if err != nil || v[0] != 0 && v[0] != 1 {
		s.young.forget(key, holder) // it may have run, with another hold
		return sluice.SlotDecision{}, slotErr("acquire", v, err)
	}
	switch {
	case v[0] != 1:
	case v[4] == 0: // held before: its deadline refreshed, as by an extend
		s.young.extended(key, holder, sent, l.Hold, true)
	case weight == 1 && s.wait == nil:
		s.young.add(key, holder, sent, l.Hold)
	default:
		s.young.forget(key, holder)
	}
	return sluice.SlotDecision{
		Allowed:    v[0] == 1,
		Limit:      l,
		InUse:      v[1],
		Remaining:  max(l.Max-v[1], 0),
		RetryAfter: time.Duration(max(v[2], 0)) * time.Microsecond,
		Expired:    v[3],
	}, nil
}

// Extend implements sluice.Slots, in one script run (inflight_extend.lua).
func (s *Store) Extend(ctx context.Context, key string, l sluice.InFlightLimit, holder string) (bool, error) {
	if err := sluice.ValidateSlot(key, l, 1, holder); err != nil {
		return false, err
	}
	c, err := s.slotCall(extendScript, key)
	if err != nil {
		return false, fmt.Errorf("redisstore: in-flight extend: %w", err)
	}
	defer c.recycle()
	s.tombLife.Cover(l.Hold)
	c.argv[5], c.argv[6] = slotArgsOf(l).hold, holder
	sent := s.young.clock()
	ok, err := s.held(ctx, "extend", c, 7)
	if err != nil {
		s.young.forget(key, holder) // it may have run, with another hold
		return ok, err
	}
	s.young.extended(key, holder, sent, l.Hold, ok)
	return ok, nil
}

// Release implements sluice.Slots, in one script run (inflight_release.lua).
func (s *Store) Release(ctx context.Context, key string, holder string) (bool, error) {
	if err := sluice.ValidateKey(key); err != nil {
		return false, err
	}
	if err := sluice.ValidateHolder(holder); err != nil {
		return false, err
	}
	if s == nil {
		return false, fmt.Errorf("redisstore: in-flight release: %w", ErrNoClient) // as a zero Store's
	}
	if s.young.take(key, holder) {
		// One ZREM frees it; a reply of 0 means the id no longer holds
		// as this Store's weight-1 holder (released elsewhere, perhaps
		// acquired again with another weight): the script then answers,
		// as for any holder.
		if ok, err := s.releaseYoung(ctx, key, holder); ok || err != nil {
			return ok, err
		}
	}
	c, err := s.slotCall(releaseScript, key)
	if err != nil {
		return false, fmt.Errorf("redisstore: in-flight release: %w", err)
	}
	defer c.recycle()
	c.argv[5], c.argv[6] = holder, s.tombLife.Arg()
	return s.held(ctx, "release", c, 7)
}

// ReleaseOnce is Release that also remembers, for remember, a release
// that freed holder's slot, in the same script run
// (inflight_release_once.lua): sent again within remember, after an error
// that left its outcome unknown, it reports the slot free (released,
// before) rather than not held. released is false when holder held no
// slot and no release of it is remembered. A release remembered is
// remembered again for remember from now. It never takes the one-ZREM
// path of a young holder: the record must be written with the release.
func (s *Store) ReleaseOnce(ctx context.Context, key, holder string, remember time.Duration) (released, before bool, err error) {
	if err := sluice.ValidateSlot(key, sluice.Concurrent(1, remember), 1, holder); err != nil {
		return false, false, err
	}
	if s == nil {
		return false, false, fmt.Errorf("redisstore: in-flight release: %w", ErrNoClient) // as a zero Store's
	}
	s.young.forget(key, holder)
	c, err := s.slotCall(releaseOnceScript, key)
	if err != nil {
		return false, false, fmt.Errorf("redisstore: in-flight release: %w", err)
	}
	defer c.recycle()
	// Two keys: the released holders' go between the ZSET and now.
	c.argv[2], c.argv[4], c.argv[5] = "2", s.releasedKey(key), c.argv[4]
	c.argv[6], c.argv[7], c.argv[8] = holder, s.tombLife.Arg(), remember.Microseconds()
	v, err := s.runSlot(ctx, c, 9, 1)
	if err != nil || v[0] < 0 || v[0] > 2 {
		return false, false, slotErr("release", v, err)
	}
	return v[0] != 0, v[0] == 2, nil
}

// releasedKey returns the Redis key of the releases of key's holders that
// ReleaseOnce remembers: in the hash slot of key's holders, so that one
// script writes both.
func (s *Store) releasedKey(key string) string {
	return s.keyOf(key, "if2r")
}

// releaseYoung releases a holder of weight 1 that young knew to hold: its
// member is all it has in the key (inflight_acquire.lua), so one ZREM
// frees it, without a script, and its reply says whether it was there.
func (s *Store) releaseYoung(ctx context.Context, key, holder string) (bool, error) {
	ctx = ctxutil.OrBackground(ctx)
	if s.closed.Load() {
		return false, fmt.Errorf("redisstore: in-flight release: %w", replyErr(redis.ErrClosed))
	}
	c := calls.Get().(*call)
	defer c.recycle()
	slot := s.slotKey(key)
	if err := s.reload.awaitMap(ctx); err != nil {
		return false, fmt.Errorf("redisstore: in-flight release: %w", s.failed(slot, err))
	}
	cmd := plainCmd{intCmd{keyed(redis.NewIntCmd(ctx, "zrem", slot, "h"+holder)), s}}
	cmd.SetFirstKeyPos(1)
	err := c.await(ctx, s.shut, func() {
		sctx, cancel := sendContext(ctx, budgetOf(ctx), s.answeredRTT())
		_ = s.client.Process(sctx, cmd)
		cancel()
	})
	if err == nil {
		err = atEnd(ctx, cmd.Err())
	}
	if err == nil {
		err = ended(ctx) // see Store.run
	}
	if err != nil {
		return false, fmt.Errorf("redisstore: in-flight release: %w", s.failed(slot, err))
	}
	s.reload.succeeded(slot)
	return cmd.Val() == 1, nil
}

// plainCmd is a command go-redis must never send twice, as scriptCmd: a
// resent ZREM would report a slot it freed as not held.
type plainCmd struct{ intCmd }

// NoRetry implements redis.Cmder.
func (plainCmd) NoRetry() bool { return true }

// youngShare: a holder is young, and released by one ZREM, until this
// share of its hold has passed since its acquire (or last extend) was sent;
// the rest of the hold covers the release's own way to Redis.
const youngShare = 2

// youngHolders remembers the holders of weight 1 a Store's acquires added,
// with when each acquire or extend was sent, on the Store's clock: the
// hold cannot end before that time plus the hold, so until half of it has
// passed the holder surely holds unless released (or another process
// extended it with a shorter hold), and its release needs no script to
// check the deadline (BENCHMARKS.md, "In-flight slots"). A call that
// failed forgets its holder: it may have run with another hold. At most
// youngMax holders are remembered (holders never released would fill
// it): the rest go by script. Holders
// no longer young are swept when the map fills, at most once a second
// when it stays full.
type youngHolders struct {
	now   func() time.Time
	mu    sync.Mutex
	m     map[youngKey]youngHold
	sweep int       // len(m) at which to sweep
	next  time.Time // when full: the earliest next sweep
}

// youngMax bounds the holders a Store remembers as young (about 100 bytes
// each).
const youngMax = 1 << 16

type youngKey struct{ key, holder string }

type youngHold struct {
	sent time.Time
	hold time.Duration
}

// clock reads the Store's clock (the monotonic one when it has none).
func (y *youngHolders) clock() time.Time {
	if y.now != nil {
		return y.now()
	}
	return time.Now()
}

func (h youngHold) young(now time.Time) bool {
	return now.Sub(h.sent) < h.hold/youngShare
}

func (y *youngHolders) add(key, holder string, sent time.Time, hold time.Duration) {
	y.mu.Lock()
	defer y.mu.Unlock()
	if y.m == nil {
		y.m = make(map[youngKey]youngHold)
	}
	if len(y.m) >= y.sweep {
		now := y.clock()
		if len(y.m) < youngMax || !now.Before(y.next) {
			for k, h := range y.m {
				if !h.young(now) {
					delete(y.m, k)
				}
			}
			y.sweep = min(max(1024, 2*len(y.m)), youngMax)
			y.next = now.Add(time.Second)
		}
		if len(y.m) >= youngMax {
			return
		}
	}
	y.m[youngKey{key, holder}] = youngHold{sent, hold}
}

// forget drops holder, young or not.
func (y *youngHolders) forget(key, holder string) {
	y.mu.Lock()
	defer y.mu.Unlock()
	delete(y.m, youngKey{key, holder})
}

// extended notes an extend for hold sent at sent: a young holder that
// held is young again, from sent. One no longer young is forgotten: its
// hold may have ended and the id been acquired again with another weight.
func (y *youngHolders) extended(key, holder string, sent time.Time, hold time.Duration, held bool) {
	y.mu.Lock()
	defer y.mu.Unlock()
	k := youngKey{key, holder}
	if h, ok := y.m[k]; ok {
		if held && h.young(sent) {
			y.m[k] = youngHold{sent, hold}
		} else {
			delete(y.m, k)
		}
	}
}

// take forgets holder and reports whether it was young.
func (y *youngHolders) take(key, holder string) bool {
	y.mu.Lock()
	defer y.mu.Unlock()
	k := youngKey{key, holder}
	h, ok := y.m[k]
	if ok {
		delete(y.m, k)
	}
	return ok && h.young(y.clock())
}

// held runs extend or release, whose reply is {1} when the holder held.
func (s *Store) held(ctx context.Context, name string, c *call, n int) (bool, error) {
	v, err := s.runSlot(ctx, c, n, 1)
	if err != nil || v[0] != 0 && v[0] != 1 {
		return false, slotErr(name, v, err)
	}
	return v[0] == 1, nil
}

// slotCall returns a pooled call of sc on key's ZSET with ARGV[1] now; the
// caller sets the rest of ARGV from c.argv[5] and recycles c. Building the
// call in place, without closures or variadic arguments, keeps a pair to
// the allocations of two takes.
func (s *Store) slotCall(sc *script, key string) (*call, error) {
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	c := calls.Get().(*call)
	c.script, c.alg = sc, -1
	c.argv[0], c.argv[1], c.argv[2], c.argv[3], c.argv[4] = "evalsha", sc.sha, "1", s.slotKey(key), now
	return c, nil
}

// runSlot sends c with its first n arguments and checks that the reply has
// want values. Like every script call it is marked NoRetry (see scriptCmd).
func (s *Store) runSlot(ctx context.Context, c *call, n, want int) ([]int64, error) {
	c.args = c.argv[:n]
	v, err := s.run(ctx, c)
	if err == nil && len(v) != want {
		err = fmt.Errorf("%w: %v", ErrUnexpectedReply, v)
	}
	return v, err
}

// slotErr is the error of an in-flight script run: err, or an unexpected
// reply v.
func slotErr(name string, v []int64, err error) error {
	if err == nil {
		err = fmt.Errorf("%w: %v", ErrUnexpectedReply, v)
	}
	return fmt.Errorf("redisstore: in-flight %s: %w", name, err)
}

// slotArgs are an InFlightLimit's max and hold, formatted and boxed.
type slotArgs struct {
	l         sluice.InFlightLimit
	max, hold any
}

// lastSlotArgs keeps the last limit's arguments: a process mostly uses one
// in-flight limit, or a few, so one entry saves most formatting.
var lastSlotArgs atomic.Pointer[slotArgs]

func slotArgsOf(l sluice.InFlightLimit) *slotArgs {
	if a := lastSlotArgs.Load(); a != nil && a.l == l {
		return a
	}
	a := &slotArgs{l, strconv.FormatInt(l.Max, 10), strconv.FormatInt(l.Hold.Microseconds(), 10)}
	lastSlotArgs.Store(a)
	return a
}
