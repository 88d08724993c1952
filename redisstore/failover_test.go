package redisstore_test

import (
	"context"
	"sync"
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
var failoverLimit = sluice.PerHour(1_000_000_000).With(sluice.FixedWindow)

// take is one call of a failover test's load.
type take struct {
	end   time.Time
	ok    bool
	count int64 // takes the key had counted, this one included
}

// underFailover takes from one hot key with 8 goroutines, each call with a
// 100 ms deadline, while fail kills the key's master and promoted waits for
// the promotion and returns when it was seen. The load runs on until 3.5 s
// after the promotion. It checks that decisions succeed again within 3 s
// of the promotion, and that over-admission is within the takes the old
// master acknowledged but had not replicated.
func underFailover(t *testing.T, s *redisstore.Store, key string, fail func(), promoted func() time.Time) {
	t.Helper()
	const (
		workers  = 8
		deadline = 100 * time.Millisecond
		recovery = 3 * time.Second
	)
	l := failoverLimit
	var (
		mu    sync.Mutex
		takes []take
		stop  = make(chan struct{})
		wg    sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				d, err := s.Take(ctx, key, l, 1)
				cancel()
				tk := take{end: time.Now(), ok: err == nil, count: l.Rate - d.Remaining}
				mu.Lock()
				takes = append(takes, tk)
				mu.Unlock()
				if err != nil {
					time.Sleep(5 * time.Millisecond) // a failing call returns at once: no busy loop
				}
			}
		})
	}
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	fail()
	at := promoted()
	time.Sleep(recovery + 500*time.Millisecond)
	close(stop)
	wg.Wait()

	var (
		firstOK        time.Time
		oldMax, newMin int64 // counts the old master acknowledged; the new one started from
		admitted       int64
		failed, late   int
	)
	newMin = l.Rate
	for _, tk := range takes {
		if !tk.ok {
			failed++
			if tk.end.After(at.Add(recovery)) {
				late++
			}
			continue
		}
		admitted++
		switch {
		case tk.end.Before(at):
			oldMax = max(oldMax, tk.count)
		default:
			newMin = min(newMin, tk.count)
			if tk.end.After(killed) && (firstOK.IsZero() || tk.end.Before(firstOK)) {
				firstOK = tk.end
			}
		}
	}
	if firstOK.IsZero() {
		t.Fatalf("no decision succeeded after the promotion (%d calls failed)", failed)
	}
	d, err := s.Peek(context.Background(), key, l, 1)
	if err != nil {
		t.Fatal(err)
	}
	counted := l.Rate - d.Remaining
	// The replica's count at promotion is one below the first count the
	// new master gave; the takes above it that the old master had
	// acknowledged were lost.
	lost := max(0, oldMax-(newMin-1))
	excess := admitted - counted
	t.Logf("promoted %v after the kill; decisions succeed again %v after the promotion", at.Sub(killed), firstOK.Sub(at))
	t.Logf("%d takes: %d admitted, %d failed (%d of them later than %v after the promotion); Redis counts %d: excess %d; the old master acknowledged %d takes its replica never had",
		len(takes), admitted, failed, late, recovery, counted, excess, lost)
	if got := firstOK.Sub(at); got > recovery {
		t.Errorf("decisions succeed again %v after the promotion, want within %v", got, recovery)
	}
	if late > 0 {
		t.Errorf("%d calls failed later than %v after the promotion", late, recovery)
	}
	if excess > lost {
		t.Errorf("over-admission %d exceeds the %d takes lost with the old master", excess, lost)
	}
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
