package redisstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/ctxutil"
)

// ErrInvalidHeartbeat: Membership.Heartbeat, Roster or Leave was given an
// empty member or a TTL (Leave: keep) under a millisecond.
var ErrInvalidHeartbeat = errors.New("redisstore: invalid heartbeat")

// fleetScript registers a fleet member and counts the members alive;
// rosterScript names them and those that withdrew, which leaveScript
// records.
var (
	fleetScript  = newScript(mustRead("fleet.lua"))
	rosterScript = newScript(mustRead("fleet_roster.lua"))
	leaveScript  = newScript(mustRead("fleet_leave.lua"))
)

// Membership is a fleet registry on Redis: one sorted set per key prefix,
// so only processes whose Stores share the Prefix count each other, and
// beside it (Key()+":left", the same hash slot) the members that withdrew.
// It implements resilient.Roster. Build one with Store.Membership.
type Membership struct {
	client redis.UniversalClient
	store  *Store // whose closed flag the calls share; nil for a nil Store
	key    string
	bad    error // the Store's refusal of its Options, if any
}

// Membership returns the fleet registry of this Store's prefix: the key
// Prefix + "{fleet}", one hash slot on a Cluster, which no rate-limit key
// can equal (those end in ":" and an algorithm code).
func (s *Store) Membership() *Membership {
	if s == nil {
		return &Membership{key: "{fleet}"}
	}
	return &Membership{client: s.client, store: s, key: s.prefix + "{fleet}", bad: s.bad}
}

// Key returns the Redis key of the registry ("" for a nil Membership).
func (m *Membership) Key() string {
	if m == nil {
		return ""
	}
	return m.key
}

// Heartbeat registers member as alive for ttl on the server's clock, drops
// expired members and returns how many are alive, in one script.
func (m *Membership) Heartbeat(ctx context.Context, member string, ttl time.Duration) (int, error) {
	if err := m.check(member, ttl); err != nil {
		return 0, callErr("heartbeat", err)
	}
	v, err := m.run(ctx, fleetScript, member, ttl)
	if err != nil {
		return 0, callErr("heartbeat", err)
	}
	n, ok := v.(int64)
	if !ok {
		return 0, callErr("heartbeat", fmt.Errorf("%w: %T", ErrUnexpectedReply, v))
	}
	return int(n), nil
}

// Roster renews member's registration as Heartbeat does, and names the
// members alive (member included) and those that withdrew (Leave) within
// the last TTL they gave and have not registered again.
func (m *Membership) Roster(ctx context.Context, member string, ttl time.Duration) (alive, left []string, err error) {
	if err := m.check(member, ttl); err != nil {
		return nil, nil, callErr("roster", err)
	}
	v, err := m.run(ctx, rosterScript, member, ttl)
	if err != nil {
		return nil, nil, callErr("roster", err)
	}
	lists, ok := v.([]any)
	if ok && len(lists) == 2 {
		alive, ok = stringList(lists[0])
		if ok {
			left, ok = stringList(lists[1])
		}
	}
	if !ok {
		return nil, nil, callErr("roster", fmt.Errorf("%w: %v", ErrUnexpectedReply, v))
	}
	return alive, left, nil
}

// Leave withdraws member's registration at once and lists it as withdrawn
// for keep, so that the other members' next Roster calls drop it from
// their count: a member that left is certainly gone, where one that is
// merely silent may still be running.
func (m *Membership) Leave(ctx context.Context, member string, keep time.Duration) error {
	if err := m.check(member, keep); err != nil {
		return callErr("leave", err)
	}
	if _, err := m.run(ctx, leaveScript, member, keep); err != nil {
		return callErr("leave", err)
	}
	return nil
}

// check refuses a call without a client, member or TTL.
func (m *Membership) check(member string, ttl time.Duration) error {
	if m == nil || m.client == nil {
		return m.unbuilt()
	}
	if member == "" || ttl < time.Millisecond {
		return fmt.Errorf("%w: member %q, TTL %v (want a name and at least 1ms)", ErrInvalidHeartbeat, member, ttl)
	}
	return nil
}

// callErr names the Membership call that failed: the fleet logs these, and
// a failed Roster or Leave must not read as a failed heartbeat.
func callErr(call string, err error) error {
	return fmt.Errorf("redisstore: %s: %w", call, err)
}

// run runs a fleet script on the registry's two keys. It returns ctx.Err()
// as soon as ctx ends, as the Store's calls do; the abandoned script may
// still run (a heartbeat or leave, which the next one repeats). Once the
// Store knows its client closed, it fails at once, as the Store's calls do.
func (m *Membership) run(ctx context.Context, s *script, member string, d time.Duration) (any, error) {
	ctx = ctxutil.OrBackground(ctx)
	if m.store != nil && m.store.closed.Load() {
		return nil, replyErr(redis.ErrClosed)
	}
	keys := []string{m.key, m.key + ":left"}
	args := []any{member, d.Microseconds()}
	var v any
	err := boundedErr(ctx, func() error {
		var err error
		cmd := evalCmd(ctx, "evalsha", s.sha.(string), keys, args...)
		if err = m.client.Process(ctx, cmd); isNoScript(err) {
			cmd = evalCmd(ctx, "eval", s.src, keys, args...)
			err = m.client.Process(ctx, cmd)
		}
		v = cmd.Val()
		return err
	})
	if err != nil {
		return nil, m.failed(err) // v may still be written by an abandoned send
	}
	if m.store != nil {
		m.store.reload.answered(m.key)
	}
	return v, nil
}

// failed is the error of a call that failed with err: on a Cluster client
// its owner closed, sluice.ErrStoreClosed whatever err is, noted in the
// Store so that every later call fails at once (see Store.failed: go-redis
// takes 100–150 ms to fail each, longer than short deadlines). Otherwise,
// as a decision call's, a failure that may mean a node is gone starts the
// slot-map reloads: a process whose only calls are heartbeats would dial
// a failed-over master until go-redis's own reload, a minute later.
func (m *Membership) failed(err error) error {
	if m.store != nil {
		var closed bool
		if closed, err = m.store.closedBy(m.key, err); !closed {
			m.store.reload.failed(m.key, err)
		}
	}
	return closedErr(err)
}

// stringList reads a script's array of strings.
func stringList(v any) ([]string, bool) {
	a, ok := v.([]any)
	if !ok {
		return nil, false
	}
	out := make([]string, len(a))
	for i, e := range a {
		if out[i], ok = e.(string); !ok {
			return nil, false
		}
	}
	return out, true
}

// unbuilt is why m has no client: its Store's refused Options, or none given.
func (m *Membership) unbuilt() error {
	if m != nil && m.bad != nil {
		return m.bad
	}
	return ErrNoClient
}
