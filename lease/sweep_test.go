package lease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/storetest"
)

// A sweep runs in the background: the request that finds one due starts
// it and walks none of it, a request that makes a key while the table is
// over its growth threshold walks one chunk of it (SweepChunk slots), and
// an idle burst's keys still go once it has run.
func TestSweepInBackground(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	s := newLease(t, newMemory(t, clock), clock, 300*time.Millisecond, 4)
	release := make(chan struct{})
	lease.PauseSweeps(s, func() { <-release })
	l := sluice.PerMinute(6_000_000)
	const burst = 6_000 // fewer than start a sweep by growth
	for i := range burst {
		take(t, s, fmt.Sprint("burst-", i), l, 1)
	}
	clock.Advance(1500 * time.Millisecond) // D and a second: a timed sweep is due
	take(t, s, "trigger", l, 1)
	if on, visited := lease.Sweeping(s); !on || visited != 0 || s.Len() != burst+1 {
		t.Fatalf("after the request that found the sweep due: sweeping %v, %d slots walked, Len %d; want a sweep under way, none walked, %d keys",
			on, visited, s.Len(), burst+1)
	}
	// Keys made under the growth threshold walk nothing; over it, each
	// walks one chunk.
	made := 1
	for s.Len() < 10_000 {
		take(t, s, fmt.Sprint("new-", made), l, 1)
		made++
	}
	if _, visited := lease.Sweeping(s); visited != 0 {
		t.Fatalf("%d slots walked by requests under the growth threshold, want 0", visited)
	}
	// A chunk may forget some of the burst's keys, taking the table back
	// under its threshold.
	walked := 0
	for range 100 {
		want := walked
		if s.Len() >= 10_000 {
			want += lease.SweepChunk
		}
		take(t, s, fmt.Sprint("new-", made), l, 1)
		made++
		if _, walked = lease.Sweeping(s); walked != want {
			t.Fatalf("%d slots walked after the key made at Len %d, want %d", walked, s.Len()-1, want)
		}
	}
	if walked == 0 {
		t.Fatal("no key made over the threshold walked a chunk")
	}
	// A request on a key already held walks nothing.
	take(t, s, "new-1", l, 1)
	if _, visited := lease.Sweeping(s); visited != walked {
		t.Fatalf("%d slots walked after a request on a held key, want %d", visited, walked)
	}
	close(release)
	lease.WaitSweep(s)
	// The burst's keys were idle; trigger and the new keys were asked for
	// within their D. A key in a chunk walked by a request is forgotten
	// only when idle too, so all of the burst's go.
	if on, _ := lease.Sweeping(s); on || s.Len() != made {
		t.Fatalf("after the sweep: sweeping %v, Len %d; want done, %d (trigger and the new keys)", on, s.Len(), made)
	}
	// Close stops a sweep under way and waits for it.
	clock.Advance(10 * time.Second)
	take(t, s, "trigger", l, 1)
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if on, _ := lease.Sweeping(s); on || s.Len() != 0 {
		t.Fatalf("after Close: sweeping %v, Len %d; want no sweep, no key", on, s.Len())
	}
}

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
