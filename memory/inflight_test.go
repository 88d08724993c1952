package memory_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// A zero Store refuses slots with ErrZeroStore, after validating.
func TestInFlightZeroStore(t *testing.T) {
	t.Parallel()
	var s memory.Store
	ctx := context.Background()
	l := sluice.Concurrent(1, time.Second)
	refusesSlots(t, &s, l)
	if _, err := s.Acquire(ctx, "k", l, 0, "h"); !errors.Is(err, sluice.ErrInvalidWeight) {
		t.Errorf("Acquire with weight 0: err = %v, want the validation error first", err)
	}
}

// Sweep drops the holders of keys nobody touches after their holds end.
func TestInFlightSweep(t *testing.T) {
	t.Parallel()
	s, clock := newClocked(t, memory.Options{})
	ctx := context.Background()
	for _, k := range []string{"a", "b", "c"} {
		if _, err := s.Acquire(ctx, k, sluice.Concurrent(1, time.Second), 1, "h"); err != nil {
			t.Fatal(err)
		}
	}
	clock.Advance(time.Second)
	s.Sweep()
	if got, want := s.HeldKeys(), 0; got != want {
		t.Errorf("after the holds and a sweep, %d keys hold slots, want %d", got, want)
	}
}

// MaxKeys bounds the keys with in-flight state too: at the cap a new key
// takes the place of one without live holders, and is refused with
// ErrFull when the sample finds none; a key with live holders is never
// dropped.
func TestInFlightMaxKeys(t *testing.T) {
	t.Parallel()
	s, clock := newClocked(t, memory.Options{MaxKeys: 4, Shards: 1})
	ctx := context.Background()
	l := sluice.Concurrent(1, 10*time.Second)
	for i := range 4 {
		if d, err := s.Acquire(ctx, fmt.Sprint("k", i), l, 1, "h"); err != nil || !d.Allowed {
			t.Fatalf("Acquire(k%d) = %+v, %v", i, d, err)
		}
	}
	for i := range 100 { // a flood of new keys while every key holds
		if _, err := s.Acquire(ctx, fmt.Sprint("flood", i), l, 1, "h"); !errors.Is(err, memory.ErrFull) {
			t.Fatalf("Acquire(flood%d) at the cap: err = %v, want ErrFull", i, err)
		}
	}
	if got := s.HeldKeys(); got != 4 {
		t.Errorf("%d keys with slots, want 4", got)
	}
	for i := range 4 { // every holder still holds
		if d, err := s.Acquire(ctx, fmt.Sprint("k", i), l, 1, "other"); err != nil || d.Allowed {
			t.Errorf("k%d: Acquire = %+v, %v; want a denial, its holder kept", i, d, err)
		}
	}
	if ok, err := s.Release(ctx, "k0", "h"); err != nil || !ok {
		t.Fatalf("Release(k0) = %v, %v", ok, err)
	}
	if d, err := s.Acquire(ctx, "new", l, 1, "h"); err != nil || !d.Allowed {
		t.Errorf("Acquire(new) beside a released key = %+v, %v; want it to take k0's place", d, err)
	}
	clock.Advance(10 * time.Second) // every hold has ended
	for i := range 4 {
		if d, err := s.Acquire(ctx, fmt.Sprint("later", i), l, 1, "h"); err != nil || !d.Allowed {
			t.Errorf("Acquire(later%d) once the holds ended = %+v, %v", i, d, err)
		}
	}
	if got := s.HeldKeys(); got != 4 {
		t.Errorf("%d keys with slots, want 4", got)
	}
}

// acquireRelease returns a store whose key "busy" has 3 holders, and a
// function that acquires and releases a slot of weight 2 on key.
func acquireRelease(tb testing.TB) func(key string) {
	s, _ := newClocked(tb, memory.Options{})
	ctx := context.Background()
	l := sluice.Concurrent(10, time.Minute)
	for _, h := range []string{"h1", "h2", "h3"} {
		if _, err := s.Acquire(ctx, "busy", l, 1, h); err != nil {
			tb.Fatal(err)
		}
	}
	return func(key string) {
		if d, err := s.Acquire(ctx, key, l, 2, "me"); err != nil || !d.Allowed {
			tb.Fatalf("Acquire = %+v, %v", d, err)
		}
		if ok, err := s.Release(ctx, key, "me"); err != nil || !ok {
			tb.Fatalf("Release = %v, %v", ok, err)
		}
	}
}

// An acquire and release pair on a key the store already has allocates
// nothing, beside other holders or alone.
func TestInFlightPairAllocatesNothing(t *testing.T) {
	pair := acquireRelease(t)
	for _, key := range []string{"busy", "alone"} {
		if allocs := testing.AllocsPerRun(100, func() { pair(key) }); allocs != 0 {
			t.Errorf("%s: %v allocations per pair, want 0", key, allocs)
		}
	}
}

// BenchmarkInFlight measures an Acquire and Release pair beside 3 other
// holders, and on a key of its own.
func BenchmarkInFlight(b *testing.B) {
	pair := acquireRelease(b)
	for _, key := range []string{"busy", "alone"} {
		b.Run(key, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				pair(key)
			}
		})
	}
}

// The sweeper keeps a key whose holders are all gone while it remembers a
// release of one (a repeat is still told released before) or keeps a
// tombstone (the repeat found no holder), and drops it once neither is
// left.
func TestInFlightReleaseOnceSweep(t *testing.T) {
	t.Parallel()
	s, clock := newClocked(t, memory.Options{})
	ctx := context.Background()
	if d, err := s.Acquire(ctx, "k", sluice.Concurrent(1, 10*time.Second), 1, "h"); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	if released, before, err := s.ReleaseOnce(ctx, "k", "h", 5*time.Second); err != nil || !released || before {
		t.Fatalf("ReleaseOnce = %v, %v, %v", released, before, err)
	}
	clock.Advance(4 * time.Second)
	s.Sweep()
	if released, before, err := s.ReleaseOnce(ctx, "k", "h", 5*time.Second); err != nil || !released || !before {
		t.Fatalf("ReleaseOnce after a sweep = %v, %v, %v; want released before", released, before, err)
	}
	if n := s.HeldKeys(); n != 1 {
		t.Errorf("HeldKeys = %d while a release is remembered, want 1", n)
	}
	clock.Advance(5 * time.Second)
	s.Sweep()
	if n := s.HeldKeys(); n != 1 {
		t.Errorf("HeldKeys = %d once no release is remembered, its tombstone live, want 1", n)
	}
	clock.Advance(5 * time.Second) // the tombstone, of the 10s hold from 4s, ends
	s.Sweep()
	if n := s.HeldKeys(); n != 0 {
		t.Errorf("HeldKeys = %d once no release is remembered and no tombstone kept, want 0", n)
	}
	if released, before, err := s.ReleaseOnce(ctx, "k", "h", 5*time.Second); err != nil || released || before {
		t.Errorf("ReleaseOnce once forgotten = %v, %v, %v; want not held", released, before, err)
	}
}
