package resilient

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// On a Redis Cluster of three masters, one master stopped opens only its
// own breaker: keys on the other two go on deciding on Redis, exactly,
// while the stopped master's keys fall back; layered calls that span it
// and a live master fall back too without opening the live master's
// breaker; each transition is one line naming the stopped master; and
// every key decides on Redis again once it is back.
func TestPartitionBreakerClusterMasterDown(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{
		// The live masters keep serving their slots while one is failed.
		Args: []string{"--cluster-require-full-coverage", "no"},
	})
	rs := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	log := &lines{}
	s, err := NewMulti(rs, &Options{Name: "redis", Logger: slog.New(log), ProbeInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	warm := sluice.PerSecond(1000)

	// Keys by master, the map loaded by the first calls.
	byMaster := map[string][]string{}
	for i := range 60 {
		k := fmt.Sprint("key", i)
		if _, err := s.Take(ctx, k, warm, 1); err != nil {
			t.Fatal(err)
		}
		m := cl.MasterOf(t, rs.Keys(k, warm)[0]).Addr
		if p := rs.Partition(k); p != m {
			t.Fatalf("Partition(%q) = %q, want %q", k, p, m)
		}
		byMaster[m] = append(byMaster[m], k)
	}
	if len(byMaster) != 3 {
		t.Fatalf("keys on %d masters, want 3", len(byMaster))
	}
	down := cl.MasterOf(t, rs.Keys("key0", warm)[0])
	var live []string
	for m := range byMaster {
		if m != down.Addr {
			live = append(live, m)
		}
	}
	downKey, liveKey := byMaster[down.Addr][0], byMaster[live[0]][0]

	down.Pause(t)
	// Until its breaker opens: single calls on every master, and layered
	// calls spanning the stopped master and a live one, from several
	// goroutines, as a service's requests come.
	deadline := time.Now().Add(10 * time.Second)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if w == 0 {
					_, _ = s.TakeAll(ctx, []sluice.Request{{Key: downKey, Limit: warm, Cost: 1}, {Key: liveKey, Limit: warm, Cost: 1}})
					continue
				}
				for _, keys := range byMaster {
					_, _ = s.Take(ctx, keys[i%len(keys)], warm, 1)
				}
			}
		})
	}
	for !downOpen(s, down.Addr) && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()
	if !downOpen(s, down.Addr) {
		t.Fatalf("breakers %+v: want %s's open", s.Breakers(), down.Addr)
	}
	if st := s.State(); st != sluice.BreakerOpen {
		t.Errorf("State = %v, want open (one partition is)", st)
	}
	for _, b := range s.Breakers() {
		if b.Partition != down.Addr && b.State != sluice.BreakerClosed {
			t.Errorf("breaker of %q is %v with only %s down", b.Partition, b.State, down.Addr)
		}
	}

	// Keys on the live masters decide on Redis, exactly: 5 admitted of a
	// fresh limit of 5, the 6th denied, Remaining counting down.
	exact := sluice.PerHour(5)
	for _, m := range live {
		k := byMaster[m][1]
		for i := range 6 {
			d, err := s.Take(ctx, k, exact, 1)
			if err != nil || d.Source != sluice.SourceBackend || d.Allowed != (i < 5) || (i < 5 && d.Remaining != int64(4-i)) {
				t.Fatalf("take %d of %q on live %s: %+v, %v; want Redis's exact decision", i+1, k, m, d, err)
			}
		}
	}
	// The stopped master's keys, and layered calls that span it, fall back.
	if d, err := s.Take(ctx, byMaster[down.Addr][1], exact, 1); err != nil || d.Source != sluice.SourceFallback {
		t.Errorf("key on the stopped master: %+v, %v; want the fallback's", d, err)
	}
	ds, err := s.TakeAll(ctx, []sluice.Request{{Key: downKey, Limit: exact, Cost: 1}, {Key: liveKey, Limit: exact, Cost: 1}})
	if err != nil || ds[0].Source != sluice.SourceFallback || ds[1].Source != sluice.SourceFallback {
		t.Errorf("layered call spanning the stopped master: %+v, %v; want the fallback's", ds, err)
	}
	if ds, err := s.TakeAll(ctx, []sluice.Request{{Key: byMaster[live[0]][2], Limit: exact, Cost: 1}, {Key: byMaster[live[1]][2], Limit: exact, Cost: 1}}); err != nil || ds[0].Source != sluice.SourceBackend || ds[1].Source != sluice.SourceBackend {
		t.Errorf("layered call on the live masters: %+v, %v; want Redis's", ds, err)
	}

	down.Resume(t)
	for deadline := time.Now().Add(20 * time.Second); s.State() != sluice.BreakerClosed && time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		s.Probe(ctx)
	}
	if st := s.State(); st != sluice.BreakerClosed {
		t.Fatalf("breakers %+v 20s after the master came back: want all closed", s.Breakers())
	}
	for m, keys := range byMaster {
		if d, err := s.Take(ctx, keys[3], exact, 1); err != nil || d.Source != sluice.SourceBackend || d.Remaining != 4 {
			t.Errorf("key on %s after recovery: %+v, %v; want Redis's", m, d, err)
		}
	}

	// Every breaker line names the stopped master: its opening, then the
	// probes' half-open and the closing; no other partition changed.
	var opened, closed int
	for _, l := range log.all() {
		if !strings.HasPrefix(l, "resilient: breaker ") {
			continue
		}
		if !strings.Contains(l, "partition="+down.Addr) {
			t.Errorf("line %q does not name %s", l, down.Addr)
		}
		switch {
		case strings.HasPrefix(l, "resilient: breaker open"):
			opened++
		case strings.HasPrefix(l, "resilient: breaker closed"):
			closed++
		}
	}
	if opened < 1 || closed != 1 {
		t.Errorf("%d open and %d closed lines, want at least one and one; lines:\n%s", opened, closed, strings.Join(log.all(), "\n"))
	}
}

