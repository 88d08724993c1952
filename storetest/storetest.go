// Package storetest is the conformance suite every sluice.Store passes.
//
// The suite drives a store through step tables taken from the design
// articles' own examples, with a fake clock, then checks the properties the
// Store contract promises: exact RetryAfter and ResetAfter, weighted costs,
// Peek, Reset, typed errors that change nothing, independence of keys and
// algorithms, exact admission under concurrency, all-or-nothing TakeAll,
// and decisions within bounds on state another limit wrote.
//
// Stores that keep in-flight slots (sluice.Slots) run RunInFlight too.
//
// A store's test calls Run with a constructor:
//
//	func TestConformance(t *testing.T) {
//		storetest.Run(t, func(t *testing.T, now func() time.Time) sluice.Store {
//			return memory.New(&memory.Options{Clock: now})
//		})
//	}
package storetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/nilctx"
)

// NewStore returns the store under test. It must read the time from now,
// and release resources with t.Cleanup.
type NewStore func(t *testing.T, now func() time.Time) sluice.Store

// T0 is where the fake clock starts: midnight UTC, so minute, hour and
// ten-second windows all begin exactly there.
var T0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// noCheck in a step skips the ResetAfter comparison.
const noCheck = time.Duration(-1)

type op int

const (
	take op = iota
	peek
	reset
)

// step is one call at a time offset from the table's start.
type step struct {
	at        time.Duration
	op        op
	cost      int64 // 0 means 1
	allowed   bool
	remaining int64
	retry     time.Duration
	resetAft  time.Duration // noCheck to skip
}

type table struct {
	name   string
	limit  sluice.Limit
	start  time.Time // zero means T0
	steps  []step
	source string // where the example comes from
}

var keySeq atomic.Int64

// uniqueKey returns a key no other test (or earlier run on a shared server)
// uses.
func uniqueKey(t *testing.T, name string) string {
	return fmt.Sprintf("storetest:%d:%d:%d:%s:%s", os.Getpid(), time.Now().UnixNano(), keySeq.Add(1), t.Name(), name)
}

// storeSetup returns a clock at T0, a store on it and a key of the test's
// own.
func storeSetup(t *testing.T, newStore NewStore, name string) (*Clock, sluice.Store, string) {
	clock := NewClock(T0)
	return clock, newStore(t, clock.Now), uniqueKey(t, name)
}

// Run runs the conformance suite against the stores newStore returns.
func Run(t *testing.T, newStore NewStore) {
	t.Run("tables", func(t *testing.T) {
		for _, tb := range tables() {
			t.Run(tb.name, func(t *testing.T) {
				t.Parallel()
				runTable(t, newStore, tb)
			})
		}
	})
	t.Run("boundary", func(t *testing.T) { testBoundary(t, newStore) })
	t.Run("seed004_150_files", func(t *testing.T) { testFiles150(t, newStore) })
	t.Run("retry_after_extreme", func(t *testing.T) { testRetryAfterExtreme(t, newStore) })
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			testProperties(t, newStore, a)
		})
	}
	t.Run("limit_change", func(t *testing.T) {
		for _, a := range sluice.Algorithms() {
			t.Run(a.String(), func(t *testing.T) {
				t.Parallel()
				testLimitChange(t, newStore, a)
			})
		}
	})
	t.Run("bad_input", func(t *testing.T) { testBadInput(t, newStore) })
	t.Run("independence", func(t *testing.T) { testIndependence(t, newStore) })
	t.Run("ended_context", func(t *testing.T) { testEndedContext(t, newStore) })
	t.Run("nil_context", func(t *testing.T) { testNilContext(t, newStore) })
	t.Run("take_all", func(t *testing.T) { testTakeAll(t, newStore) })
	t.Run("inflight", func(t *testing.T) { runInFlightOf(t, newStore) })
}

