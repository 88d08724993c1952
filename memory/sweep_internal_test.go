package memory

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/storetest"
)

// TestSweepChunks: a sweep holds a shard's lock for at most sweepChunk
// slots, in-flight keys and Reset marks at a time, and lets requests on
// the shard in between: here requests made between its chunks grow the
// shard's table, moving every key, then Reset half of what they made.
// Every key, holder and mark expired when the sweep began still goes.
func TestSweepChunks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := storetest.NewClock(storetest.T0)
	s := New(&Options{Clock: clock.Now, Shards: 1, SweepInterval: -1})
	defer s.Close()
	short, long := sluice.PerSecond(1), sluice.PerHour(1)
	slot := sluice.Concurrent(1, time.Second)
	for i := range 1000 {
		s.Take(ctx, fmt.Sprint("short-", i), short, 1)
		s.Take(ctx, fmt.Sprint("long-", i), long, 1)
		s.Acquire(ctx, fmt.Sprint("held-", i), slot, 1, "h")
		s.Take(ctx, fmt.Sprint("reset-", i), short, 1)
		s.Reset(ctx, fmt.Sprint("reset-", i), short) // a mark for 1 s
	}
	clock.Advance(2 * time.Second) // short-*, the holds and the marks have expired
	sh := &s.shards[0]
	slots := sh.gcra.Slots() // the limits are GCRA's
	pauses, made := 0, 0
	s.sweepPaused = func(walked int) {
		if walked > sweepChunk {
			t.Errorf("a hold walked %d entries, want at most %d", walked, sweepChunk)
		}
		pauses++
		if pauses == 2000/sweepChunk+10 { // in the table: grow it
			for range 4000 {
				s.Take(ctx, fmt.Sprint("new-", made), long, 1)
				made++
			}
		}
	}
	s.Sweep()
	s.sweepPaused = nil
	if min := (2000 + slots) / sweepChunk; pauses < min {
		t.Errorf("%d pauses, want at least %d", pauses, min)
	}
	if made == 0 || sh.gcra.Slots() <= slots {
		t.Fatalf("%d keys made during the sweep, %d slots (%d before): the table did not grow", made, sh.gcra.Slots(), slots)
	}
	if got, want := s.Len(), 1000+made; got != want {
		t.Errorf("Len %d after the sweep, want %d (the long keys and those made during it)", got, want)
	}
	for i := range 1000 {
		key := fmt.Sprint("short-", i)
		if _, tag := s.locate(key, short.Algorithm); sh.find(tag, key, short.Algorithm).found() {
			t.Fatalf("%s, expired, is still held", key)
		}
	}
	if n := s.HeldKeys(); n != 0 {
		t.Errorf("%d keys hold slots after the sweep, want 0", n)
	}
	if n := len(sh.resets); n != 0 {
		t.Errorf("%d Reset marks after the sweep, want 0", n)
	}
}

// TestSweepGivesSlotsBack: a burst of keys that all expire leaves no
// grown tables behind once swept, so the memory a key flood took is
// returned to the collector, not kept until the next growth.
func TestSweepGivesSlotsBack(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	s := New(&Options{Clock: func() time.Time { return now }, SweepInterval: -1})
	defer s.Close()
	slots := func() (n int) {
		for i := range s.shards {
			n += s.shards[i].gcra.Slots() + s.shards[i].tab.Slots()
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
