package redisstore

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// call is one script run: its command, and how its caller learns the reply
// when the call travels in a batch.
type call struct {
	script *script
	args   []any   // evalsha, sha, numkeys, keys..., argv...
	argv   [10]any // backs args for one-key calls, saving an allocation
	cmd    *redis.IntSliceCmd
	done   chan struct{} // batched calls: receives once cmd holds the reply
	until  time.Time     // batched calls: the caller's deadline, if any
	// gone: the caller stopped waiting while the call was in flight, so the
	// sender may still write to it and it must not be recycled.
	gone bool
}

// calls recycles one-key calls: their argument array and channel would
// otherwise be allocated on every call.
var calls = sync.Pool{New: func() any { return new(call) }}

// recycle returns c to the pool unless its sender may still use it. The
// caller must be done with c.cmd.
func (c *call) recycle() {
	if c.gone {
		return
	}
	*c = call{done: c.done} // the channel is empty: its one signal was received
	calls.Put(c)
}

func newCmd(ctx context.Context, args []any) *redis.IntSliceCmd {
	cmd := redis.NewIntSliceCmd(ctx, args...)
	cmd.SetFirstKeyPos(3) // a cluster routes by the first key, after numkeys
	return cmd
}

// evalArgs are c's arguments for EVAL: the script's source in place of its
// digest. EVAL also caches the script, so the next EVALSHA finds it.
func evalArgs(c *call) []any {
	return append([]any{"eval", c.script.src}, c.args[2:]...)
}

func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}

// runOne sends c on its own, on the caller's context: EVALSHA, and EVAL if
// the server has lost the script.
func runOne(ctx context.Context, client redis.UniversalClient, c *call) error {
	err := client.Process(ctx, c.cmd)
	if isNoScript(err) {
		c.cmd = newCmd(ctx, evalArgs(c))
		err = client.Process(ctx, c.cmd)
	}
	return err
}