func runTable(t *testing.T, newStore NewStore, tb table) {
	start := tb.start
	if start.IsZero() {
		start = T0
	}
	clock := NewClock(start)
	s := newStore(t, clock.Now)
	key := uniqueKey(t, "k")
	ctx := context.Background()
	for i, st := range tb.steps {
		clock.Set(start.Add(st.at))
		cost := st.cost
		if cost == 0 {
			cost = 1
		}
		var (
			d   sluice.Decision
			err error
		)
		switch st.op {
		case take:
			d, err = s.Take(ctx, key, tb.limit, cost)
		case peek:
			d, err = s.Peek(ctx, key, tb.limit, cost)
		case reset:
			if err := s.Reset(ctx, key, tb.limit); err != nil {
				t.Fatalf("step %d: Reset: %v", i, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("step %d (at %v, cost %d): %v", i, st.at, cost, err)
		}
		checkDecision(t, fmt.Sprintf("%s step %d (%s at +%v, cost %d)", tb.limit, i, []string{"take", "peek"}[st.op], st.at, cost), d, st)
	}
}

func checkDecision(t *testing.T, where string, d sluice.Decision, want step) {
	t.Helper()
	if d.Allowed != want.allowed || d.Remaining != want.remaining || d.RetryAfter != want.retry ||
		(want.resetAft != noCheck && d.ResetAfter != want.resetAft) {
		t.Errorf("%s:\n got allowed=%v remaining=%d retry=%v reset=%v\nwant allowed=%v remaining=%d retry=%v reset=%v",
			where, d.Allowed, d.Remaining, d.RetryAfter, d.ResetAfter,
			want.allowed, want.remaining, want.retry, want.resetAft)
	}
}

func sec(f float64) time.Duration { return time.Duration(f * float64(time.Second)) }

const us = time.Microsecond

func must(l sluice.Limit, err error) sluice.Limit {
	if err != nil {
		panic(err)
	}
	return l
}

func allow(at time.Duration, cost, remaining int64, resetAft time.Duration) step {
	return step{at: at, cost: cost, allowed: true, remaining: remaining, resetAft: resetAft}
}

func deny(at time.Duration, cost, remaining int64, retry, resetAft time.Duration) step {
	return step{at: at, cost: cost, remaining: remaining, retry: retry, resetAft: resetAft}
}

// tables are the worked examples, each a walk a reader can check by hand.
func tables() []table {
	var out []table
	// Seed 001: window 1 min, at most 3. R1..R3 fit; at R4 R1 has left the
	// window; R6 finds R3, R4, R5 in it and is rejected until R3 leaves.
	out = append(out, table{
		name: "seed001_R1_to_R6", limit: must(sluice.ParseLimit("sliding_window_log 3/min")),
		source: "seed 001, sliding window walk-through",
		steps: []step{
			allow(0, 1, 2, 60*time.Second),                             // R1
			allow(10*time.Second, 1, 1, 60*time.Second),                // R2
			allow(30*time.Second, 1, 0, 60*time.Second),                // R3
			allow(65*time.Second, 1, 0, 60*time.Second),                // R4: R1 gone
			allow(75*time.Second, 1, 0, 60*time.Second),                // R5: R2 gone
			deny(80*time.Second, 1, 0, 10*time.Second, 55*time.Second), // R6: R3 leaves at 90s
			deny(90*time.Second-us, 1, 0, us, 45*time.Second+us),
			allow(90*time.Second, 1, 0, 60*time.Second),
		},
	})
	// Seed 004: 60 per minute, fixed window; at 15:14:35.474017 the minute
	// bucket is 15:14:00, the 5th call leaves 55 and the reset is 15:15:00.
	out = append(out, table{
		name: "seed004_fixed_window_headers", limit: must(sluice.ParseLimit("fixed_window 60/min")),
		start: time.Unix(1686323640, 0), source: "seed 004, GitHub-style headers",
		steps: []step{
			allow(sec(35.474017), 4, 56, sec(24.525983)),
			allow(sec(35.474017), 1, 55, sec(24.525983)), // the 5th call
			allow(sec(35.474017), 55, 0, sec(24.525983)),
			deny(sec(35.474017), 1, 0, sec(24.525983), sec(24.525983)), // Retry-After 24 (floored in the seed)
			allow(60*time.Second, 1, 59, 60*time.Second),               // the next minute
		},
	})
	// A caller whose clock is behind the window already stored (another
	// host's clock, or Redis's TIME after a failover) is charged in that
	// newer window: an older window never replaces it, which would admit
	// its whole rate again. Times stay the caller's.
	ms := time.Millisecond
	out = append(out, table{
		name: "fixed_window_older_clock", limit: must(sluice.ParseLimit("fixed_window 2/min")),
		source: "clock skew across a window boundary",
		steps: []step{
			allow(60*time.Second, 1, 1, 60*time.Second),
			allow(60*time.Second-2*ms, 1, 0, 60*time.Second+2*ms),
			deny(60*time.Second-2*ms, 1, 0, 60*time.Second+2*ms, 60*time.Second+2*ms),
			deny(60*time.Second, 1, 0, 60*time.Second, 60*time.Second),
			allow(120*time.Second, 1, 1, 60*time.Second),
		},
	})
	out = append(out, table{
		name: "sliding_window_counter_older_clock", limit: must(sluice.ParseLimit("sliding_window_counter 2/min")),
		source: "clock skew across a window boundary",
		steps: []step{
			allow(60*time.Second, 1, 1, 120*time.Second),
			allow(60*time.Second-2*ms, 1, 0, 120*time.Second+2*ms),
			deny(60*time.Second-2*ms, 1, 0, 90*time.Second+2*ms, 120*time.Second+2*ms),
			deny(60*time.Second, 1, 0, 90*time.Second, 120*time.Second),
			allow(150*time.Second, 1, 0, 90*time.Second),
		},
	})
	// How far behind it may be: a stored window up to 1 + MaxClockSkew/
	// Period windows ahead of the caller's (here 1 + 6) is a lagging clock
	// (a lag of MaxClockSkew is always one); further ahead, it counts
	// windows of another Period (a reloaded limit) and the key is fresh in
	// the caller's window.
	for _, tb := range []struct {
		a                      sluice.Algorithm
		lagReset, lagRetry     time.Duration
		freshReset, freshRetry time.Duration
	}{
		{sluice.FixedWindow, 10 * time.Second, 10 * time.Second, 1 * time.Second, 1 * time.Second},
		{sluice.SlidingWindowCounter, 20 * time.Second, 15 * time.Second, 11 * time.Second, 6 * time.Second},
	} {
		lag := sluice.MaxClockSkew
		out = append(out, table{
			name: tb.a.String() + "_lagging_clock_bound", limit: sluice.Limit{Algorithm: tb.a, Rate: 2, Period: 10 * time.Second},
			source: "clock skew up to MaxClockSkew, and a window further ahead",
			steps: []step{
				allow(1000*time.Second, 1, 1, tb.lagReset),
				allow(1000*time.Second-lag, 1, 0, tb.lagReset+lag),
				deny(1000*time.Second-lag, 1, 0, tb.lagRetry+lag, tb.lagReset+lag),
				deny(930*time.Second, 1, 0, tb.lagRetry+70*time.Second, tb.lagReset+70*time.Second), // window 93: 7 behind
				allow(929*time.Second, 1, 1, tb.freshReset),                                         // window 92: 8 behind
				allow(929*time.Second, 1, 0, tb.freshReset),
				deny(929*time.Second, 1, 0, tb.freshRetry, tb.freshReset),
			},
		})
	}
	// GCRA's TAT up to span + MaxClockSkew ahead of the caller is a lagging
	// clock's, charged as at that TAT; further, another limit wrote it
	// (a longer span) and the key is fresh.
	out = append(out, table{
		name: "gcra_lagging_clock_bound", limit: sluice.PerSecond(1),
		source: "clock skew up to MaxClockSkew, and a TAT further ahead",
		steps: []step{
			allow(1000*time.Second, 1, 0, time.Second), // TAT 1001s
			deny(1000*time.Second-sluice.MaxClockSkew, 1, 0, 61*time.Second, 61*time.Second),
			allow(1000*time.Second-sluice.MaxClockSkew-us, 1, 0, time.Second),
		},
	})
	// The Decision doc example: 10/min, take 4, then ask for 7.
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
		out = append(out, table{
			name: "decision_doc_" + a.String(), limit: sluice.PerMinute(10).WithAlgorithm(a), source: "Decision's doc comment",
			steps: []step{
				allow(0, 4, 6, 24*time.Second),
				deny(0, 7, 6, 6*time.Second, 24*time.Second),
				{at: 0, op: peek, cost: 6, allowed: true, remaining: 6, resetAft: 24 * time.Second},
				allow(6*time.Second, 7, 0, 60*time.Second),
				deny(6*time.Second, 1, 0, 6*time.Second, 60*time.Second),
			},
		})
		// Seed 002, token bucket: bursts up to capacity, then the refill rate.
		out = append(out, table{
			name: "seed002_burst_" + a.String(), limit: sluice.PerSecond(1).WithBurst(5).WithAlgorithm(a), source: "seed 002, token bucket",
			steps: []step{
				allow(0, 1, 4, 1*time.Second),
				allow(0, 1, 3, 2*time.Second),
				allow(0, 3, 0, 5*time.Second),
				deny(0, 1, 0, 1*time.Second, 5*time.Second),
				deny(sec(0.5), 1, 0, sec(0.5), sec(4.5)),
				allow(1*time.Second, 1, 0, 5*time.Second),
				deny(1*time.Second, 2, 0, 2*time.Second, 5*time.Second),
				allow(sec(3.5), 1, 1, sec(3.5)),
				allow(60*time.Second, 5, 0, 5*time.Second),
			},
		})
	}
	// Fixed window with weighted costs: a denial takes nothing.
	out = append(out, table{
		name: "fixed_window_weighted", limit: must(sluice.ParseLimit("fixed_window 10/10s")), source: "weighted costs",
		steps: []step{
			allow(0, 7, 3, 10*time.Second),
			deny(2*time.Second, 4, 3, 8*time.Second, 8*time.Second),
			allow(2*time.Second, 3, 0, 8*time.Second),
			{at: 5 * time.Second, op: peek, cost: 1, remaining: 0, retry: 5 * time.Second, resetAft: 5 * time.Second},
			allow(10*time.Second, 10, 0, 10*time.Second),
			{at: 10 * time.Second, op: reset},
			allow(10*time.Second, 1, 9, 10*time.Second),
		},
	})
	// Sliding log with weighted costs: each unit is an entry.
	out = append(out, table{
		name: "sliding_window_log_weighted", limit: must(sluice.ParseLimit("sliding_window_log 5/min")), source: "weighted costs",
		steps: []step{
			allow(0, 3, 2, 60*time.Second),
			allow(20*time.Second, 2, 0, 60*time.Second),
			deny(30*time.Second, 1, 0, 30*time.Second, 50*time.Second),
			deny(30*time.Second, 4, 0, 50*time.Second, 50*time.Second), // the 4th oldest entry (at 20s) must go
			allow(60*time.Second, 3, 0, 60*time.Second),
			deny(61*time.Second, 1, 0, 19*time.Second, 59*time.Second),
		},
	})
	// Sliding window counter: the previous window's 6 weigh 6·(10−e)/10.
	out = append(out, table{
		name: "sliding_window_counter_weighted", limit: must(sluice.ParseLimit("sliding_window_counter 10/10s")), source: "seeds 000 and 002",
		steps: []step{
			allow(0, 6, 4, 20*time.Second),
			deny(5*time.Second, 5, 4, sec(6.666667), 15*time.Second),
			deny(sec(11.666666), 5, 4, us, sec(8.333334)),
			allow(sec(11.666667), 5, 0, sec(18.333333)),
			deny(sec(11.666667), 1, 0, sec(1.666667), sec(18.333333)), // e must reach 10−4·10/6 s
			allow(40*time.Second, 10, 0, 20*time.Second),
		},
	})
	// GCRA with a burst above the rate.
	out = append(out, table{
		name: "gcra_burst", limit: must(sluice.ParseLimit("1/s burst 3")), source: "redis_rate semantics",
		steps: []step{
			allow(0, 1, 2, 1*time.Second),
			allow(0, 1, 1, 2*time.Second),
			allow(0, 1, 0, 3*time.Second),
			deny(0, 1, 0, 1*time.Second, 3*time.Second),
			deny(sec(0.5), 1, 0, sec(0.5), sec(2.5)),
			allow(1*time.Second, 1, 0, 3*time.Second),
			deny(1*time.Second, 3, 0, 3*time.Second, 3*time.Second),
		},
	})
	return out
}

// testBoundary shows the fixed window's 2× burst at a window edge (seed 002:
// 10 requests at second 9 and 10 more at second 11 of a 10-per-10s limit)
// and that no other algorithm admits it.
func testBoundary(t *testing.T, newStore NewStore) {
	want := map[sluice.Algorithm]int{
		sluice.FixedWindow:          20, // the flaw
		sluice.SlidingWindowLog:     10,
		sluice.SlidingWindowCounter: 11, // 10 weighted 0.9 at second 11 leaves room for one
		sluice.GCRA:                 12, // 2 seconds refill 2 units
		sluice.TokenBucket:          12,
		sluice.LeakyBucket:          12,
	}
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			clock, s, key := storeSetup(t, newStore, "edge")
			l := sluice.Limit{Algorithm: a, Rate: 10, Period: 10 * time.Second}
			admitted := 0
			for _, at := range []time.Duration{9 * time.Second, 11 * time.Second} {
				clock.Set(T0.Add(at))
				for range 10 {
					d, err := s.Take(context.Background(), key, l, 1)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						admitted++
					}
				}
			}
			if admitted != want[a] {
				t.Errorf("%v admitted %d of 20 across the window edge, want %d", l, admitted, want[a])
			}
		})
	}
}

