package resilient

import (
	"context"
	"strings"
	"sync"
	"testing"

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
