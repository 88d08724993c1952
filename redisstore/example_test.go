package redisstore_test

import (
	"context"
	"fmt"
	"log"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
)

// A limit shared by every instance of a service: 100 requests a minute per
// API key, counted in Redis. It needs a Redis server, so it is not run.
func Example() {
	client := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	defer client.Close()
	ctx := context.Background()
	// Fail at start-up on a server too old, or a user that may not run
	// scripts, rather than on the first request.
	if _, err := redisstore.Check(ctx, client); err != nil {
		log.Fatal(err)
	}
	store := redisstore.New(client, &redisstore.Options{Prefix: "myapp:"})
	limiter, err := sluice.NewLimiter(store, sluice.PerMinute(100), nil)
	if err != nil {
		log.Fatal(err)
	}
	d, err := limiter.Allow(ctx, "api-key-123")
	if err != nil {
		log.Fatal(err) // Redis failed: see package resilient for a fallback
	}
	fmt.Println(d.Allowed, d.Remaining)
}

// On a Redis Cluster, keys sharing a hash tag share a slot, so a layered
// check of them is one atomic script.
func Example_cluster() {
	client := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"node1:6379", "node2:6379", "node3:6379"}})
	defer client.Close()
	store := redisstore.New(client, nil)
	_, err := store.TakeAll(context.Background(), []sluice.Request{
		{Key: "{tenant42}:user7", Limit: sluice.PerMinute(100), Cost: 1},
		{Key: "{tenant42}:ip", Limit: sluice.PerMinute(1000), Cost: 1},
	})
	if err != nil {
		log.Fatal(err)
	}
}