// testRetryAfterExtreme: RetryAfter is exact for limits at the edges of
// what is valid, where a float estimate rounds: a few units of one window
// beside a request of a whole limit of a billion over 366 days weigh less
// than half a unit of the limit's float, so the sliding window counter's
// estimate admits well before the instant solved in exact arithmetic.
// Waiting RetryAfter admits; a microsecond less does not.
//
// Only the window algorithms: a bucket's few units at such rates are
// microseconds of state, which a store on Redis keeps for a millisecond of
// real time while the fake clock waits (RetryAfter exactness for them is
// testProperties').
func testRetryAfterExtreme(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowLog, sluice.SlidingWindowCounter} {
		for _, l := range []sluice.Limit{
			{Algorithm: a, Rate: sluice.MaxRate, Period: sluice.MaxPeriod},
			{Algorithm: a, Rate: 100_000, Period: sluice.MaxPeriod},
			{Algorithm: a, Rate: sluice.MaxRate, Period: time.Hour},
			{Algorithm: a, Rate: 100, Period: time.Minute},
		} {
			if l.Validate() != nil {
				continue // a sliding log of a billion
			}
			for _, carried := range []bool{false, true} { // the units in this window, or the one before
				name := fmt.Sprintf("%s/carried=%v", strings.ReplaceAll(l.String(), " ", "_"), carried)
				t.Run(name, func(t *testing.T) {
					clock := NewClock(T0.Add(1234567 * time.Microsecond))
					s := newStore(t, clock.Now)
					key := uniqueKey(t, "x")
					if d, err := s.Take(ctx, key, l, 3); err != nil || !d.Allowed {
						t.Fatalf("first take: %+v %v", d, err)
					}
					if carried {
						clock.Advance(l.Period)
					}
					capacity := l.Capacity()
					d, err := s.Take(ctx, key, l, capacity)
					if err != nil {
						t.Fatal(err)
					}
					if d.Allowed {
						return // the units before have gone: nothing to wait for
					}
					clock.Advance(d.RetryAfter - time.Microsecond)
					if p, err := s.Peek(ctx, key, l, capacity); err != nil || p.Allowed {
						t.Fatalf("admitted 1µs before RetryAfter %v: %+v %v", d.RetryAfter, p, err)
					}
					clock.Advance(time.Microsecond)
					if p, err := s.Peek(ctx, key, l, capacity); err != nil || !p.Allowed {
						t.Fatalf("still denied after RetryAfter %v: %+v %v", d.RetryAfter, p, err)
					}
				})
			}
		}
	}
}

