package redisstore_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultClusterNewClientStoppedMaster: a new ClusterClient's first
// decisions on live masters answer within their callers' 100 ms while
// another master is stopped (SIGSTOP). go-redis loads its command table
// on a client's first command (ClusterClient.cmdsInfo), from nodes one at
// a time, under a lock every ClusterClient.Process takes: one that asked
// the stopped master first held every call for the read timeout (3 s).
// Each round builds a new client, so that the table is loaded afresh from
// nodes in another random order.
func TestFaultClusterNewClientStoppedMaster(t *testing.T) {
	race.SkipTiming(t)
	const (
		rounds   = 8
		deadline = 100 * time.Millisecond
	)
	ctx := context.Background()
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{NodeTimeout: 30 * time.Second,
		Args: []string{"--cluster-require-full-coverage", "no"}})
	l := failoverLimit
	keys, masters := keyPerMaster(t, cl, redisstore.New(nil, nil), l)
	masters[0].Pause(t)
	defer masters[0].Resume(t)
	for _, batch := range []int{0, 1} {
		for _, timed := range []bool{false, true} {
			t.Run(fmt.Sprintf("maxbatch=%d/ContextTimeoutEnabled=%v", batch, timed), func(t *testing.T) {
				for round := range rounds {
					c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: timed})
					s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), MaxBatch: batch})
					for _, key := range keys[1:] {
						start := time.Now()
						cctx, cancel := context.WithTimeout(ctx, deadline)
						_, err := s.Take(cctx, key, l, 1)
						cancel()
						if err != nil {
							t.Errorf("round %d: first take of %q on a live master: %v after %v", round, key, err, time.Since(start).Round(time.Millisecond))
						}
					}
					c.Close()
				}
			})
		}
	}
}
