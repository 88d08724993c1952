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
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// startPartialCluster starts a Cluster of three masters, each with that
// many replicas, whose live masters keep serving their slots while one is
// failed, and returns it with a store on it.
func startPartialCluster(t *testing.T, replicas int) (*redistest.Cluster, *redisstore.Store) {
	t.Helper()
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Replicas: replicas,
		Args: []string{"--cluster-require-full-coverage", "no"}})
	return cl, redisstore.New(cl.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
}

// takeOnMaster takes k through s and returns the address of the master
// serving it, once rs's Partition has said the same.
func takeOnMaster(t *testing.T, s sluice.Store, cl *redistest.Cluster, rs *redisstore.Store, k string, lim sluice.Limit) string {
	t.Helper()
	if _, err := s.Take(context.Background(), k, lim, 1); err != nil {
		t.Fatal(err)
	}
	m := cl.MasterOf(t, rs.Keys(k, lim)[0]).Addr
	if p := rs.Partition(k); p != m {
		t.Fatalf("Partition(%q) = %q, want %q", k, p, m)
	}
	return m
}

// On a Redis Cluster of three masters, one master stopped opens only its
// own breaker: keys on the other two go on deciding on Redis, exactly,
// while the stopped master's keys fall back; layered calls that span it
// and a live master fall back too without opening the live master's
// breaker; each transition is one line naming the stopped master; and
// every key decides on Redis again once it is back.
func TestPartitionBreakerClusterMasterDown(t *testing.T) {
	t.Parallel()
	cl, rs := startPartialCluster(t, 0)
	log := &lines{}
	// A Timeout well above a loaded machine's round trip (73 ms seen beside
	// other tests): a live master's call must not time out, or its breaker
	// opens too and the test sees what it is not about.
	s := newMultiStore(t, rs, &Options{Name: "redis", Logger: slog.New(log), ProbeInterval: 200 * time.Millisecond, Timeout: 500 * time.Millisecond})
	ctx := context.Background()
	warm := sluice.PerSecond(1000)

	// Keys by master, the map loaded by the first calls.
	byMaster := map[string][]string{}
	for i := range 60 {
		k := fmt.Sprint("key", i)
		m := takeOnMaster(t, s, cl, rs, k, warm)
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
	// The live master's calls must end within the timeout: under -race on
	// a loaded machine they did not, once in two runs of the package.
	race.SkipTiming(t)
	t.Parallel()
	cl, rs := startPartialCluster(t, 0)
	s := newMultiStore(t, rs, &Options{Name: "redis", Logger: discard, ProbeInterval: 200 * time.Millisecond})
	ctx := context.Background()
	lim := sluice.PerSecond(1000)
	byMaster := map[string]string{}
	for i := 0; len(byMaster) < 2; i++ {
		k := fmt.Sprint("key", i)
		m := takeOnMaster(t, s, cl, rs, k, lim)
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

// parted is a backend whose keys live on partitions named by their first
// letter, or on moved's target once that is set (a failover).
type parted struct {
	*flaky
	mu    sync.Mutex
	moved string
}

func (p *parted) Partition(key string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.moved != "" {
		return p.moved
	}
	return strings.ToUpper(key[:1])
}

// A closed breaker whose partition no key maps to any more (its master
// failed over while its keys still answered) is forgotten by Probe, as an
// open one is: breakers do not pile up with failovers.
func TestClosedPartitionForgotten(t *testing.T) {
	clock := storetest.NewClock(storetest.T0)
	p := &parted{flaky: newFlaky(clock.Now)}
	s, err := New(p, &Options{Policy: FailOpen, Clock: clock.Now, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a1", "b1"} {
		if _, err := s.Take(context.Background(), k, sluice.PerSecond(10), 1); err != nil {
			t.Fatal(err)
		}
	}
	names := func() (out []string) {
		for _, b := range s.Breakers() {
			out = append(out, b.Partition)
		}
		return out
	}
	if got := strings.Join(names(), ","); got != ",A,B" {
		t.Fatalf("breakers %q, want the store's and A's and B's", got)
	}
	p.mu.Lock()
	p.moved = "B" // A's keys now live on B
	p.mu.Unlock()
	if _, err := s.Probe(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(names(), ","); got != ",B" {
		t.Errorf("after A's keys moved, breakers %q, want the store's and B's", got)
	}
}

// A forgotten partition's breaker is told to the observer (its metric
// series go), and calls still out on it when it went, failing afterwards,
// do not open it again: nothing would ever close or forget it, and its
// series would say open for good.
func TestForgottenPartitionTold(t *testing.T) {
	t.Parallel()
	s, h, parts, clk, rec := newHeldParted(t)
	ctx := context.Background()
	// 30 calls on A hang while its breaker is closed: enough, failing, to
	// open it by rate and by DeadAfter.
	wg := hang(t, s, h, clk, "a1", 30)
	parts.mu.Lock()
	parts.moved = "B" // a failover: A's keys live on B now
	parts.mu.Unlock()
	if _, err := s.Probe(ctx); err != nil {
		t.Fatal(err)
	}
	close(h.gate)
	wg.Wait()
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if got := strings.Join(rec.forgotten, ","); got != "A" {
		t.Errorf("forgotten partitions %q, want A", got)
	}
	if len(rec.breakers) != 0 {
		t.Errorf("breaker events %v after A was forgotten, want none", rec.breakers)
	}
}

// spanFailing is a partitioned backend whose TakeAll, while failing, fails
// on partition A's key and says so (sluice.KeyFailure), as redisstore's
// does for keys spanning Cluster masters.
type spanFailing struct{ *parted }

type keyFailure struct{ key string }

func (e keyFailure) Error() string     { return "down: " + e.key }
func (e keyFailure) FailedKey() string { return e.key }

func (p spanFailing) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	if p.mode.Load() == 1 {
		for _, r := range reqs {
			if p.Partition(r.Key) == "A" {
				return nil, fmt.Errorf("take all: %w", keyFailure{r.Key})
			}
		}
	}
	return p.parted.TakeAll(ctx, reqs)
}

// A layered call spanning two partitions that fails on one of them, and
// says which (sluice.KeyFailure), is charged to that one alone: a master
// whose only traffic is such calls stays closed while the other is down.
func TestSpanningFailureChargesItsPartition(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	p := spanFailing{&parted{flaky: newFlaky(clk.Now)}}
	s := newMultiStore(t, p, &Options{Policy: FailOpen, Clock: clk.Now, Logger: discard})
	ctx := context.Background()
	lim := sluice.PerSecond(1000)
	reqs := []sluice.Request{{Key: "b1", Limit: lim, Cost: 1}, {Key: "a1", Limit: lim, Cost: 1}}
	if _, err := s.TakeAll(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	p.mode.Store(1)
	for range 50 {
		clk.Advance(100 * time.Millisecond)
		if _, err := s.TakeAll(ctx, reqs); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range s.Breakers() {
		want := sluice.BreakerClosed
		if b.Partition == "A" {
			want = sluice.BreakerOpen
		}
		if b.State != want {
			t.Errorf("breaker of %q is %v, want %v (the calls failed on A's key)", b.Partition, b.State, want)
		}
	}
}

// stallingSpan is a partitioned backend whose TakeAll, while on, answers
// partition B's keys and stalls on A's until its context ends, then
// fails naming the A key, as redisstore does on a Cluster whose master
// A is stopped: the call runs out of time on A, not on B.
type stallingSpan struct{ *parted }

func (p stallingSpan) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	if p.mode.Load() == 1 {
		for _, r := range reqs {
			if p.Partition(r.Key) == "A" {
				<-ctx.Done()
				return nil, fmt.Errorf("take all: %w", keyFailure{r.Key})
			}
		}
	}
	return p.parted.TakeAll(ctx, reqs)
}

// A spanning call that runs out of time on one partition is charged to
// that one: its error, naming the partition, comes back before the
// timeout (without TrustContext too, where a call that outlives the
// timeout is given up on and its error never read).
func TestSpanningTimeoutChargesItsPartition(t *testing.T) {
	t.Parallel()
	p := stallingSpan{&parted{flaky: newFlaky(time.Now)}}
	s := newMultiStore(t, p, &Options{Policy: FailOpen, Timeout: 20 * time.Millisecond, Logger: discard})
	ctx := context.Background()
	lim := sluice.PerSecond(1000)
	reqs := []sluice.Request{{Key: "b1", Limit: lim, Cost: 1}, {Key: "a1", Limit: lim, Cost: 1}}
	if _, err := s.TakeAll(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	p.mode.Store(1)
	for i := 0; !downOpen(s, "A"); i++ {
		if i > 200 {
			t.Fatalf("A's breaker never opened: %+v", s.Breakers())
		}
		start := time.Now()
		if _, err := s.TakeAll(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		if el := time.Since(start); el > time.Second {
			t.Fatalf("a spanning call took %v with a 20ms timeout", el)
		}
	}
	for _, b := range s.Breakers() {
		if b.Partition == "B" && b.State != sluice.BreakerClosed {
			t.Errorf("breaker of B is %v, want closed (the calls ran out of time on A)", b.State)
		}
	}
}

// A spanning call that probes one partition (open for failing) and fails
// without naming a key is charged to that partition alone: the other,
// closed, answers its own calls.
func TestSpanningProbeFailureChargesProbed(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	p := &parted{flaky: newFlaky(clk.Now)}
	s := newMultiStore(t, p, &Options{Policy: FailOpen, Clock: clk.Now, Logger: discard})
	ctx := context.Background()
	lim := sluice.PerSecond(1000)
	if _, err := s.Take(ctx, "b1", lim, 1); err != nil {
		t.Fatal(err)
	}
	p.mode.Store(1) // every call fails, naming nothing
	for i := 0; !downOpen(s, "A"); i++ {
		if i > 100 {
			t.Fatal("A's breaker never opened")
		}
		s.Take(ctx, "a1", lim, 1)
		clk.Advance(100 * time.Millisecond)
	}
	reqs := []sluice.Request{{Key: "b1", Limit: lim, Cost: 1}, {Key: "a1", Limit: lim, Cost: 1}}
	for range 20 { // each a probe of A, spanning B, over 40s
		clk.Advance(2 * time.Second)
		if _, err := s.TakeAll(ctx, reqs); err != nil {
			t.Fatal(err)
		}
	}
	for _, b := range s.Breakers() {
		if b.Partition == "B" && b.State != sluice.BreakerClosed {
			t.Errorf("breaker of B is %v, want closed: the failed calls were A's probes", b.State)
		}
	}
}

// A breaker follows its master, not its slots: a master killed opens its
// own breaker; once its replica is promoted, its keys decide on Redis
// through the new master's breaker, closed from the start, and Probe
// closes the dead master's breaker and forgets it.
func TestFaultPartitionBreakerFollowsFailover(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	cl, rs := startPartialCluster(t, 1)
	log := &lines{}
	s := newStore(t, rs, &Options{Name: "redis", Logger: slog.New(log)})
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