// testFiles150 replays seed 004's story: a client fetches 150 files at once,
// then writes 150 results one every two seconds. A fixed 60/min window
// rejects 90 of the fetches; a 300-per-300s sliding window admits all 300.
func testFiles150(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	t.Run("fixed_window", func(t *testing.T) {
		t.Parallel()
		clock := NewClock(T0.Add(150 * time.Second)) // halfway into FW3
		s := newStore(t, clock.Now)
		key := uniqueKey(t, "files")
		l := must(sluice.ParseLimit("fixed_window 60/min"))
		allowed, denied := 0, 0
		for range 150 {
			d, err := s.Take(ctx, key, l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				allowed++
			} else {
				denied++
				if d.RetryAfter != 30*time.Second {
					t.Fatalf("RetryAfter %v, want 30s (to the end of FW3)", d.RetryAfter)
				}
			}
		}
		if allowed != 60 || denied != 90 {
			t.Errorf("allowed %d denied %d, want 60 and 90", allowed, denied)
		}
	})
	for _, a := range []sluice.Algorithm{sluice.SlidingWindowLog, sluice.SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			clock := NewClock(T0.Add(150 * time.Second))
			s := newStore(t, clock.Now)
			key := uniqueKey(t, "files")
			l := sluice.Limit{Algorithm: a, Rate: 300, Period: 300 * time.Second}
			for i := range 150 { // the fetches, over five seconds
				clock.Set(T0.Add(150*time.Second + time.Duration(i)*time.Second/30))
				if d, err := s.Take(ctx, key, l, 1); err != nil || !d.Allowed {
					t.Fatalf("fetch %d: %+v %v", i, d, err)
				}
			}
			for i := range 150 { // the writes, from T-155, one per 2s
				clock.Set(T0.Add(155*time.Second + time.Duration(i)*2*time.Second))
				if d, err := s.Take(ctx, key, l, 1); err != nil || !d.Allowed {
					t.Fatalf("write %d: %+v %v", i, d, err)
				}
			}
		})
	}
}

