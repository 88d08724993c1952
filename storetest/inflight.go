package storetest

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// NewSlots returns the in-flight store under test. It must read the time
// from now, and release resources with t.Cleanup.
type NewSlots func(t *testing.T, now func() time.Time) sluice.Slots

type slotOp int

const (
	acquire slotOp = iota
	extend
	release
)

// slotStep is one in-flight call at a time offset from the table's start.
type slotStep struct {
	at     time.Duration
	op     slotOp
	holder string
	weight int64         // acquire; 0 means 1
	hold   time.Duration // acquire and extend; 0 means the table's
	ok     bool          // acquire: Allowed; extend, release: the holder held
	inUse  int64         // acquire only
	retry  time.Duration // acquire only
	// expired is the weight of expired holders the acquire removed.
	expired int64
}

type slotTable struct {
	name  string
	limit sluice.InFlightLimit
	steps []slotStep
}

const second = time.Second

func slotTables() []slotTable {
	return []slotTable{{
		// Denials estimate RetryAfter from the deadlines that free enough
		// weight first; a second release is a no-op.
		name: "weighted", limit: sluice.Concurrent(10, 30*second), steps: []slotStep{
			{at: 0, op: acquire, holder: "a", weight: 3, ok: true, inUse: 3},
			{at: 1 * second, op: acquire, holder: "b", weight: 5, ok: true, inUse: 8},
			{at: 2 * second, op: acquire, holder: "c", weight: 3, inUse: 8, retry: 28 * second},
			{at: 2 * second, op: acquire, holder: "c", weight: 2, ok: true, inUse: 10},
			{at: 3 * second, op: acquire, holder: "d", weight: 1, inUse: 10, retry: 27 * second},
			{at: 4 * second, op: release, holder: "a", ok: true},
			{at: 4 * second, op: release, holder: "a"},
			{at: 5 * second, op: acquire, holder: "d", weight: 3, ok: true, inUse: 10},
			{at: 6 * second, op: acquire, holder: "e", weight: 6, inUse: 10, retry: 26 * second},
			{at: 6 * second, op: acquire, holder: "e", weight: 10, inUse: 10, retry: 29 * second},
		},
	}, {
		// A crashed holder frees its slot exactly at its hold timeout; the
		// next acquire removes it and reports its weight, once. A late
		// release or extend of an expired holder is refused and leaves it.
		name: "expiry", limit: sluice.Concurrent(2, 10*second), steps: []slotStep{
			{at: 0, op: acquire, holder: "a", ok: true, inUse: 1},
			{at: 0, op: acquire, holder: "b", ok: true, inUse: 2},
			{at: 10*second - time.Microsecond, op: acquire, holder: "c", inUse: 2, retry: time.Microsecond},
			{at: 10 * second, op: acquire, holder: "c", ok: true, inUse: 1, expired: 2},
			{at: 10 * second, op: release, holder: "a"},
			{at: 10 * second, op: extend, holder: "b"},
			{at: 10 * second, op: acquire, holder: "d", weight: 1, ok: true, inUse: 2},
			{at: 20 * second, op: release, holder: "c"},
			{at: 20 * second, op: extend, holder: "d"},
			{at: 20 * second, op: acquire, holder: "e", weight: 2, ok: true, inUse: 2, expired: 2},
			{at: 20 * second, op: acquire, holder: "f", inUse: 2, retry: 10 * second},
		},
	}, {
		// Extend moves the deadline to now+hold, only for a live holder.
		name: "extend", limit: sluice.Concurrent(1, 10*second), steps: []slotStep{
			{at: 0, op: acquire, holder: "a", ok: true, inUse: 1},
			{at: 8 * second, op: extend, holder: "a", ok: true},
			{at: 15 * second, op: acquire, holder: "b", inUse: 1, retry: 3 * second},
			{at: 17 * second, op: extend, holder: "a", hold: 2 * second, ok: true},
			{at: 18 * second, op: acquire, holder: "b", inUse: 1, retry: time.Second},
			{at: 19 * second, op: acquire, holder: "b", ok: true, inUse: 1, expired: 1},
			{at: 19 * second, op: extend, holder: "a"},
			{at: 19 * second, op: release, holder: "a"},
		},
	}, {
		// A resent acquire refreshes the hold and counts once, with its
		// first weight.
		name: "resend", limit: sluice.Concurrent(3, 10*second), steps: []slotStep{
			{at: 0, op: acquire, holder: "a", weight: 2, ok: true, inUse: 2},
			{at: 1 * second, op: acquire, holder: "a", weight: 2, ok: true, inUse: 2},
			{at: 1 * second, op: acquire, holder: "a", weight: 3, ok: true, inUse: 2},
			{at: 1 * second, op: acquire, holder: "b", weight: 2, inUse: 2, retry: 10 * second},
			{at: 1 * second, op: acquire, holder: "b", ok: true, inUse: 3},
			{at: 10*second + second/2, op: acquire, holder: "c", inUse: 3, retry: second / 2},
			{at: 11 * second, op: acquire, holder: "c", weight: 3, ok: true, inUse: 3, expired: 3},
		},
	}, {
		// An unknown or forged holder frees and extends nothing.
		name: "forged", limit: sluice.Concurrent(1, 10*second), steps: []slotStep{
			{at: 0, op: acquire, holder: "a", ok: true, inUse: 1},
			{at: 1 * second, op: release, holder: "forged"},
			{at: 1 * second, op: extend, holder: "forged"},
			{at: 1 * second, op: release, holder: "A"},
			{at: 2 * second, op: acquire, holder: "b", inUse: 1, retry: 8 * second},
			{at: 3 * second, op: release, holder: "a", ok: true},
			{at: 3 * second, op: acquire, holder: "b", ok: true, inUse: 1},
		},
	}, {
		// A release that finds no holder leaves a tombstone of its id,
		// living the longest hold the store has acquired with (10s here):
		// that id's acquire is refused (RetryAfter 0, nothing held) and
		// removes it, so that an acquire that ran after its abandoned
		// release holds nothing. Other ids are not refused.
		name: "tombstone", limit: sluice.Concurrent(2, 10*second), steps: []slotStep{
			{at: 0, op: acquire, holder: "a", ok: true, inUse: 1},
			{at: 1 * second, op: release, holder: "late"},
			{at: 1 * second, op: acquire, holder: "late", inUse: 1},
			{at: 1 * second, op: acquire, holder: "b", ok: true, inUse: 2},
			{at: 1 * second, op: acquire, holder: "late", inUse: 2, retry: 9 * second},
			{at: 2 * second, op: release, holder: "a", ok: true},
			{at: 2 * second, op: release, holder: "b", ok: true},
			{at: 3 * second, op: release, holder: "c"},
			{at: 3 * second, op: release, holder: "d"},
			{at: 3 * second, op: acquire, holder: "x", weight: 2, ok: true, inUse: 2},
			{at: 4 * second, op: release, holder: "x", ok: true},
			{at: 4 * second, op: extend, holder: "c"},
			{at: 13*second - time.Microsecond, op: acquire, holder: "c", weight: 2, inUse: 0},
			{at: 13 * second, op: acquire, holder: "d", weight: 2, ok: true, inUse: 2},
		},
	}, {
		// An expired holder's release leaves a tombstone too: the id,
		// resent, is refused.
		name: "tombstone_expired", limit: sluice.Concurrent(1, 10*second), steps: []slotStep{
			{at: 0, op: acquire, holder: "a", ok: true, inUse: 1},
			{at: 10 * second, op: release, holder: "a"},
			{at: 11 * second, op: acquire, holder: "a", inUse: 0, expired: 1},
			{at: 11 * second, op: acquire, holder: "b", ok: true, inUse: 1},
		},
	}, {
		// Each acquire holds for its own limit's Hold.
		name: "mixed_holds", limit: sluice.Concurrent(2, 10*second), steps: []slotStep{
			{at: 0, op: acquire, holder: "a", hold: 5 * second, ok: true, inUse: 1},
			{at: 1 * second, op: acquire, holder: "b", hold: 20 * second, ok: true, inUse: 2},
			{at: 2 * second, op: acquire, holder: "c", inUse: 2, retry: 3 * second},
			{at: 5 * second, op: acquire, holder: "c", ok: true, inUse: 2, expired: 1},
			{at: 21 * second, op: acquire, holder: "d", ok: true, inUse: 1, expired: 2},
		},
	}}
}

