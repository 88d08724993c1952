package redistest

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// AfterEach is a go-redis hook that calls f after each command has run,
// alone (with the error its call returned) or in a pipeline (with its
// own), so that a test can note what a client sent and was answered.
func AfterEach(f func(cmd redis.Cmder, err error)) redis.Hook { return afterEach(f) }

type afterEach func(redis.Cmder, error)

func (afterEach) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f afterEach) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		f(cmd, err)
		return err
	}
}

func (f afterEach) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			f(c, c.Err())
		}
		return err
	}
}