// testProperties checks what the Store contract promises for any limit.
func testProperties(t *testing.T, newStore NewStore, a sluice.Algorithm) {
	ctx := context.Background()
	limits := []sluice.Limit{
		{Algorithm: a, Rate: 5, Period: time.Minute},
		{Algorithm: a, Rate: 3, Period: time.Second},     // interval rounds up: 333,334µs
		{Algorithm: a, Rate: 100, Period: 7 * time.Hour}, // long periods, odd sizes
	}
	if !a.Valid() || a == sluice.GCRA || a == sluice.TokenBucket || a == sluice.LeakyBucket {
		limits = append(limits, sluice.Limit{Algorithm: a, Rate: 2, Period: time.Second, Burst: 7})
	}
	for _, l := range limits {
		t.Run(strings.ReplaceAll(l.String(), " ", "_"), func(t *testing.T) {
			clock := NewClock(T0.Add(1234567 * time.Microsecond))
			s := newStore(t, clock.Now)
			key := uniqueKey(t, "p")
			capacity := l.Capacity()

			// Fresh: Peek shows full capacity and takes nothing.
			for range 3 {
				d, err := s.Peek(ctx, key, l, 1)
				if err != nil || !d.Allowed || d.Remaining != capacity || d.RetryAfter != 0 || d.ResetAfter != 0 {
					t.Fatalf("fresh Peek = %+v, %v; want allowed, remaining %d, no waits", d, err, capacity)
				}
			}
			// Exhaust with weighted costs; Remaining counts down exactly.
			left := capacity
			for left > 0 {
				cost := min(left, 1+left/3)
				d, err := s.Take(ctx, key, l, cost)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed || d.Remaining != left-cost || d.RetryAfter != 0 {
					t.Fatalf("take %d with %d left = %+v", cost, left, d)
				}
				left -= cost
			}
			// Denied: RetryAfter is exact. One microsecond early is still
			// denied; at RetryAfter the same request is admitted.
			for _, cost := range []int64{1, capacity} {
				p, err := s.Peek(ctx, key, l, cost)
				if err != nil {
					t.Fatal(err)
				}
				d, err := s.Take(ctx, key, l, cost)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed || d.RetryAfter <= 0 || d.Remaining >= cost {
					t.Fatalf("cost %d on an exhausted key = %+v, want denied with a wait", cost, d)
				}
				if p != d {
					t.Fatalf("Peek %+v disagrees with Take %+v", p, d)
				}
				if d.ResetAfter < d.RetryAfter && cost == capacity {
					t.Fatalf("ResetAfter %v before RetryAfter %v for the full capacity", d.ResetAfter, d.RetryAfter)
				}
				clock.Advance(d.RetryAfter - time.Microsecond)
				if early, err := s.Peek(ctx, key, l, cost); err != nil || early.Allowed {
					t.Fatalf("cost %d admitted 1µs before RetryAfter %v: %+v %v", cost, d.RetryAfter, early, err)
				}
				clock.Advance(time.Microsecond)
				if p, err := s.Peek(ctx, key, l, cost); err != nil || !p.Allowed {
					t.Fatalf("cost %d still denied after RetryAfter %v: %+v %v", cost, d.RetryAfter, p, err)
				}
				if cost == 1 {
					if got, err := s.Take(ctx, key, l, cost); err != nil || !got.Allowed {
						t.Fatalf("take after RetryAfter: %+v %v", got, err)
					}
				}
			}
			// ResetAfter is exact: a microsecond before it the key is not
			// yet fresh; at it, it is.
			d, err := s.Take(ctx, key, l, 1)
			if err != nil || !d.Allowed || d.ResetAfter <= 0 {
				t.Fatalf("ResetAfter of a used key = %+v %v", d, err)
			}
			clock.Advance(d.ResetAfter - time.Microsecond)
			if p, _ := s.Peek(ctx, key, l, 1); p.Remaining == capacity {
				t.Fatalf("fresh 1µs before ResetAfter %v: %+v", d.ResetAfter, p)
			}
			clock.Advance(time.Microsecond)
			if p, _ := s.Peek(ctx, key, l, 1); p.Remaining != capacity || p.ResetAfter != 0 {
				t.Fatalf("not fresh at ResetAfter %v: %+v", d.ResetAfter, p)
			}
			// Reset forgets the key.
			if _, err := s.Take(ctx, key, l, capacity); err != nil {
				t.Fatal(err)
			}
			if err := s.Reset(ctx, key, l); err != nil {
				t.Fatal(err)
			}
			if p, _ := s.Peek(ctx, key, l, 1); p.Remaining != capacity {
				t.Fatalf("after Reset: %+v", p)
			}
			// Concurrency: many goroutines, one key, a limit nothing refills
			// during the test: exactly the capacity is admitted.
			testConcurrent(t, s, clock, l)
		})
	}
}

