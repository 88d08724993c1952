package memory_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

func newStore(t *testing.T, now func() time.Time) sluice.Store {
	s := memory.New(&memory.Options{Clock: now})
	t.Cleanup(func() { s.Close() })
	return s
}

// newClocked returns a Store on a fake clock at T0 without a sweeper, closed
// at the end of the test or benchmark.
func newClocked(tb testing.TB, o memory.Options) (*memory.Store, *storetest.Clock) {
	clock := storetest.NewClock(storetest.T0)
	o.Clock, o.SweepInterval = clock.Now, -1
	s := memory.New(&o)
	tb.Cleanup(func() { s.Close() })
	return s, clock
}

func TestConformance(t *testing.T) { storetest.Run(t, newStore) }

func TestGrantConformance(t *testing.T) { storetest.RunGrant(t, newStore) }

// A zero Store, and a nil *Store alike, refuses every decision with
// ErrZeroStore instead of panicking, and its housekeeping methods are
// harmless.
func TestZeroStore(t *testing.T) {
	t.Parallel()
	for name, s := range map[string]*memory.Store{"zero": new(memory.Store), "nil": nil} {
		t.Run(name, func(t *testing.T) {
			checkZeroStore(t, s)
		})
	}
}

func checkZeroStore(t *testing.T, s *memory.Store) {
	ctx := context.Background()
	l := sluice.PerSecond(10)
	storetest.Refuses(t, s, memory.ErrZeroStore)
	if _, err := s.Take(ctx, "", l, 1); errors.Is(err, memory.ErrZeroStore) || err == nil {
		t.Errorf("Take with an empty key: err = %v, want the validation error first", err)
	}
	if _, err := s.Peek(ctx, "k", sluice.Limit{}, 1); !errors.Is(err, sluice.ErrInvalidLimit) {
		t.Errorf("Peek with a zero Limit: err = %v, want ErrInvalidLimit first", err)
	}
	if _, err := s.Grant(ctx, "k", l, 1); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Grant: err = %v, want ErrZeroStore", err)
	}
	if _, err := s.Return(ctx, "k", l, sluice.Grant{Granted: 1}, 1); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Return: err = %v, want ErrZeroStore", err)
	}
	if _, _, err := s.Regrant(ctx, "k", l, sluice.Grant{Granted: 1}, 1, 1); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Regrant: err = %v, want ErrZeroStore", err)
	}
	refusesSlots(t, s, sluice.InFlightLimit{Max: 1, Hold: time.Second})
	s.Sweep()
	if got := s.Len(); got != 0 {
		t.Errorf("Len = %d, want 0", got)
	}
	if got := s.HeldKeys(); got != 0 {
		t.Errorf("HeldKeys = %d, want 0", got)
	}
	if err := s.Close(); err != nil {
		t.Errorf("Close = %v", err)
	}
}

// refusesSlots: s, a zero or nil Store, refuses every slot call with
// ErrZeroStore.
func refusesSlots(t *testing.T, s *memory.Store, l sluice.InFlightLimit) {
	t.Helper()
	ctx := context.Background()
	if _, err := s.Acquire(ctx, "k", l, 1, "h"); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Acquire: err = %v, want ErrZeroStore", err)
	}
	if _, err := s.Extend(ctx, "k", l, "h"); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Extend: err = %v, want ErrZeroStore", err)
	}
	if _, err := s.Release(ctx, "k", "h"); !errors.Is(err, memory.ErrZeroStore) {
		t.Errorf("Release: err = %v, want ErrZeroStore", err)
	}
}

// GCRA, the token bucket and the leaky bucket store different things but
// must make the same decisions whenever time moves forward.
func TestBucketsAgree(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, 1))
	clock := storetest.NewClock(storetest.T0)
	s := memory.New(&memory.Options{Clock: clock.Now})
	defer s.Close()
	limits := []sluice.Limit{
		sluice.PerSecond(3).WithBurst(5),
		sluice.PerMinute(100),
		{Rate: 7, Period: 13 * time.Second, Burst: 2},
	}
	for step := range 20000 {
		switch rng.IntN(4) {
		case 0:
		case 1:
			clock.Advance(time.Duration(rng.IntN(1000)) * time.Microsecond)
		case 2:
			clock.Advance(time.Duration(rng.IntN(2000)) * time.Millisecond)
		case 3:
			clock.Advance(time.Duration(rng.IntN(60)) * time.Second)
		}
		li := rng.IntN(len(limits))
		l := limits[li]
		key := fmt.Sprint("k", li, "-", rng.IntN(4)) // one state per (key, limit)
		cost := 1 + rng.Int64N(l.Capacity())
		peek := rng.IntN(5) == 0
		var got [3]sluice.Decision
		for i, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
			var err error
			if peek {
				got[i], err = s.Peek(ctx, key, l.WithAlgorithm(a), cost)
			} else {
				got[i], err = s.Take(ctx, key, l.WithAlgorithm(a), cost)
			}
			if err != nil {
				t.Fatal(err)
			}
			got[i].Limit = sluice.Limit{}
		}
		if got[0] != got[1] || got[0] != got[2] {
			t.Fatalf("seed %d step %d (%v, key %s, cost %d, peek %v):\n gcra  %+v\n token %+v\n leaky %+v",
				seed, step, l, key, cost, peek, got[0], got[1], got[2])
		}
	}
}