// On a Redis Cluster, a master whose only traffic is layered calls
// spanning it and a stopped master keeps its breaker closed: each call
// runs out of time on the stopped master, and its error says so.
func TestFaultSpanningTrafficChargesStoppedMaster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Args: []string{"--cluster-require-full-coverage", "no"}})
	rs := redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	s, err := NewMulti(rs, &Options{Name: "redis", Logger: discard, ProbeInterval: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	lim := sluice.PerSecond(1000)
	byMaster := map[string]string{}
	for i := 0; len(byMaster) < 2; i++ {
		k := fmt.Sprint("key", i)
		if _, err := s.Take(ctx, k, lim, 1); err != nil {
			t.Fatal(err)
		}
		m := cl.MasterOf(t, rs.Keys(k, lim)[0]).Addr
		if p := rs.Partition(k); p != m {
			t.Fatalf("Partition(%q) = %q, want %q", k, p, m)
		}
		byMaster[m] = k
	}
	var down, live string
	for m := range byMaster {
		if down == "" {
			down = m
		} else {
			live = m
		}
	}
	reqs := []sluice.Request{{Key: byMaster[live], Limit: lim, Cost: 1}, {Key: byMaster[down], Limit: lim, Cost: 1}}
	node := cl.MasterOf(t, rs.Keys(byMaster[down], lim)[0])
	node.Pause(t)
	defer node.Resume(t)
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				s.TakeAll(ctx, reqs)
			}
		})
	}
	time.Sleep(3 * time.Second) // the stopped master's breaker opens, then probes
	close(stop)
	wg.Wait()
	if !downOpen(s, down) {
		t.Errorf("breakers %+v: want %s's open", s.Breakers(), down)
	}
	for _, b := range s.Breakers() {
		if b.Partition == live && b.State != sluice.BreakerClosed {
			t.Errorf("breaker of live %s is %v: charged with the stopped master's failures", live, b.State)
		}
	}
}

func downOpen(s *MultiStore, addr string) bool {
	for _, b := range s.Breakers() {
		if b.Partition == addr && b.State == sluice.BreakerOpen {
			return true
		}
	}
	return false
}

// A nil MultiStore reports one closed breaker and no evictions, as a nil
// Store does, rather than dereference its Store.
func TestNilMultiStoreBreakers(t *testing.T) {
	var m *MultiStore
	if bs := m.Breakers(); len(bs) != 1 || bs[0].State != sluice.BreakerClosed {
		t.Errorf("Breakers = %+v, want one closed", bs)
	}
	if e, evicting := m.FallbackEvictions(); e.Keys != 0 || evicting {
		t.Errorf("FallbackEvictions = %+v, %v, want none", e, evicting)
	}
}