// RunInFlight runs the in-flight conformance suite against the stores
// newSlots returns.
func RunInFlight(t *testing.T, newSlots NewSlots) {
	t.Run("tables", func(t *testing.T) {
		for _, tb := range slotTables() {
			t.Run(tb.name, func(t *testing.T) {
				t.Parallel()
				runSlotTable(t, newSlots, tb)
			})
		}
	})
	t.Run("bad_input", func(t *testing.T) { t.Parallel(); testSlotBadInput(t, newSlots) })
	t.Run("concurrent", func(t *testing.T) { t.Parallel(); testSlotConcurrent(t, newSlots) })
	t.Run("handle", func(t *testing.T) { t.Parallel(); testSlotHandle(t, newSlots) })
	t.Run("independence", func(t *testing.T) { t.Parallel(); testSlotIndependence(t, newSlots) })
	t.Run("release_once", func(t *testing.T) { t.Parallel(); testSlotReleaseOnce(t, newSlots) })
	t.Run("release_once_racing", func(t *testing.T) { t.Parallel(); testSlotReleaseOnceRacing(t, newSlots) })
	t.Run("tombstones_bounded", func(t *testing.T) { t.Parallel(); testSlotTombstonesBounded(t, newSlots) })
	t.Run("tombstones_others", func(t *testing.T) { t.Parallel(); testSlotTombstonesOthers(t, newSlots) })
}

