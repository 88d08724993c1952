package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
)

var _ sluice.Slots = (*Store)(nil)

// The in-flight scripts, each now.lua and its body. A key's holders are one
// ZSET (see inflight_acquire.lua for its layout): one key to read, write
// and expire, so that acquire and release each cost about one take.
var (
	acquireScript = newScript(mustRead("now.lua") + mustRead("inflight_acquire.lua"))
	extendScript  = newScript(mustRead("now.lua") + mustRead("inflight_extend.lua"))
	releaseScript = newScript(mustRead("now.lua") + mustRead("inflight_release.lua"))
)

// slotKey returns the Redis key of key's in-flight holders, apart from
// every algorithm's key.
func (s *Store) slotKey(key string) string {
	return s.prefix + "{" + key + "}:if"
}

// SlotKeys returns the Redis keys that hold key's in-flight slots (one),
// for inspecting TTLs or checking what was written. It does not validate.
func (s *Store) SlotKeys(key string) []string {
	return []string{s.slotKey(key)}
}

// Acquire implements sluice.Slots, in one script run (inflight_acquire.lua).
// Like a take it is never sent twice by the client; a caller that resends
// it after an error, with the same holder id, counts once.
func (s *Store) Acquire(ctx context.Context, key string, l sluice.InFlightLimit, weight int64, holder string) (sluice.SlotDecision, error) {
	if err := sluice.ValidateSlot(key, l, weight, holder); err != nil {
		return sluice.SlotDecision{}, err
	}
	var d sluice.SlotDecision
	err := s.runSlot(ctx, "acquire", acquireScript, key, func(v []int64) error {
		if len(v) != 4 || v[0] != 0 && v[0] != 1 {
			return fmt.Errorf("%w: %v", ErrUnexpectedReply, v)
		}
		d = sluice.SlotDecision{
			Allowed:    v[0] == 1,
			Limit:      l,
			InUse:      v[1],
			Remaining:  max(l.Max-v[1], 0),
			RetryAfter: time.Duration(max(v[2], 0)) * time.Microsecond,
			Expired:    v[3],
		}
		return nil
	}, strconv.FormatInt(l.Max, 10), strconv.FormatInt(l.Hold.Microseconds(), 10), weight, holder)
	return d, err
}

// Extend implements sluice.Slots, in one script run (inflight_extend.lua).
func (s *Store) Extend(ctx context.Context, key string, l sluice.InFlightLimit, holder string) (bool, error) {
	if err := sluice.ValidateSlot(key, l, 1, holder); err != nil {
		return false, err
	}
	return s.holderScript(ctx, "extend", extendScript, key, strconv.FormatInt(l.Hold.Microseconds(), 10), holder)
}

// Release implements sluice.Slots, in one script run (inflight_release.lua).
func (s *Store) Release(ctx context.Context, key string, holder string) (bool, error) {
	if err := sluice.ValidateKey(key); err != nil {
		return false, err
	}
	if err := sluice.ValidateHolder(holder); err != nil {
		return false, err
	}
	return s.holderScript(ctx, "release", releaseScript, key, holder)
}

// holderScript runs extend or release, whose reply is {1} when holder held.
func (s *Store) holderScript(ctx context.Context, name string, sc *script, key string, argv ...any) (bool, error) {
	var held bool
	err := s.runSlot(ctx, name, sc, key, func(v []int64) error {
		if len(v) != 1 || v[0] != 0 && v[0] != 1 {
			return fmt.Errorf("%w: %v", ErrUnexpectedReply, v)
		}
		held = v[0] == 1
		return nil
	}, argv...)
	return held, err
}

// runSlot runs an in-flight script on key's ZSET with ARGV now, argv...
// and hands its reply to parse before the call is recycled. Like every
// script call it is marked NoRetry (see scriptCmd).
func (s *Store) runSlot(ctx context.Context, name string, sc *script, key string, parse func([]int64) error, argv ...any) error {
	now, err := s.now()
	if err != nil {
		return err
	}
	c := calls.Get().(*call)
	defer c.recycle()
	c.script, c.alg = sc, -1
	c.argv[0], c.argv[1], c.argv[2], c.argv[3], c.argv[4] = "evalsha", sc.sha, "1", s.slotKey(key), now
	c.args = append(c.argv[:5], argv...)
	v, err := s.run(ctx, c)
	if err == nil {
		err = parse(v)
	}
	if err != nil {
		return fmt.Errorf("redisstore: in-flight %s: %w", name, err)
	}
	return nil
}
