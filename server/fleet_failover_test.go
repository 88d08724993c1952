//go:build unix

package server

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// failoverConfig admits everything: these tests watch whether decisions
// are made, not what they are.
const failoverConfig = `
policies:
  - name: api
    limit: gcra 1000000/h
`

// failoverRecovery is how soon after a promotion decisions must return to
// Redis; clusterBack how soon on a Cluster, whose store tells the breaker
// of the promotion (redisstore.Store.OnFailover) so that it probes at once
// rather than after its probe interval and two more probes. sentinelBack
// is the same through Sentinel, whose +switch-master tells it: go-redis's
// pool, having failed to dial the old master, dials again only once a
// second, so up to a second more.
const (
	failoverRecovery = 3 * time.Second
	clusterBack      = 750 * time.Millisecond
	sentinelBack     = 1250 * time.Millisecond
)

// checkRecovery runs load on f through a failover that kill starts and
// promoted reports, and asserts that every decision was answered (under
// local, by the fallback while Redis could not), that every instance left
// its breaker (decisions back on Redis) within back of the promotion, and
// that they have all left their fallback a second after failoverRecovery.
func checkRecovery(t *testing.T, f *fleet, kill func(), promoted func() time.Time, back time.Duration) {
	t.Helper()
	l := f.drive(2, "hot", "api")
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	kill()
	at := promoted()
	time.Sleep(time.Until(at.Add(failoverRecovery + time.Second)))
	for i, p := range f.procs {
		// The breaker's closing sends decisions back to Redis (the
		// status follows at the next store check).
		closed, ok := lastLogTime(p, "resilient: breaker closed")
		if !ok || closed.Before(killed) {
			continue // never opened
		}
		took := closed.Sub(at)
		t.Logf("instance %d: decisions back on Redis %v after the promotion", i, took.Round(time.Millisecond))
		if took > back {
			t.Errorf("instance %d: decisions back on Redis %v after the promotion, want within %v", i, took.Round(time.Millisecond), back)
		}
	}
	l.finish()
	allowed, _, failed := l.sum()
	t.Logf("promotion %v after the kill; %d decisions", at.Sub(killed).Round(time.Millisecond), allowed+failed)
	if last, why := l.lastFailure(); failed > 0 {
		t.Errorf("%d decisions failed, the last %v after the promotion: %s", failed, last.Sub(at).Round(time.Millisecond), why)
	}
	for i, p := range f.procs {
		if got := metric(t, p, "sluice_fallback_active"); got != 0 {
			t.Errorf("instance %d: sluice_fallback_active %v %v after the promotion", i, got, time.Since(at).Round(time.Millisecond))
		}
	}
}

// TestFaultServeClusterFailoverLocal: sluice serve under its default
// policy (local) on a 3 masters + 3 replicas cluster under load; the master
// that owns the hot key is killed (SIGKILL). Every decision is answered,
// the breakers close within clusterBack of the promotion, and the
// instances leave their fallback, which they log, within 4s of it: a client that kept dialling the dead master would
// keep them on it for good. (TestFaultServeClusterFailover times the
// decisions under error.)
func TestFaultServeClusterFailoverLocal(t *testing.T) {
	race.SkipTiming(t)
	c := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	f := startFleet(t, c.URL(), 2, failoverConfig)
	master := c.MasterOf(t, redisHashTag(t, "api", "gcra 1000000/h", "hot"))
	replicas := c.ReplicasOf(t, master)
	checkRecovery(t, f, master.Kill, func() time.Time {
		_, at := c.AwaitMaster(t, 10*time.Second, replicas...)
		return at
	}, clusterBack)
	checkFallbackEpisode(t, f)
	for i, p := range f.procs { // the failover is counted, not only logged
		if got := metric(t, p, "sluice_redis_cluster_reloads_total"); got == 0 {
			t.Errorf("instance %d: sluice_redis_cluster_reloads_total is 0 after a failover", i)
		}
	}
}

// checkFallbackEpisode asserts that every instance logged the start and
// the end of its fallback.
func checkFallbackEpisode(t *testing.T, f *fleet) {
	t.Helper()
	for i, p := range f.procs {
		log := p.stderr.String()
		if !strings.Contains(log, "resilient: breaker open") || !strings.Contains(log, "resilient: breaker closed") {
			t.Errorf("instance %d: no fallback episode logged; log:\n%s", i, log)
		}
	}
}

// TestFaultServeSentinelFailoverLocal: the same through Sentinel: 1
// master + 1 replica + 3 Sentinels (quorum 2, down-after-milliseconds
// 1000). The instances hear +switch-master from the Sentinels, which they
// log, and probe as soon as their client reaches the new master. (TestFaultServeSentinelFailover times the decisions under error.)
func TestFaultServeSentinelFailoverLocal(t *testing.T) {
	race.SkipTiming(t)
	s := redistest.StartSentinel(t, nil)
	addrs := s.SentinelAddrs()
	url := "redis+sentinel://" + addrs[0] + "?master_name=" + redistest.SentinelMaster + "&addr=" + strings.Join(addrs[1:], "&addr=")
	f := startFleet(t, url, 2, failoverConfig)
	checkRecovery(t, f, s.Master.Kill, func() time.Time {
		_, at := s.AwaitMaster(t, 15*time.Second, s.Replicas...)
		return at
	}, sentinelBack)
	checkFallbackEpisode(t, f)
	for i, p := range f.procs {
		if _, ok := lastLogTime(p, sentinelSwitchMsg); !ok {
			t.Errorf("instance %d: no %q line", i, sentinelSwitchMsg)
		}
	}
}

// redisHashTag is the hash tag of the Redis key that holds key's state
// under policy with limit l (as the configuration writes it): the
// service's store key (one key grammar, package internal/enforce) in
// braces.
func redisHashTag(t *testing.T, policy, limit, key string) string {
	t.Helper()
	l, err := sluice.ParseLimit(limit)
	if err != nil {
		t.Fatal(err)
	}
	k := enforce.NewKeyer("", nil)
	storeKey, _ := k.Keys(k.LimitStem(k.Base(policy), l), key, false)
	return "{" + storeKey + "}"
}

// lastLogTime returns the time of p's last log line with message msg.
func lastLogTime(p *proc, msg string) (time.Time, bool) {
	var at time.Time
	for line := range strings.Lines(p.stderr.String()) {
		r, ok := parseRecord(strings.TrimSpace(line))
		if !ok || r["msg"] != msg {
			continue
		}
		if t, err := time.Parse(time.RFC3339Nano, r["time"]); err == nil {
			at = t
		}
	}
	return at, !at.IsZero()
}