// A key keeps at most 1024 live tombstones: beyond them, the one ending
// first goes (its id's acquire is admitted); the others still refuse.
// ReleaseOnce leaves them as Release does.
func testSlotTombstonesBounded(t *testing.T, newSlots NewSlots) {
	clock, st, key := slotSetup(t, newSlots)
	ctx := context.Background()
	l := sluice.Concurrent(3, 10*second)
	if d, err := st.Acquire(ctx, key, l, 1, "a"); err != nil || !d.Allowed {
		t.Fatalf("Acquire(a) = %+v, %v", d, err)
	}
	r, once := st.(onceReleaser)
	const n = 1025
	for i := range n {
		clock.Advance(time.Microsecond)
		h := fmt.Sprintf("t%04d", i)
		var held bool
		var err error
		if once && i%2 == 1 {
			held, _, err = r.ReleaseOnce(ctx, key, h, second)
		} else {
			held, err = st.Release(ctx, key, h)
		}
		if err != nil || held {
			t.Fatalf("Release(%s) = %v, %v; want not held", h, held, err)
		}
	}
	for _, c := range []struct {
		holder  string
		allowed bool
	}{{"t0000", true}, {"t0001", false}, {fmt.Sprintf("t%04d", n-1), false}} {
		d, err := st.Acquire(ctx, key, l, 1, c.holder)
		if err != nil || d.Allowed != c.allowed {
			t.Errorf("after %d tombstones, Acquire(%s) = %+v, %v; want allowed %v", n, c.holder, d, err, c.allowed)
		}
	}
}

// A tombstone refuses its own id alone: releases of forged ids, and of
// ids a byte away from another's, never refuse the acquires of fresh ids
// (AcquireSlot's, 128 random bits each), nor of those others.
func testSlotTombstonesOthers(t *testing.T, newSlots NewSlots) {
	_, st, key := slotSetup(t, newSlots)
	ctx := context.Background()
	l := sluice.Concurrent(64, 10*second)
	if d, err := st.Acquire(ctx, key, l, 1, "first"); err != nil || !d.Allowed {
		t.Fatalf("Acquire(first) = %+v, %v", d, err)
	}
	for _, h := range []string{"Ab", "ab ", "a", "b", "hab", "Hab", "wab", "xab", "X", "n", "t"} {
		if ok, err := st.Release(ctx, key, h); err != nil || ok {
			t.Fatalf("Release(%q) = %v, %v; want not held", h, ok, err)
		}
	}
	for _, h := range []string{"ab", "bX", "xa"} {
		if d, err := st.Acquire(ctx, key, l, 2, h); err != nil || !d.Allowed {
			t.Errorf("beside others' tombstones, Acquire(%q) = %+v, %v; want allowed", h, d, err)
		}
	}
	for range 16 {
		if ok, err := st.Release(ctx, key, sluice.NewHolderID()); err != nil || ok {
			t.Fatalf("Release of a forged id = %v, %v; want not held", ok, err)
		}
		s, d, err := sluice.AcquireSlot(ctx, st, key, l, 1)
		if err != nil || s == nil {
			t.Fatalf("AcquireSlot beside forged tombstones = %v, %+v, %v; want allowed", s, d, err)
		}
	}
}

