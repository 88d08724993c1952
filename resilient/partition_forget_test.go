package resilient

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/storetest"
)

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
	clk := storetest.NewClock(t0)
	h := newHeld(clk.Now)
	parts := &parted{flaky: h.flaky}
	rec := &recorder{}
	s, err := New(heldParted{h, parts}, &Options{Policy: FailOpen, Clock: clk.Now, Observer: rec, Timeout: slow, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
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
	s, err := NewMulti(p, &Options{Policy: FailOpen, Clock: clk.Now, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
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
	s, err := NewMulti(p, &Options{Policy: FailOpen, Timeout: 20 * time.Millisecond, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
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
	s, err := NewMulti(p, &Options{Policy: FailOpen, Clock: clk.Now, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
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
