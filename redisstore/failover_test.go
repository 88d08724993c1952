package redisstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// failoverLimit never denies during a test, so that every take's count is
// Rate - Remaining and counts tell which server answered.
var failoverLimit = sluice.PerHour(1_000_000_000).WithAlgorithm(sluice.FixedWindow)

// underFailover runs redistest.UnderFailover on s's key.
func underFailover(t *testing.T, s *redisstore.Store, key string, fail func(), promoted func() time.Time) {
	t.Helper()
	l := failoverLimit
	redistest.UnderFailover(t, redistest.Failover{
		Take: func(ctx context.Context) (int64, error) {
			d, err := s.Take(ctx, key, l, 1)
			return l.Rate - d.Remaining, err
		},
		Counted: func() (int64, error) {
			d, err := s.Peek(context.Background(), key, l, 1)
			return l.Rate - d.Remaining, err
		},
		Fail:     fail,
		Promoted: promoted,
	})
}

// TestFaultClusterFailover: on a cluster client the caller built (go-redis
// defaults: its slot map is reloaded only every 60 s), with no failure
// policy, the hot key's master is killed under load; decisions succeed
// again within 3 s of its replica's promotion.
func TestFaultClusterFailover(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	const key = "hot"
	master := cl.MasterOf(t, s.Keys(key, failoverLimit)[0])
	replicas := cl.ReplicasOf(t, master)
	underFailover(t, s, key, master.Kill, func() time.Time {
		_, at := cl.AwaitMaster(t, 10*time.Second, replicas...)
		return at
	})
	if s.ClusterReloads() == 0 {
		t.Error("no slot-map reload after the master died")
	}
}

// TestFaultSentinelFailover: the same on a Sentinel failover client, one
// master, one replica and three Sentinels (quorum 2).
func TestFaultSentinelFailover(t *testing.T) {
	race.SkipTiming(t)
	set := redistest.StartSentinel(t, nil)
	c := redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:    redistest.SentinelMaster,
		SentinelAddrs: set.SentinelAddrs(),
	})
	t.Cleanup(func() { c.Close() })
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	underFailover(t, s, "hot", set.Master.Kill, func() time.Time {
		_, at := set.AwaitMaster(t, 10*time.Second, set.Replicas...)
		return at
	})
}