// onceReleaser is a store that remembers a release with it
// (redisstore.Store.ReleaseOnce and its twins).
type onceReleaser interface {
	ReleaseOnce(ctx context.Context, key, holder string, remember time.Duration) (released, before bool, err error)
}

// onceSetup is slotSetup for a store with ReleaseOnce; it skips others.
func onceSetup(t *testing.T, newSlots NewSlots) (*Clock, sluice.Slots, onceReleaser, string) {
	clock, st, key := slotSetup(t, newSlots)
	r, ok := st.(onceReleaser)
	if !ok {
		t.Skipf("%T has no ReleaseOnce", st)
	}
	return clock, st, r, key
}

// ReleaseOnce frees a slot and remembers its release for the time asked:
// sent again within it, it reports the slot released before (and
// remembers it again from now); after it, for a holder never held, or
// for one whose hold ran out, not held. Bad input is a typed error.
func testSlotReleaseOnce(t *testing.T, newSlots NewSlots) {
	clock, st, r, key := onceSetup(t, newSlots)
	ctx := context.Background()
	l := sluice.Concurrent(3, 10*second)
	release := func(h string, released, before bool) {
		t.Helper()
		got, b, err := r.ReleaseOnce(ctx, key, h, 5*second)
		if err != nil || got != released || b != before {
			t.Fatalf("ReleaseOnce(%s) = %v, %v, %v; want %v, %v", h, got, b, err, released, before)
		}
	}
	for _, h := range []string{"a", "b"} {
		if d, err := st.Acquire(ctx, key, l, 1, h); err != nil || !d.Allowed {
			t.Fatalf("Acquire(%s) = %+v, %v", h, d, err)
		}
	}
	release("a", true, false)
	release("a", true, true)
	if d, err := st.Acquire(ctx, key, l, 2, "w"); err != nil || !d.Allowed || d.InUse != 3 {
		t.Fatalf("a released, Acquire(w, 2) = %+v, %v; want allowed, 3 in use", d, err)
	}
	release("w", true, false)
	clock.Advance(4 * second)
	release("a", true, true) // remembered again from now
	clock.Advance(4 * second)
	release("a", true, true)
	clock.Advance(5 * second)
	release("a", false, false) // forgotten
	release("never", false, false)
	release("b", false, false) // its hold ran out: expired, not released
	if ok, err := st.Release(ctx, key, "w"); err != nil || ok {
		t.Errorf("Release of a holder ReleaseOnce freed = %v, %v; want false", ok, err)
	}
	for _, c := range []struct {
		key, holder string
		remember    time.Duration
		want        error
	}{{key, "a", 0, sluice.ErrInvalidLimit}, {"", "a", second, sluice.ErrInvalidKey}, {key, "", second, sluice.ErrInvalidHolder}} {
		if _, _, err := r.ReleaseOnce(ctx, c.key, c.holder, c.remember); !errors.Is(err, c.want) {
			t.Errorf("ReleaseOnce(%q, %q, %v) = %v, want %v", c.key, c.holder, c.remember, err, c.want)
		}
	}
}

