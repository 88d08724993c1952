package redisstore

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
)

var _ sluice.Slots = (*Store)(nil)

// The in-flight scripts: now.lua, inflight_prune.lua, the script's body,
// inflight_save.lua, so that pruning and saving are written once.
var (
	acquireScript = inflightScript("inflight_acquire.lua")
	extendScript  = inflightScript("inflight_extend.lua")
	releaseScript = inflightScript("inflight_release.lua")
)

func inflightScript(body string) *script {
	return newScript(mustRead("now.lua") + mustRead("inflight_prune.lua") + mustRead(body) + mustRead("inflight_save.lua"))
}

// slotKeys returns the Redis keys of key's in-flight holders: their
// deadlines (a ZSET) and their weights (a HASH), in one hash slot and apart
// from every algorithm's key.
func (s *Store) slotKeys(key string) (string, string) {
	k := s.prefix + "{" + key + "}:"
	return k + "if", k + "ifw"
}

// SlotKeys returns the Redis keys that hold key's in-flight slots, for
// inspecting TTLs or checking what was written. It does not validate.
func (s *Store) SlotKeys(key string) []string {
	z, h := s.slotKeys(key)
	return []string{z, h}
}

// Acquire implements sluice.Slots, in one script run (inflight_acquire.lua).
// Like a take it is never sent twice by the client; a caller that resends
// it after an error, with the same holder id, counts once.
func (s *Store) Acquire(ctx context.Context, key string, l sluice.InFlightLimit, weight int64, holder string) (sluice.SlotDecision, error) {
	if err := sluice.ValidateSlot(key, l, weight, holder); err != nil {
		return sluice.SlotDecision{}, err
	}
	v, err := s.runSlot(ctx, "acquire", acquireScript, key, 3, l.Max, l.Hold.Microseconds(), weight, holder)
	if err != nil {
		return sluice.SlotDecision{}, err
	}
	if v[0] != 0 && v[0] != 1 {
		return sluice.SlotDecision{}, fmt.Errorf("redisstore: in-flight acquire: %w: allowed is %d", ErrUnexpectedReply, v[0])
	}
	return sluice.SlotDecision{
		Allowed:    v[0] == 1,
		Limit:      l,
		InUse:      v[1],
		Remaining:  max(l.Max-v[1], 0),
		RetryAfter: time.Duration(max(v[2], 0)) * time.Microsecond,
	}, nil
}

// Extend implements sluice.Slots, in one script run (inflight_extend.lua).
func (s *Store) Extend(ctx context.Context, key string, l sluice.InFlightLimit, holder string) (bool, error) {
	if err := sluice.ValidateSlot(key, l, 1, holder); err != nil {
		return false, err
	}
	return s.holderScript(ctx, "extend", extendScript, key, l.Hold.Microseconds(), holder)
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
	v, err := s.runSlot(ctx, name, sc, key, 1, argv...)
	if err != nil {
		return false, err
	}
	if v[0] != 0 && v[0] != 1 {
		return false, fmt.Errorf("redisstore: in-flight %s: %w: %d", name, ErrUnexpectedReply, v[0])
	}
	return v[0] == 1, nil
}

// runSlot runs an in-flight script on key's two keys with ARGV now, argv...
// and checks that it replied with want integers. Like every script call it
// is marked NoRetry (see scriptCmd).
func (s *Store) runSlot(ctx context.Context, name string, sc *script, key string, want int, argv ...any) ([]int64, error) {
	now, err := s.now()
	if err != nil {
		return nil, err
	}
	z, h := s.slotKeys(key)
	c := &call{script: sc, alg: -1, args: append([]any{"evalsha", sc.sha, "2", z, h, now}, argv...)}
	v, err := s.run(ctx, c)
	if err != nil {
		return nil, fmt.Errorf("redisstore: in-flight %s: %w", name, err)
	}
	if len(v) != want {
		return nil, fmt.Errorf("redisstore: in-flight %s: %w: want %d integers, got %v", name, ErrUnexpectedReply, want, v)
	}
	return v, nil
}