func testConcurrent(t *testing.T, s sluice.Store, clock *Clock, l sluice.Limit) {
	if l.Algorithm == sluice.SlidingWindowCounter {
		return // approximate; covered by the never-more check in the boundary test
	}
	key := uniqueKey(t, "conc")
	var (
		mu       sync.Mutex
		admitted int64
		sources  = map[sluice.Source]int{} // of the decisions, for the failure message
		wg       sync.WaitGroup
	)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range int(l.Capacity())/4 + 3 {
				d, err := s.Take(context.Background(), key, l, 1)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				if d.Allowed {
					admitted++
				}
				sources[d.Source]++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if admitted != l.Capacity() {
		t.Errorf("concurrent takes admitted %d, want exactly %d (decisions by source: %v)", admitted, l.Capacity(), sources)
	}
}

// BadInput is a call that every store refuses with an error wrapping
// Want, writing nothing.
type BadInput struct {
	Name  string
	Key   string
	Limit sluice.Limit
	Cost  int64
	Want  error
}

// BadInputs are the calls every store must refuse, on key or beside it,
// with good a valid limit of capacity 10. A limit of the zero Algorithm
// (GCRA) other than "burst on a window" is wrong whatever its algorithm:
// ForAlgorithm puts it under another.
func BadInputs(key string, good sluice.Limit) []BadInput {
	return []BadInput{
		{"empty key", "", good, 1, sluice.ErrInvalidKey},
		{"long key", strings.Repeat("k", sluice.MaxKeyLen+1), good, 1, sluice.ErrInvalidKey},
		{"zero rate", key, sluice.Limit{Period: time.Second}, 1, sluice.ErrInvalidLimit},
		{"negative period", key, sluice.Limit{Rate: 1, Period: -time.Second}, 1, sluice.ErrInvalidLimit},
		{"sub-millisecond period", key, sluice.Limit{Rate: 1, Period: time.Microsecond}, 1, sluice.ErrInvalidLimit},
		{"unknown algorithm", key, sluice.Limit{Algorithm: 99, Rate: 1, Period: time.Second}, 1, sluice.ErrInvalidLimit},
		{"burst on a window", key, sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 1, Period: time.Second, Burst: 5}, 1, sluice.ErrInvalidLimit},
		{"zero cost", key, good, 0, sluice.ErrInvalidCost},
		{"negative cost", key, good, -3, sluice.ErrInvalidCost},
		{"cost over burst", key, good, 11, sluice.ErrCostExceedsBurst},
	}
}