// Releases of one holder racing each other all report it released, one
// of them now: the release and its record are one step.
func testSlotReleaseOnceRacing(t *testing.T, newSlots NewSlots) {
	_, st, r, key := onceSetup(t, newSlots)
	ctx := context.Background()
	l := sluice.Concurrent(1, 10*second)
	for round := range 20 {
		h := fmt.Sprintf("h%d", round)
		if d, err := st.Acquire(ctx, key, l, 1, h); err != nil || !d.Allowed {
			t.Fatalf("Acquire(%s) = %+v, %v", h, d, err)
		}
		var now, before atomic.Int64
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				released, b, err := r.ReleaseOnce(ctx, key, h, 10*second)
				switch {
				case err != nil || !released:
					t.Errorf("ReleaseOnce(%s) racing = %v, %v, %v; want released", h, released, b, err)
				case b:
					before.Add(1)
				default:
					now.Add(1)
				}
			})
		}
		wg.Wait()
		if now.Load() != 1 || before.Load() != 3 {
			t.Fatalf("round %d: %d released now, %d before; want 1 and 3", round, now.Load(), before.Load())
		}
	}
}

// runInFlightOf runs RunInFlight on newStore's stores if they keep slots
// (Run calls it).
func runInFlightOf(t *testing.T, newStore NewStore) {
	if _, ok := newStore(t, NewClock(T0).Now).(sluice.Slots); !ok {
		t.Log("the store keeps no in-flight slots")
		return
	}
	RunInFlight(t, func(t *testing.T, now func() time.Time) sluice.Slots {
		return newStore(t, now).(sluice.Slots)
	})
}

// slotSetup returns a clock at T0, a store on it and a key of the test's
// own.
func slotSetup(t *testing.T, newSlots NewSlots) (*Clock, sluice.Slots, string) {
	clock := NewClock(T0)
	return clock, newSlots(t, clock.Now), uniqueKey(t, "slots")
}

func runSlotTable(t *testing.T, newSlots NewSlots, tb slotTable) {
	clock, st, key := slotSetup(t, newSlots)
	for i, step := range tb.steps {
		clock.Set(T0.Add(step.at))
		l := tb.limit
		if step.hold != 0 {
			l.Hold = step.hold
		}
		got, err := doSlotStep(st, key, l, step)
		if err != nil {
			t.Fatalf("step %d (%v %s): %v", i, step.at, step.holder, err)
		}
		want := slotStepResult(l, step)
		if got != want {
			t.Errorf("step %d (%v %s): got %s, want %s", i, step.at, step.holder, got, want)
		}
	}
}

// doSlotStep runs step and formats what it returned, as slotStepResult
// formats what it should return.
func doSlotStep(st sluice.Slots, key string, l sluice.InFlightLimit, step slotStep) (string, error) {
	ctx := context.Background()
	switch step.op {
	case acquire:
		d, err := st.Acquire(ctx, key, l, max(step.weight, 1), step.holder)
		return fmt.Sprintf("acquire %+v", d), err
	case extend:
		ok, err := st.Extend(ctx, key, l, step.holder)
		return fmt.Sprintf("extend %v", ok), err
	default:
		ok, err := st.Release(ctx, key, step.holder)
		return fmt.Sprintf("release %v", ok), err
	}
}

func slotStepResult(l sluice.InFlightLimit, step slotStep) string {
	switch step.op {
	case acquire:
		return fmt.Sprintf("acquire %+v", sluice.SlotDecision{Allowed: step.ok, Limit: l, InUse: step.inUse,
			Remaining: max(l.Max-step.inUse, 0), RetryAfter: step.retry, Expired: step.expired})
	case extend:
		return fmt.Sprintf("extend %v", step.ok)
	default:
		return fmt.Sprintf("release %v", step.ok)
	}
}

