package redisstore_test

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestBatchesStayInPool: batches of decisions, each one script run on one
// server, go on the client's pool, so that Redis sees at most PoolSize
// connections from it. go-redis takes a pipeline's connection from a pool
// of its own (PipelinePoolSize, 10 by default) on top of PoolSize: under
// load with Redis 10 ms away, a pool of 6 opened 12.
func TestBatchesStayInPool(t *testing.T) {
	const pool = 6
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	proxy.SetDelay(5 * time.Millisecond)
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true, PoolSize: pool})
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	admin := srv.Client(t)
	most := 0
	lat, _ := load(s, 4*pool, 2*time.Second, 50*time.Millisecond, func() {
		info, err := admin.Info(context.Background(), "clients").Result()
		if err != nil {
			t.Error(err)
			return
		}
		for line := range strings.SplitSeq(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "connected_clients:"); ok {
				n, _ := strconv.Atoi(v)
				most = max(most, n-1) // admin's own
			}
		}
	})
	if len(lat) == 0 {
		t.Fatal("no call succeeded")
	}
	t.Logf("%d calls, at most %d connections on Redis, PoolSize %d", len(lat), most, pool)
	if most > pool {
		t.Errorf("%d connections on Redis from a client whose PoolSize is %d", most, pool)
	}
}