// ForAlgorithm returns b's limit under algorithm a where its wrong limit
// has no algorithm of its own.
func (b BadInput) ForAlgorithm(a sluice.Algorithm) sluice.Limit {
	l := b.Limit
	if l.Algorithm == sluice.GCRA && b.Name != "burst on a window" {
		l.Algorithm = a
	}
	return l
}

// testBadInput: typed errors, and nothing written.
func testBadInput(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	_, s, key := storeSetup(t, newStore, "bad")
	good := sluice.PerMinute(10)
	for _, c := range BadInputs(key, good) {
		for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.SlidingWindowLog, sluice.FixedWindow} {
			l := c.ForAlgorithm(a)
			if _, err := s.Take(ctx, c.Key, l, c.Cost); !errors.Is(err, c.Want) {
				t.Errorf("%s: Take error %v, want %v", c.Name, err, c.Want)
			}
			if _, err := s.Peek(ctx, c.Key, l, c.Cost); !errors.Is(err, c.Want) {
				t.Errorf("%s: Peek error %v, want %v", c.Name, err, c.Want)
			}
		}
	}
	if err := s.Reset(ctx, "", good); !errors.Is(err, sluice.ErrInvalidKey) {
		t.Errorf("Reset with empty key: %v", err)
	}
	for _, a := range sluice.Algorithms() {
		if d, err := s.Peek(ctx, key, good.WithAlgorithm(a), 1); err != nil || d.Remaining != 10 || d.ResetAfter != 0 {
			t.Errorf("%v: state changed by rejected calls: %+v %v", a, d, err)
		}
	}
}

// testIndependence: keys and algorithms do not share state.
func testIndependence(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	k1, k2 := uniqueKey(t, "a"), uniqueKey(t, "b")
	for _, a := range sluice.Algorithms() {
		l := sluice.PerMinute(4).WithAlgorithm(a)
		if d, err := s.Take(ctx, k1, l, 4); err != nil || !d.Allowed {
			t.Fatalf("%v: %+v %v", a, d, err)
		}
		if d, _ := s.Peek(ctx, k2, l, 1); d.Remaining != 4 {
			t.Errorf("%v: another key's take showed up: %+v", a, d)
		}
	}
	// Every algorithm on k1 was exhausted independently of the others.
	for _, a := range sluice.Algorithms() {
		if d, _ := s.Peek(ctx, k1, sluice.PerMinute(4).WithAlgorithm(a), 1); d.Allowed {
			t.Errorf("%v: state lost: %+v", a, d)
		}
	}
}