// Bad input is a typed error and changes nothing: the holder acquired
// first still holds, and nothing more is held.
func testSlotBadInput(t *testing.T, newSlots NewSlots) {
	_, st, key := slotSetup(t, newSlots)
	ctx := context.Background()
	l := sluice.Concurrent(2, 10*second)
	if d, err := st.Acquire(ctx, key, l, 1, "a"); err != nil || !d.Allowed {
		t.Fatalf("Acquire = %+v, %v", d, err)
	}
	long := strings.Repeat("h", sluice.MaxHolderLen+1)
	for _, c := range []struct {
		name   string
		key    string
		limit  sluice.InFlightLimit
		weight int64
		holder string
		want   error
	}{
		{"max_zero", key, sluice.Concurrent(0, second), 1, "x", sluice.ErrInvalidLimit},
		{"max_negative", key, sluice.Concurrent(-1, second), 1, "x", sluice.ErrInvalidLimit},
		{"max_too_big", key, sluice.Concurrent(sluice.MaxInFlight+1, second), 1, "x", sluice.ErrInvalidLimit},
		{"hold_zero", key, sluice.Concurrent(2, 0), 1, "x", sluice.ErrInvalidLimit},
		{"hold_negative", key, sluice.Concurrent(2, -second), 1, "x", sluice.ErrInvalidLimit},
		{"hold_below_1us", key, sluice.Concurrent(2, time.Nanosecond), 1, "x", sluice.ErrInvalidLimit},
		{"hold_too_long", key, sluice.Concurrent(2, sluice.MaxHold+time.Microsecond), 1, "x", sluice.ErrInvalidLimit},
		{"weight_zero", key, l, 0, "x", sluice.ErrInvalidWeight},
		{"weight_negative", key, l, -1, "x", sluice.ErrInvalidWeight},
		{"weight_above_max", key, l, 3, "x", sluice.ErrInvalidWeight},
		{"holder_empty", key, l, 1, "", sluice.ErrInvalidHolder},
		{"holder_too_long", key, l, 1, long, sluice.ErrInvalidHolder},
		{"key_empty", "", l, 1, "x", sluice.ErrInvalidKey},
	} {
		if _, err := st.Acquire(ctx, c.key, c.limit, c.weight, c.holder); !errors.Is(err, c.want) {
			t.Errorf("%s: Acquire err = %v, want %v", c.name, err, c.want)
		}
		if c.weight == 1 { // Extend has no weight to get wrong
			if _, err := st.Extend(ctx, c.key, c.limit, c.holder); !errors.Is(err, c.want) {
				t.Errorf("%s: Extend err = %v, want %v", c.name, err, c.want)
			}
		}
	}
	for _, c := range []struct {
		key, holder string
		want        error
	}{{key, "", sluice.ErrInvalidHolder}, {key, long, sluice.ErrInvalidHolder}, {"", "a", sluice.ErrInvalidKey}} {
		if _, err := st.Release(ctx, c.key, c.holder); !errors.Is(err, c.want) {
			t.Errorf("Release(%q, %d-byte holder) err = %v, want %v", c.key, len(c.holder), err, c.want)
		}
	}
	d, err := st.Acquire(ctx, key, l, 1, "a") // a resend: reports what is held
	if err != nil || !d.Allowed || d.InUse != 1 {
		t.Errorf("after bad input: Acquire(a) = %+v, %v; want allowed, 1 in use", d, err)
	}
}

// Many goroutines acquiring at once: exactly Max are admitted, and a
// full release frees everything.
func testSlotConcurrent(t *testing.T, newSlots NewSlots) {
	st := newSlots(t, NewClock(T0).Now)
	ctx := context.Background()
	key := uniqueKey(t, "slots")
	const n, limit = 64, 10
	l := sluice.Concurrent(limit, time.Minute)
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		holders []string
		over    atomic.Int64
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h := fmt.Sprintf("h%d", i)
			d, err := st.Acquire(ctx, key, l, 1, h)
			if err != nil {
				t.Error(err)
				return
			}
			if d.InUse > limit {
				over.Add(1)
			}
			if d.Allowed {
				mu.Lock()
				holders = append(holders, h)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if got := len(holders); got != limit {
		t.Errorf("%d admitted, want %d", got, limit)
	}
	if over.Load() > 0 {
		t.Errorf("%d decisions reported more than %d in use", over.Load(), limit)
	}
	for _, h := range holders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if ok, err := st.Release(ctx, key, h); err != nil || !ok {
				t.Errorf("Release(%s) = %v, %v", h, ok, err)
			}
		}()
	}
	wg.Wait()
	if d, err := st.Acquire(ctx, key, l, limit, "all"); err != nil || !d.Allowed {
		t.Errorf("after releasing all: Acquire(weight %d) = %+v, %v", limit, d, err)
	}
}

