package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// ErrInvalidHeartbeat: Membership.Heartbeat was given an empty member or a
// TTL under a millisecond.
var ErrInvalidHeartbeat = errors.New("redisstore: invalid heartbeat")

// fleetScript registers a fleet member and counts the members alive.
var fleetScript = newScript(mustRead("fleet.lua"))

// Membership is a fleet registry on Redis: one sorted set per key prefix,
// so only processes whose Stores share the Prefix count each other. It
// implements resilient.Membership. Build one with Store.Membership.
type Membership struct {
	client redis.UniversalClient
	key    string
}

// Membership returns the fleet registry of this Store's prefix: the key
// Prefix + "{fleet}", one hash slot on a Cluster, which no rate-limit key
// can equal (those end in ":" and an algorithm code).
func (s *Store) Membership() *Membership {
	return &Membership{client: s.client, key: s.prefix + "{fleet}"}
}

// Key returns the Redis key of the registry.
func (m *Membership) Key() string { return m.key }

// Heartbeat registers member as alive for ttl on the server's clock, drops
// expired members and returns how many are alive, in one script.
func (m *Membership) Heartbeat(ctx context.Context, member string, ttl time.Duration) (int, error) {
	if m.client == nil {
		return 0, ErrNoClient
	}
	if member == "" || ttl < time.Millisecond {
		return 0, fmt.Errorf("%w: member %q, TTL %v (want a name and at least 1ms)", ErrInvalidHeartbeat, member, ttl)
	}
	keys := []string{m.key}
	args := []any{member, ttl.Microseconds()}
	v, err := m.client.EvalSha(ctx, fleetScript.sha.(string), keys, args...).Result()
	if isNoScript(err) {
		v, err = m.client.Eval(ctx, fleetScript.src, keys, args...).Result()
	}
	if err != nil {
		return 0, fmt.Errorf("redisstore: heartbeat: %w", err)
	}
	n, ok := v.(int64)
	if !ok {
		return 0, fmt.Errorf("%w: heartbeat returned %T", ErrUnexpectedReply, v)
	}
	return int(n), nil
}