// testEndedContext: a call whose context has ended returns its error and
// changes nothing.
func testEndedContext(t *testing.T, newStore NewStore) {
	_, s, key := storeSetup(t, newStore, "ended")
	l := sluice.PerMinute(4)
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	if d, err := s.Take(ended, key, l, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Take with an ended context = %+v, %v; want context.Canceled", d, err)
	}
	if m, ok := s.(sluice.MultiStore); ok {
		if _, err := m.TakeAll(ended, []sluice.Request{{Key: key, Limit: l, Cost: 1}}); !errors.Is(err, context.Canceled) {
			t.Errorf("TakeAll with an ended context: %v; want context.Canceled", err)
		}
	}
	if d, err := s.Peek(context.Background(), key, l, 1); err != nil || d.Remaining != 4 {
		t.Errorf("after them: %+v, %v; want nothing taken", d, err)
	}
}

// testNilContext: a nil context is taken for context.Background() by every
// call, as the memory store does, never a panic.
func testNilContext(t *testing.T, newStore NewStore) {
	_, s, key := storeSetup(t, newStore, "nil")
	l := sluice.PerMinute(4)
	var nilCtx context.Context
	nilctx.Call(t, "Take", func() error { _, err := s.Take(nilCtx, key, l, 1); return err })
	nilctx.Call(t, "Peek", func() error { _, err := s.Peek(nilCtx, key, l, 1); return err })
	if m, ok := s.(sluice.MultiStore); ok {
		nilctx.Call(t, "TakeAll", func() error {
			_, err := m.TakeAll(nilCtx, []sluice.Request{{Key: key, Limit: l, Cost: 1}})
			return err
		})
	}
	if g, ok := s.(sluice.Granter); ok {
		nilctx.Call(t, "Grant+Return", func() error {
			gr, err := g.Grant(nilCtx, key, l, 1)
			if err != nil {
				return err
			}
			_, err = g.Return(nilCtx, key, l, gr, gr.Granted)
			return err
		})
	}
	if sl, ok := s.(sluice.Slots); ok {
		il := sluice.Concurrent(2, time.Minute)
		nilctx.Call(t, "Acquire+Extend+Release", func() error {
			if _, err := sl.Acquire(nilCtx, key, il, 1, "h"); err != nil {
				return err
			}
			if _, err := sl.Extend(nilCtx, key, il, "h"); err != nil {
				return err
			}
			_, err := sl.Release(nilCtx, key, "h")
			return err
		})
	}
	nilctx.Call(t, "Reset", func() error { return s.Reset(nilCtx, key, l) })
}

// testTakeAll: layered limits are all-or-nothing.
func testTakeAll(t *testing.T, newStore NewStore) {
	ctx := context.Background()
	clock := NewClock(T0)
	s := newStore(t, clock.Now)
	ms, ok := s.(sluice.MultiStore)
	if !ok {
		t.Skip("store does not implement sluice.MultiStore")
	}
	for _, a := range sluice.Algorithms() {
		t.Run(a.String(), func(t *testing.T) {
			user, ip := uniqueKey(t, "user"), uniqueKey(t, "ip")
			reqs := []sluice.Request{
				{Key: user, Limit: sluice.PerMinute(100).WithAlgorithm(a), Cost: 1},
				{Key: ip, Limit: sluice.PerMinute(3).WithAlgorithm(a), Cost: 1},
			}
			for i := range 3 {
				ds, err := ms.TakeAll(ctx, reqs)
				if err != nil || len(ds) != 2 || !ds[0].Allowed || !ds[1].Allowed {
					t.Fatalf("take %d: %+v %v", i, ds, err)
				}
			}
			ds, err := ms.TakeAll(ctx, reqs)
			if err != nil || !ds[0].Allowed || ds[1].Allowed {
				t.Fatalf("4th: want user allowing, ip denying: %+v %v", ds, err)
			}
			if ds[0].Remaining != 97 {
				t.Errorf("denied TakeAll reported user remaining %d, want 97 (nothing taken)", ds[0].Remaining)
			}
			if d, _ := s.Peek(ctx, user, reqs[0].Limit, 1); d.Remaining != 97 {
				t.Errorf("denied TakeAll leaked quota from the user limit: remaining %d, want 97", d.Remaining)
			}
			// Bad input anywhere rejects the whole call.
			bad := append(reqs[:1:1], sluice.Request{Key: ip, Limit: reqs[1].Limit, Cost: 0})
			if _, err := ms.TakeAll(ctx, bad); !errors.Is(err, sluice.ErrInvalidCost) {
				t.Errorf("bad cost in TakeAll: %v", err)
			}
			if d, _ := s.Peek(ctx, user, reqs[0].Limit, 1); d.Remaining != 97 {
				t.Errorf("rejected TakeAll changed state: %+v", d)
			}
		})
	}
}
