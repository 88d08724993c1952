package lease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/storetest"
)

// TestStatsChunks: Stats holds a shard's lock for at most SweepChunk slots
// at a time and lets requests in between: here keys made between its
// chunks grow the tables, moving their keys, and Leased still counts each
// lease once.
func TestStatsChunks(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	s := newLease(t, newMemory(t, clock), clock, time.Minute, 10)
	defer s.Close(ctx)
	l := sluice.PerMinute(6_000_000)
	for i := range 1000 {
		take(t, s, fmt.Sprint("k", i), l, 1)
	}
	slots := lease.Slots(s)
	pauses, made := 0, 0
	lease.PauseStats(s, func(walked int) {
		if walked > lease.SweepChunk {
			t.Errorf("a hold walked %d slots, want at most %d", walked, lease.SweepChunk)
		}
		if pauses++; pauses == 1 {
			for range 3000 {
				take(t, s, fmt.Sprint("new-", made), l, 1)
				made++
			}
		}
	})
	st := s.Stats()
	lease.PauseStats(s, nil)
	if pauses < slots/lease.SweepChunk {
		t.Errorf("%d pauses over %d slots, want at least %d", pauses, slots, slots/lease.SweepChunk)
	}
	if lease.Slots(s) <= slots {
		t.Fatalf("%d slots after the keys made during Stats, %d before: the tables did not grow", lease.Slots(s), slots)
	}
	if want := 1000 + made; st.Keys != want || st.Leased != want {
		t.Errorf("Stats: Keys %d, Leased %d; want %d and %d (every key leased on the stopped clock)", st.Keys, st.Leased, want, want)
	}
	// Without the pauses' keys, the count is exact.
	if st := s.Stats(); st.Leased != st.Keys {
		t.Errorf("Stats again: Keys %d, Leased %d", st.Keys, st.Leased)
	}
}
