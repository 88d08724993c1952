package redisstore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// reloader asks a ClusterClient for a fresh slot map when calls fail with
// connection errors. go-redis reloads it on MOVED and READONLY, which a
// dead master never sends, and every ClusterStateReloadInterval (60 s by
// default): without this, a client keeps dialling a failed-over master
// until then. A nil *reloader does nothing.
type reloader struct {
	cluster *redis.ClusterClient
	every   time.Duration
	log     *slog.Logger
	last    atomic.Int64  // UnixNano of the last reload asked for
	count   atomic.Uint64 // reloads asked for
	failing atomic.Bool   // since the first reload after a success
	lastBad atomic.Int64  // UnixNano of the last failure that may mean a node is gone
}

// recoveredAfter is how long calls must succeed with no node failing before
// an episode of failures ends. One dead master among healthy ones fails
// some calls while others succeed: ending the episode at the first success
// logged a pair of lines every reload for as long as it stayed dead.
const recoveredAfter = 5 * time.Second

// failed reloads the slot map if err says a node may be gone and none was
// asked for in the last r.every.
func (r *reloader) failed(err error) {
	if r == nil || !nodeTrouble(err) {
		return
	}
	now, last := time.Now().UnixNano(), r.last.Load()
	r.lastBad.Store(now)
	if now-last < int64(r.every) || !r.last.CompareAndSwap(last, now) {
		return
	}
	r.cluster.ReloadState(context.Background()) // asynchronous
	n := r.count.Add(1)
	if !r.failing.Swap(true) {
		r.log.Warn("redisstore: cluster calls failing; reloading the slot map", "err", err, "reloads", n)
	}
}

// succeeded ends an episode of failures, once no node has failed for
// recoveredAfter.
func (r *reloader) succeeded() {
	if r != nil && r.failing.Load() && time.Now().UnixNano()-r.lastBad.Load() >= int64(recoveredAfter) && r.failing.Swap(false) {
		r.log.Info("redisstore: cluster calls succeeding again", "reloads", r.count.Load())
	}
}

// nodeTrouble reports whether err may come from a node that is gone or
// unreachable: anything but a Redis error reply, a cancellation or the
// Store's own verdicts, and the
// replies of a cluster that lost a master or moved a slot.
func nodeTrouble(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, ErrNotReplicated) || errors.Is(err, ErrWaitUnsupported) {
		return false
	}
	var reply redis.Error
	if errors.As(err, &reply) {
		return redis.HasErrorPrefix(err, "CLUSTERDOWN") || redis.HasErrorPrefix(err, "MASTERDOWN") ||
			redis.HasErrorPrefix(err, "MOVED") // only runWaited meets it: a stale map
	}
	return true
}

// ClusterReloads returns how many times the Store has asked its
// ClusterClient to reload the slot map after connection errors (see
// Options.ReloadInterval): a counter for a metric. It is 0 on other clients.
func (s *Store) ClusterReloads() uint64 {
	if s.reload == nil {
		return 0
	}
	return s.reload.count.Load()
}

// takes reports whether c writes a take (Options.WaitReplicas waits for
// those only: a lost refund or peek cannot admit extra).
func (c *call) takes() bool {
	return c.alg < 0 || c.argv[argMode] == modeTake
}

// runWaited sends c and then WAIT on one connection to its master, since
// WAIT counts the writes of the connection it arrives on.
func (s *Store) runWaited(ctx context.Context, c *call) {
	var conn *redis.Client
	switch client := s.client.(type) {
	case *redis.Client: // a pipeline keeps to one connection
		conn = client
	case *redis.ClusterClient:
		node, err := client.MasterForKey(ctx, c.args[argKey].(string))
		if err != nil {
			c.err = err
			return
		}
		conn = node
	default:
		c.err = ErrWaitUnsupported
		return
	}
	args := c.args
	for {
		pipe := conn.Pipeline()
		cmd := newCmd(ctx, args)
		wait := redis.NewIntCmd(ctx, s.wait...)
		_ = pipe.Process(ctx, cmd)
		_ = pipe.Process(ctx, wait)
		_, _ = pipe.Exec(ctx) // each command keeps its own error
		if isNoScript(cmd.Err()) && args[0] == "evalsha" {
			args = evalArgs(c.script, args)
			continue
		}
		c.val, c.err = cmd.Val(), cmd.Err()
		if c.err == nil {
			c.err = s.replicated(wait)
		}
		return
	}
}

// replicated checks WAIT's answer.
func (s *Store) replicated(wait *redis.IntCmd) error {
	n, err := wait.Result()
	want := s.wait[1].(int)
	switch {
	case err != nil:
		return fmt.Errorf("%w: %w", ErrNotReplicated, err)
	case n < int64(want):
		return fmt.Errorf("%w: %d of %d replicas acknowledged within %d ms", ErrNotReplicated, n, want, s.wait[2])
	}
	return nil
}
