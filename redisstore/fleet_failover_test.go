package redisstore_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// A Store whose only calls are fleet heartbeats learns a Cluster failover
// of the registry's master: the failed heartbeats start the slot-map
// reloads, as a failed decision does, and heartbeats succeed again within
// 2 s of the replica's promotion, where they failed until go-redis's own
// reload, a minute later.
func TestFaultHeartbeatReloadsSlotMap(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	store := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	m := store.Membership()
	heartbeat := func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		_, err := m.Heartbeat(ctx, "a", time.Minute)
		return err
	}
	if err := heartbeat(); err != nil {
		t.Fatal(err)
	}
	master := cl.MasterOf(t, m.Key())
	replicas := cl.ReplicasOf(t, master)

	var (
		mu     sync.Mutex
		lastOK time.Time
		lastEr error
	)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			err := heartbeat()
			mu.Lock()
			if err == nil {
				lastOK = time.Now()
			} else {
				lastEr = err
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	})
	defer func() { close(stop); wg.Wait() }()

	master.Kill()
	_, promoted := cl.AwaitMaster(t, 15*time.Second, replicas...)
	const bound = 2 * time.Second
	deadline := promoted.Add(bound)
	for time.Now().Before(deadline) {
		mu.Lock()
		ok := lastOK.After(promoted)
		at := lastOK
		mu.Unlock()
		if ok {
			t.Logf("a heartbeat succeeded %v after the promotion; %d reloads", at.Sub(promoted), store.ClusterReloads())
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	mu.Lock()
	defer mu.Unlock()
	t.Errorf("no heartbeat succeeded within %v of the promotion (%d slot-map reloads); last error: %v", bound, store.ClusterReloads(), lastEr)
}
