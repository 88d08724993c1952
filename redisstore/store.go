// Package redisstore is sluice's Redis Store: rate-limit state shared by a
// fleet, each decision made atomically by one Lua script.
//
// It runs on any go-redis v9 redis.UniversalClient: a standalone Client, a
// Sentinel failover client or a ClusterClient. Each algorithm is one script
// in scripts/ (embedded), mirroring the memory store's Go function of the
// same name decision for decision: integer microseconds, exact in Lua's
// doubles. Scripts run by EVALSHA and fall back to EVAL when the server
// answers NOSCRIPT (script cache flushed, server restarted, failover).
//
// Time comes from the Redis server (TIME) by default, so clock skew between
// application hosts cannot matter. Options.Clock supplies the caller's time
// instead, for managed services that reject TIME and for tests.
//
// Keys are laid out as Prefix + "{" + key + "}:" + algorithm code, so all
// of one key's state lives in one Cluster hash slot and different
// algorithms never share state. Every key gets a TTL equal to the
// decision's ResetAfter (rounded up to a millisecond): an expired key is
// exactly a fresh one.
package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"sluice"
)

var (
	_ sluice.Store      = (*Store)(nil)
	_ sluice.MultiStore = (*Store)(nil)
)

var (
	// ErrUnexpectedReply: Redis answered with something the scripts never
	// return. It points at a version mismatch or a foreign value under a
	// sluice key.
	ErrUnexpectedReply = errors.New("redisstore: unexpected reply")
	// ErrClock: Options.Clock returned a time before 1970, which the
	// sliding window log cannot store.
	ErrClock = errors.New("redisstore: clock before 1970")
	// ErrNoClient: the Store was built with a nil client, or is a zero
	// value.
	ErrNoClient = errors.New("redisstore: no client")
)

// Options configures a Store. A nil *Options gives every default.
type Options struct {
	// Prefix of every Redis key. Default "sluice:".
	Prefix string
	// Clock, when non-nil, supplies "now" from the caller (for managed Redis
	// that rejects TIME, and for deterministic tests). Nil (the default)
	// means the scripts read Redis's own TIME, so clock skew between
	// application hosts cannot matter.
	//
	// Key TTLs still run on the server's clock, so a caller's clock must not
	// fall behind real time by more than a key's ResetAfter (a fake clock in
	// a test may jump ahead freely).
	Clock func() time.Time
}

// Store is a sluice.Store and sluice.MultiStore on Redis. It is safe for
// concurrent use and holds no state of its own: any number of Stores, in any
// number of processes, may share a server. Build one with New; the zero
// value answers every call with ErrNoClient.
type Store struct {
	client redis.UniversalClient
	prefix string
	clock  func() time.Time
}

// New returns a Store using client. opts may be nil. The Store does not own
// client: closing it is the caller's job.
func New(client redis.UniversalClient, opts *Options) *Store {
	s := &Store{client: client, prefix: "sluice:"}
	if opts != nil {
		if opts.Prefix != "" {
			s.prefix = opts.Prefix
		}
		s.clock = opts.Clock
	}
	return s
}

// suffixes are the algorithm codes ending each Redis key. None contains ':'
// or '}', so the text after the last ':' names the algorithm and no two
// (key, algorithm) pairs can map to one Redis key.
var suffixes = []string{
	sluice.GCRA:                 "gcra",
	sluice.TokenBucket:          "tb",
	sluice.LeakyBucket:          "lb",
	sluice.FixedWindow:          "fw",
	sluice.SlidingWindowLog:     "swl",
	sluice.SlidingWindowCounter: "swc",
}

// Keys returns the Redis keys that hold key's state under l (one today), for
// inspecting TTLs or checking what was written. It does not validate.
func (s *Store) Keys(key string, l sluice.Limit) []string {
	return []string{s.redisKey(key, l.Algorithm)}
}

func (s *Store) redisKey(key string, a sluice.Algorithm) string {
	suffix := "unknown"
	if a.Valid() {
		suffix = suffixes[a]
	}
	return s.prefix + "{" + key + "}:" + suffix
}

// now returns the script's now argument: µs from the caller's clock, or ""
// for the server's TIME.
func (s *Store) now() (any, error) {
	if s.client == nil {
		return nil, ErrNoClient
	}
	if s.clock == nil {
		return "", nil
	}
	us := s.clock().UnixMicro()
	if us < 0 {
		return nil, fmt.Errorf("%w: %v", ErrClock, s.clock())
	}
	return us, nil
}

const (
	modeTake   = "take"
	modePeek   = "peek"
	modeRefund = "refund"
)

// limitArgs are a limit's script arguments: rate, period, interval,
// capacity, in units and µs.
func limitArgs(l sluice.Limit) [4]any {
	return [4]any{l.Rate, l.Period.Microseconds(), l.Interval().Microseconds(), l.Capacity()}
}

// Take implements sluice.Store.
func (s *Store) Take(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	r, err := s.decide(ctx, modeTake, key, limit, cost)
	if err != nil {
		return sluice.Decision{}, err
	}
	return r.decision(limit), nil
}

// Peek implements sluice.Store. It writes nothing.
func (s *Store) Peek(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	r, err := s.decide(ctx, modePeek, key, limit, cost)
	if err != nil {
		return sluice.Decision{}, err
	}
	return r.decision(limit), nil
}

// Reset implements sluice.Store: it deletes the key's state under limit's
// algorithm.
func (s *Store) Reset(ctx context.Context, key string, limit sluice.Limit) error {
	if err := sluice.ValidateKey(key); err != nil {
		return err
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if s.client == nil {
		return ErrNoClient
	}
	if err := s.client.Del(ctx, s.redisKey(key, limit.Algorithm)).Err(); err != nil {
		return fmt.Errorf("redisstore: reset: %w", err)
	}
	return nil
}

// decide runs the algorithm's script in take or peek mode.
func (s *Store) decide(ctx context.Context, mode, key string, l sluice.Limit, cost int64) (result, error) {
	if err := sluice.ValidateRequest(key, l, cost); err != nil {
		return result{}, err
	}
	now, err := s.now()
	if err != nil {
		return result{}, err
	}
	la := limitArgs(l)
	v, err := oneScripts[l.Algorithm].Run(ctx, s.client, []string{s.redisKey(key, l.Algorithm)},
		now, mode, int64(l.Algorithm), la[0], la[1], la[2], la[3], cost).Result()
	if err != nil {
		return result{}, fmt.Errorf("redisstore: %v %s: %w", l.Algorithm, mode, err)
	}
	r, err := parseResult(v, 6)
	if err != nil {
		return result{}, fmt.Errorf("redisstore: %v %s: %w", l.Algorithm, mode, err)
	}
	return r, nil
}

// refund gives back the cost units a take (reported as r) took.
func (s *Store) refund(ctx context.Context, req sluice.Request, r result) error {
	now, err := s.now()
	if err != nil {
		return err
	}
	la := limitArgs(req.Limit)
	err = oneScripts[req.Limit.Algorithm].Run(ctx, s.client, []string{s.redisKey(req.Key, req.Limit.Algorithm)},
		now, modeRefund, int64(req.Limit.Algorithm), la[0], la[1], la[2], la[3], req.Cost, r.now, r.token).Err()
	if err != nil {
		return fmt.Errorf("redisstore: %v refund: %w", req.Limit.Algorithm, err)
	}
	return nil
}
