package redisstore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// Calls on a Store whose client was closed fail with an error that is
// sluice.ErrStoreClosed (and still redis.ErrClosed), so that background
// releases stop on it.
func TestClosedClientIsErrStoreClosed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	store := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	l := sluice.Concurrent(2, time.Minute)
	if d, err := store.Acquire(ctx, "k", l, 1, "h"); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	c.Close()
	_, rerr := store.Release(ctx, "k", "h")
	_, _, oerr := store.ReleaseOnce(ctx, "k", "h", time.Minute)
	_, aerr := store.Acquire(ctx, "k", l, 1, "h2")
	_, terr := store.Take(ctx, "k", sluice.PerSecond(5), 1)
	for name, err := range map[string]error{"Release": rerr, "ReleaseOnce": oerr, "Acquire": aerr, "Take": terr} {
		if !errors.Is(err, sluice.ErrStoreClosed) || !errors.Is(err, redis.ErrClosed) {
			t.Errorf("%s after Close = %v, want sluice.ErrStoreClosed and redis.ErrClosed", name, err)
		}
	}
}