func TestMaxKeysBoundsMemory(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := memory.New(&memory.Options{MaxKeys: 1000, Shards: 4, SweepInterval: -1})
	defer s.Close()
	for i := range 100_000 { // a flood of random keys
		if _, err := s.Take(ctx, fmt.Sprint("flood-", i), sluice.PerHour(10), 1); err != nil {
			t.Fatal(err)
		}
	}
	if n := s.Len(); n > 1000 {
		t.Errorf("holding %d keys, want at most 1000", n)
	}
}

// A TakeAll that adds more keys to a full shard than it has room for keeps
// them all: evicting one it has just taken from would forget that take, and
// the next TakeAll on the same keys would be admitted again.
func TestTakeAllKeepsItsOwnKeysWhenFull(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := memory.New(&memory.Options{MaxKeys: 1, Shards: 1, SweepInterval: -1})
	defer s.Close()
	l := sluice.PerHour(1)
	reqs := []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 1}, {Key: "c", Limit: l, Cost: 1}}
	for round := range 3 {
		ds, err := s.TakeAll(ctx, reqs)
		if err != nil {
			t.Fatal(err)
		}
		for i, d := range ds {
			if d.Allowed != (round == 0) {
				t.Fatalf("round %d: %s allowed=%v; want only the first round admitted (1/hour)", round, reqs[i].Key, d.Allowed)
			}
		}
	}
}

// A MaxKeys near math.MaxInt is in effect no bound: rounding it up per
// shard must not overflow into a bound that evicts every key but one per
// shard, which let a key take its unit once per eviction.
func TestMaxKeysMaxInt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, mk := range []int{math.MaxInt, math.MaxInt - 1, math.MaxInt - 62} {
		s := memory.New(&memory.Options{MaxKeys: mk, SweepInterval: -1})
		defer s.Close()
		l := sluice.PerMinute(1)
		admitted := 0
		for range 3 {
			for i := range 1000 {
				d, err := s.Take(ctx, fmt.Sprint("user", i), l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed {
					admitted++
				}
			}
		}
		if admitted != 1000 || s.Len() != 1000 {
			t.Errorf("MaxKeys %d: 1,000 keys × 3 takes under 1/min admitted %d, holding %d keys; want 1000 and 1000", mk, admitted, s.Len())
		}
	}
}

// Shards beyond MaxShards is MaxShards: rounding it up to a power of two
// looped forever (math.MaxInt) or allocated without bound (1<<40).
func TestShardsClamped(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, n := range []int{math.MaxInt, 1 << 40, memory.MaxShards + 1} {
		made := make(chan *memory.Store, 1)
		go func() { made <- memory.New(&memory.Options{Shards: n, SweepInterval: -1}) }()
		select {
		case s := <-made:
			defer s.Close()
			if _, err := s.Take(ctx, "k", sluice.PerMinute(1), 1); err != nil {
				t.Fatalf("Shards %d: %v", n, err)
			}
			if d, _ := s.Take(ctx, "k", sluice.PerMinute(1), 1); d.Allowed {
				t.Errorf("Shards %d: a second take under 1/min was allowed", n)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("Shards %d: New has not returned after 10s", n)
		}
	}
}

func TestSweepRemovesExpiredKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, clock := newClocked(t, memory.Options{})
	for _, a := range sluice.Algorithms() {
		for i := range 10 {
			if _, err := s.Take(ctx, fmt.Sprint("k", i), sluice.PerMinute(5).WithAlgorithm(a), 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := s.Len(); n != 60 {
		t.Fatalf("Len = %d, want 60", n)
	}
	clock.Advance(time.Minute) // everything but the sliding counter is fresh
	s.Sweep()
	if n := s.Len(); n != 10 {
		t.Errorf("after a minute Len = %d, want the 10 sliding-counter keys", n)
	}
	clock.Advance(time.Minute)
	s.Sweep()
	if n := s.Len(); n != 0 {
		t.Errorf("after two minutes Len = %d, want 0", n)
	}
}

func TestSweeperRuns(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	s := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: time.Millisecond})
	defer s.Close()
	s.Take(context.Background(), "k", sluice.PerSecond(1), 1)
	clock.Advance(time.Hour)
	for s.Len() != 0 {
		time.Sleep(time.Millisecond) // the test's own timeout bounds this
	}
}

// The hot path (an existing key) allocates nothing, for every algorithm,
// directly and through a Limiter without a prefix.
func TestHotPathAllocatesNothing(t *testing.T) {
	ctx := context.Background()
	clock := storetest.NewClock(storetest.T0)
	s := memory.New(&memory.Options{Clock: clock.Now})
	defer s.Close()
	for _, a := range sluice.Algorithms() {
		l := sluice.Limit{Algorithm: a, Rate: 1000, Period: time.Hour}
		lim, _ := sluice.NewLimiter(s, l, nil)
		lim.Allow(ctx, "hot")
		if n := testing.AllocsPerRun(200, func() { s.Take(ctx, "hot", l, 1) }); n != 0 {
			t.Errorf("%v: Take allocates %v per call", a, n)
		}
		if n := testing.AllocsPerRun(200, func() { lim.Allow(ctx, "hot") }); n != 0 {
			t.Errorf("%v: Limiter.Allow allocates %v per call", a, n)
		}
		if n := testing.AllocsPerRun(200, func() { s.Peek(ctx, "hot", l, 1) }); n != 0 {
			t.Errorf("%v: Peek allocates %v per call", a, n)
		}
	}
}
