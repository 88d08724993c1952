//go:build unix

package server

import (
	"strings"
	"testing"
	"time"

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

// failoverArgs make failures visible (503) and keep a slow moment of a
// busy machine from counting as one.
var failoverArgs = []string{"--failure-policy", "error", "--decision-timeout", "1s"}

// failoverRecovery is how soon after a promotion decisions must succeed
// again.
const failoverRecovery = 3 * time.Second

// checkRecovery runs load on f through a failover that kill starts and
// promoted reports, and asserts that no decision failed later than
// failoverRecovery after the promotion (under --failure-policy error a
// failed decision is a 503), and that instances under local have left
// their fallback a second after that.
func checkRecovery(t *testing.T, f *fleet, kill func(), promoted func() time.Time) {
	t.Helper()
	l := f.drive(2, "hot", "api")
	time.Sleep(500 * time.Millisecond)
	killed := time.Now()
	kill()
	at := promoted()
	time.Sleep(time.Until(at.Add(failoverRecovery + time.Second)))
	l.finish()
	allowed, _, failed := l.sum()
	last, why := l.lastFailure()
	t.Logf("promotion %v after the kill; %d decisions, %d failed", at.Sub(killed).Round(time.Millisecond), allowed+failed, failed)
	if !last.IsZero() {
		t.Logf("the last failure %v after the promotion: %s", last.Sub(at).Round(time.Millisecond), why)
	}
	if last.Sub(at) > failoverRecovery {
		t.Errorf("a decision failed %v after the promotion, want none after %v: %s", last.Sub(at).Round(time.Millisecond), failoverRecovery, why)
	}
	if allowed == 0 {
		t.Error("no decision succeeded")
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
// and the instances leave their fallback within 4s of the replica's
// promotion. (TestFaultServeClusterFailover times the decisions under
// error.)
func TestFaultServeClusterFailoverLocal(t *testing.T) {
	race.SkipTiming(t)
	c := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	f := startFleet(t, c.URL(), 2, failoverConfig)
	// The service's store key for policy api, key hot is "api|hot", the
	// hash tag of its Redis key.
	master := c.MasterOf(t, "{api|hot}")
	replicas := c.ReplicasOf(t, master)
	checkRecovery(t, f, master.Kill, func() time.Time {
		_, at := c.AwaitMaster(t, 10*time.Second, replicas...)
		return at
	})
	for i, p := range f.procs {
		log := p.stderr.String()
		if !strings.Contains(log, "resilient: failure policy on") || !strings.Contains(log, "resilient: failure policy off") {
			t.Errorf("instance %d: no fallback episode logged; log:\n%s", i, log)
		}
	}
}

// TestFaultServeSentinelFailoverLocal: the same through Sentinel: 1 master + 1
// replica + 3 Sentinels (quorum 2, down-after-milliseconds 1000).
func TestFaultServeSentinelFailoverLocal(t *testing.T) {
	race.SkipTiming(t)
	s := redistest.StartSentinel(t, nil)
	addrs := s.SentinelAddrs()
	url := "redis+sentinel://" + addrs[0] + "?master_name=" + redistest.SentinelMaster + "&addr=" + strings.Join(addrs[1:], "&addr=")
	f := startFleet(t, url, 2, failoverConfig, failoverArgs...)
	f.add(t, "--failure-policy", "local")
	checkRecovery(t, f, s.Master.Kill, func() time.Time {
		_, at := s.AwaitMaster(t, 15*time.Second, s.Replicas...)
		return at
	})
}
