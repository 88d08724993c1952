package redisstore_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultRoundTripFollowsFailover: once a frozen master's replica is
// promoted, Store.RoundTrip (sluice serve's sluice_redis_round_trip_seconds,
// and the slow-Redis line's figure) is the live masters' again. It was the
// slowest lane's ever used, so it stayed at the dead master's last timed-out
// calls for good, and the slow-Redis WARN line named that figure after the
// cluster had recovered.
func TestFaultRoundTripFollowsFailover(t *testing.T) {
	race.SkipTiming(t)
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1})
	l := failoverLimit
	s := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	keys, masters := keyPerMaster(t, cl, s, l)
	defer takeEach(s, keys, l, 5*time.Millisecond)()
	time.Sleep(300 * time.Millisecond)
	before := s.RoundTrip()
	m := masters[0]
	replicas := cl.ReplicasOf(t, m)
	m.Pause(t)
	_, at := cl.AwaitMaster(t, 10*time.Second, replicas...)
	// Thawed, the old master (a replica now) answers the calls it held,
	// seconds late: that lane's figure climbs to hundreds of ms, and
	// without its node among the masters nothing is sent to bring it down.
	m.Resume(t)
	time.Sleep(1500 * time.Millisecond)
	var after time.Duration
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		after = max(after, s.RoundTrip())
	}
	t.Logf("RoundTrip %v before the freeze, at most %v from 1.5 s to 2.5 s after the promotion (%v after it)",
		before, after, time.Since(at).Round(time.Millisecond))
	if after >= 20*time.Millisecond {
		t.Errorf("RoundTrip up to %v from 1.5 s to 2.5 s after the promotion, want the live masters' (under 20ms; %v before the freeze)", after, before)
	}
}
