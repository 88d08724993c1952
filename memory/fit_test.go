package memory

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestSweepGivesSlotsBack: a burst of keys that all expire leaves no
// grown tables behind once swept, so the memory a key flood took is
// returned to the collector, not kept until the next growth.
func TestSweepGivesSlotsBack(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(&Options{Clock: func() time.Time { return now }, SweepInterval: -1})
	defer s.Close()
	slots := func() (n int) {
		for i := range s.shards {
			n += s.shards[i].tab.Slots()
		}
		return n
	}
	limit := sluice.Limit{Rate: 10, Period: time.Second}
	for i := range 100_000 {
		if _, err := s.Take(context.Background(), fmt.Sprint("k", i), limit, 1); err != nil {
			t.Fatal(err)
		}
	}
	grown := slots()
	now = now.Add(time.Minute)
	s.Sweep()
	if s.Len() != 0 || slots() > grown/64 {
		t.Fatalf("after the sweep: %d keys, %d slots (%d before)", s.Len(), slots(), grown)
	}
}
