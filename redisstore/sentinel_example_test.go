package redisstore_test

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/redisstore"
)

// A Store on Redis Sentinel that leaves a replaced master as soon as any
// Sentinel announces the promotion, with a count of the switches. It needs
// Sentinels, so it is not run.
func ExampleFollowSentinels() {
	o := &redis.FailoverOptions{
		MasterName:    "mymaster",
		SentinelAddrs: []string{"sentinel-1:26379", "sentinel-2:26379", "sentinel-3:26379"},
	}
	var switches atomic.Int64
	follower := redisstore.FollowSentinels(o, &redisstore.FollowOptions{
		Logger:   slog.Default(),
		OnSwitch: func(ctx context.Context, from, to string) { switches.Add(1) }, // once per change
	})
	defer follower.Close()
	client := redis.NewFailoverClient(o) // after FollowSentinels, which sets o.Dialer
	defer client.Close()
	store := redisstore.New(client, nil)
	_ = store
}
