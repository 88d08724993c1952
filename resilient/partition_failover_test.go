package resilient

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// A breaker follows its master, not its slots: a master killed opens its
// own breaker; once its replica is promoted, its keys decide on Redis
// through the new master's breaker, closed from the start, and Probe
// closes the dead master's breaker and forgets it.
func TestPartitionBreakerFollowsFailover(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: 1,
		Args: []string{"--cluster-require-full-coverage", "no"}})
	rs := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	log := &lines{}
	s, err := New(rs, &Options{Name: "redis", Logger: slog.New(log)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	lim := sluice.PerSecond(1000)
	var keys []string
	for i := range 30 {
		k := fmt.Sprint("key", i)
		if _, err := s.Take(ctx, k, lim, 1); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	dead := cl.MasterOf(t, rs.Keys("key0", lim)[0])
	replicas := cl.ReplicasOf(t, dead)
	dead.Kill()
	state := func(p string) (sluice.BreakerState, bool) {
		for _, b := range s.Breakers() {
			if b.Partition == p {
				return b.State, true
			}
		}
		return sluice.BreakerClosed, false
	}
	// Load until the promoted master answers key0.
	promoted := ""
	for deadline := time.Now().Add(20 * time.Second); ; {
		for _, k := range keys {
			s.Take(ctx, k, lim, 1)
		}
		s.Probe(ctx)
		if p := rs.Partition("key0"); p != dead.Addr {
			if d, err := s.Take(ctx, "key0", lim, 1); err == nil && d.Source == sluice.SourceBackend {
				promoted = p
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("key0 not back on Redis 20s after its master died: breakers %+v", s.Breakers())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if promoted != replicas[0].Addr {
		t.Errorf("key0 on %s, want its dead master's replica %s", promoted, replicas[0].Addr)
	}
	if st, _ := state(promoted); st != sluice.BreakerClosed {
		t.Errorf("promoted master's breaker %v, want closed", st)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		s.Probe(ctx)
		if _, ok := state(dead.Addr); !ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("breakers %+v: want the dead master's forgotten", s.Breakers())
		}
	}
	if st := s.State(); st != sluice.BreakerClosed {
		t.Errorf("State %v after the failover, want closed", st)
	}
	var opened, forgotten bool
	for _, l := range log.all() {
		opened = opened || strings.HasPrefix(l, "resilient: breaker open") && strings.Contains(l, "partition="+dead.Addr)
		forgotten = forgotten || strings.HasPrefix(l, "resilient: breaker closed") && strings.Contains(l, "partition="+dead.Addr)
	}
	if !opened || !forgotten {
		t.Errorf("lines %q: want the dead master's breaker opened and closed", log.all())
	}
}