// The Slot handle: Release is idempotent and safe from many goroutines;
// Extend of a released or expired slot is ErrSlotLost.
func testSlotHandle(t *testing.T, newSlots NewSlots) {
	clock, st, key := slotSetup(t, newSlots)
	ctx := context.Background()
	l := sluice.Concurrent(3, 10*second)
	a, d, err := sluice.AcquireSlot(ctx, st, key, l, 2)
	if err != nil || a == nil || !d.Allowed || d.InUse != 2 {
		t.Fatalf("AcquireSlot = %v, %+v, %v", a, d, err)
	}
	if got := len(a.Holder()); got != 32 {
		t.Errorf("holder id of %d bytes, want 32 (128 random bits in hex)", got)
	}
	b, d, err := sluice.AcquireSlot(ctx, st, key, l, 2)
	if err != nil || b != nil || d.Allowed {
		t.Fatalf("AcquireSlot over the limit = %v, %+v, %v; want a nil Slot and a denial", b, d, err)
	}
	clock.Advance(9 * second)
	if err := a.Extend(ctx); err != nil {
		t.Fatalf("Extend: %v", err)
	}
	clock.Advance(9 * second) // past the first hold, inside the extended one
	c, _, err := sluice.AcquireSlot(ctx, st, key, l, 1)
	if err != nil || c == nil {
		t.Fatalf("AcquireSlot beside the extended slot = %v, %v", c, err)
	}
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if err := a.Extend(ctx); !errors.Is(err, sluice.ErrSlotLost) {
		t.Errorf("Extend after Release = %v, want ErrSlotLost", err)
	}
	// c holds 1: a's 2 are free again, and only once.
	if d, err := st.Acquire(ctx, key, l, 2, "x"); err != nil || !d.Allowed || d.InUse != 3 {
		t.Errorf("after Release: Acquire(2) = %+v, %v; want allowed, 3 in use", d, err)
	}
	clock.Advance(10 * second) // c's hold runs out
	if err := c.Extend(ctx); !errors.Is(err, sluice.ErrSlotLost) {
		t.Errorf("Extend after the hold = %v, want ErrSlotLost", err)
	}
	if err := c.Release(ctx); err != nil {
		t.Errorf("Release after the hold = %v, want nil", err)
	}
	var zero sluice.Slot
	if err := zero.Release(ctx); err != nil {
		t.Errorf("zero Slot: Release = %v", err)
	}
	if err := zero.Extend(ctx); !errors.Is(err, sluice.ErrSlotLost) {
		t.Errorf("zero Slot: Extend = %v, want ErrSlotLost", err)
	}
}

// Keys' slots are independent of each other and of the keys' rate limits.
func testSlotIndependence(t *testing.T, newSlots NewSlots) {
	st := newSlots(t, NewClock(T0).Now)
	ctx := context.Background()
	k1, k2 := uniqueKey(t, "one"), uniqueKey(t, "two")
	l := sluice.Concurrent(1, 10*second)
	for _, k := range []string{k1, k2} {
		if d, err := st.Acquire(ctx, k, l, 1, "a"); err != nil || !d.Allowed || d.InUse != 1 {
			t.Errorf("Acquire(%s) = %+v, %v", k, d, err)
		}
	}
	if ok, err := st.Release(ctx, k1, "a"); err != nil || !ok {
		t.Errorf("Release(k1) = %v, %v", ok, err)
	}
	if d, err := st.Acquire(ctx, k2, l, 1, "b"); err != nil || d.Allowed {
		t.Errorf("k2 after releasing k1: Acquire = %+v, %v; want a denial", d, err)
	}
	rs, ok := st.(sluice.Store)
	if !ok {
		return
	}
	for _, a := range sluice.Algorithms() {
		lim := sluice.PerMinute(1).WithAlgorithm(a)
		if d, err := rs.Take(ctx, k2, lim, 1); err != nil || !d.Allowed {
			t.Errorf("%v: Take on a key with full slots = %+v, %v", a, d, err)
		}
	}
	if d, err := st.Acquire(ctx, k1, l, 1, "c"); err != nil || !d.Allowed {
		t.Errorf("Acquire on a key with spent rate limits = %+v, %v", d, err)
	}
}
