package line

import (
	"testing"
	"time"
)

func TestEstimate(t *testing.T) {
	bucket := Shape{Kind: Bucket, Interval: 500 * time.Millisecond, Period: time.Second, Capacity: 2}
	fixed := Shape{Kind: Fixed, Period: time.Second, Capacity: 4}
	sliding := Shape{Kind: Sliding, Period: time.Second, Capacity: 4}
	counter := Shape{Kind: Counter, Period: time.Second, Capacity: 4}
	ms := time.Millisecond
	for _, tc := range []struct {
		s                   Shape
		peeked, ahead, cost int64
		retry, want         time.Duration
	}{
		{bucket, 1, 0, 1, 300 * ms, 300 * ms},  // the head: its own denial
		{bucket, 1, 3, 1, 300 * ms, 1800 * ms}, // one Interval per unit ahead
		{bucket, 2, 3, 2, 300 * ms, 1800 * ms}, // its own units are in retry
		{fixed, 1, 0, 1, 300 * ms, 300 * ms},
		{fixed, 1, 3, 1, 300 * ms, 300 * ms},   // all four fit the next window
		{fixed, 1, 4, 1, 300 * ms, 1300 * ms},  // the fifth needs the one after
		{fixed, 2, 7, 2, 300 * ms, 2300 * ms},  // units 8 and 9: the third window
		{sliding, 1, 0, 1, 300 * ms, 300 * ms}, // the head
		// The line's 3 and the waiter's 1 fit the capacity: the store's
		// answer for all 4 is the wait, not a Period more.
		{sliding, 4, 3, 1, 300 * ms, 300 * ms},
		{sliding, 1, 3, 1, 300 * ms, 300 * ms}, // told only of its own unit: no more is known
		// Units 5 (q=1, r=1): a Period after the first unit comes back.
		{sliding, 1, 4, 1, 300 * ms, 1300 * ms},
		{sliding, 3, 5, 2, 300 * ms, 1300 * ms}, // units 6 and 7: a Period after 3 come back
		{sliding, 2, 5, 2, 300 * ms, 1300 * ms}, // peeked 2 ≤ r=3: a bound
		// Units 4 and 5 (q=1, r=1) told of its own 2: a Period at least,
		// and no sooner than its own.
		{sliding, 2, 3, 2, 300 * ms, 1000 * ms},
		{sliding, 2, 3, 2, 1500 * ms, 1500 * ms},
		{counter, 1, 0, 1, 300 * ms, 300 * ms}, // the head
		{counter, 4, 3, 1, 300 * ms, 300 * ms}, // the store's answer for all 4
		// Told less, or beyond the capacity: a Period more, erring long.
		{counter, 1, 3, 1, 300 * ms, 1300 * ms},
		{counter, 1, 4, 1, 300 * ms, 2300 * ms},
	} {
		if got := tc.s.Estimate(tc.retry, tc.peeked, tc.ahead, tc.cost); got != tc.want {
			t.Errorf("%+v: Estimate(%v, %d, %d, %d) = %v, want %v", tc.s, tc.retry, tc.peeked, tc.ahead, tc.cost, got, tc.want)
		}
	}
	if got := bucket.Estimate(time.Second, 1, 1<<62, 1); got != 1<<63-1 {
		t.Errorf("huge line: %v, want saturated", got)
	}
	if got := sliding.Estimate(time.Second, 1, 1<<62, 1); got != 1<<63-1 {
		t.Errorf("huge sliding line: %v, want saturated", got)
	}
	if got := bucket.EstimateAllowed(5, 3, 1); got != 0 {
		t.Errorf("room for all: %v", got)
	}
	if got := bucket.EstimateAllowed(2, 3, 1); got != time.Second {
		t.Errorf("two short: %v, want 1s", got)
	}
	for _, tc := range []struct {
		remaining, ahead, cost int64
		want                   time.Duration
	}{
		{4, 3, 1, 0},                // room for all
		{3, 3, 1, time.Microsecond}, // the 4th is not free yet: some wait
		{4, 4, 1, time.Second},      // the 5th: a Period after the first, free now
		{1, 5, 2, time.Second},      // units 6 and 7: a Period after 3, not yet free
	} {
		if got := sliding.EstimateAllowed(tc.remaining, tc.ahead, tc.cost); got != tc.want {
			t.Errorf("sliding EstimateAllowed(%d, %d, %d) = %v, want %v", tc.remaining, tc.ahead, tc.cost, got, tc.want)
		}
	}
	for _, tc := range []struct {
		s                 Shape
		ahead, cost, want int64
	}{
		{bucket, 3, 1, 1}, {fixed, 3, 1, 1}, // their own units
		{sliding, 0, 2, 2}, {sliding, 1, 2, 3}, {sliding, 3, 1, 4}, // all at once
		{sliding, 4, 1, 1}, {sliding, 5, 2, 3}, {sliding, 8, 4, 4}, // the last Capacity's
		{counter, 0, 2, 2}, {counter, 3, 1, 4}, {counter, 4, 1, 1}, // all at once, or its own
	} {
		if got := tc.s.PeekCost(tc.ahead, tc.cost); got != tc.want {
			t.Errorf("%+v: PeekCost(%d, %d) = %d, want %d", tc.s, tc.ahead, tc.cost, got, tc.want)
		}
	}
}

// Waiters take turns first come first served; a waiter whose estimate
// passes its limit is refused and never joins.
func TestLine(t *testing.T) {
	per := func(ahead []int64) time.Duration { return time.Duration(ahead[0]+1) * time.Second }
	owner := new(int)
	a, _ := Join(owner, "k", "k", []int64{1}, per, 2*time.Second)
	b, est := Join(owner, "k", "k", []int64{1}, per, 2*time.Second)
	if a == nil || b == nil || est != 2*time.Second {
		t.Fatalf("joins: %v %v %v", a, b, est)
	}
	if c, est := Join(owner, "k", "k", []int64{1}, per, 2*time.Second); c != nil || est != 3*time.Second {
		t.Fatalf("third join: %v %v, want refused with 3s", c, est)
	}
	other, _ := Join(owner, "other", "other", []int64{1}, per, time.Second)
	if !a.Head() || b.Head() || other == nil || !other.Head() {
		t.Fatal("heads")
	}
	a.Leave()
	a.Leave()
	select {
	case <-b.Turn():
	default:
		t.Fatal("b not promoted")
	}
	b.Leave()
	other.Leave()
	if n := Len(); n != 0 {
		t.Errorf("%d left in lines", n)
	}
}

// A newcomer that finds a line joins its end without taking first; the
// units ahead of it are those in the line when it looked and all that
// joined since, so its estimate errs long, never short; a line that
// emptied meanwhile is not joined. With no line, Busy is false.
func TestSnapshot(t *testing.T) {
	owner := new(int)
	if Busy() || Waiting(owner, "k") || Look(owner, "k", "k") != nil {
		t.Fatal("a line before any joined")
	}
	per := func(ahead []int64) time.Duration { return time.Duration(ahead[0]+1) * time.Second }
	a, _ := Join(owner, "k", "k", []int64{2}, per, time.Hour)
	if !Busy() || !Waiting(owner, "k") || Look(owner, "k", "k x") != nil {
		t.Fatal("Busy, Waiting or Look by another name")
	}
	snap := Look(owner, "k", "k")
	b, _ := Join(owner, "k", "k", []int64{1}, per, time.Hour) // joins after the look
	a.Leave()                                                 // served after the look
	var seen []int64
	c, there := snap.Join([]int64{1}, func(ahead []int64) bool { seen = ahead; return true })
	if !there || c == nil || c.Head() || seen[0] != 3 {
		t.Fatalf("join: %v %v, head %v, ahead %v; want behind b, 3 ahead (a's 2 and b's 1)", c, there, c != nil && c.Head(), seen)
	}
	if d, there := Look(owner, "k", "k").Join([]int64{1}, func([]int64) bool { return false }); d != nil || !there {
		t.Fatal("refused join")
	}
	snap = Look(owner, "k", "k")
	b.Leave()
	c.Leave()
	if d, there := snap.Join([]int64{1}, func([]int64) bool { return true }); d != nil || there {
		t.Fatal("joined a line that emptied")
	}
	if Busy() || Len() != 0 {
		t.Errorf("busy %v, %d waiting after all left", Busy(), Len())
	}
}

// Lines of other counter sets that share a first key are told apart, and
// each leaves the registry when it empties, in any order.
func TestSharedFirstKey(t *testing.T) {
	owner := new(int)
	zero := func([]int64) time.Duration { return 0 }
	a, _ := Join(owner, "k", "k 1", []int64{1}, zero, 0)
	b, _ := Join(owner, "k", "k 2", []int64{1, 1}, zero, 0)
	c, _ := Join(owner, "k", "k 3", []int64{1}, zero, 0)
	if !a.Head() || !b.Head() || !c.Head() {
		t.Fatal("each heads its own line")
	}
	b.Leave()
	if Look(owner, "k", "k 2") != nil || Look(owner, "k", "k 1") == nil || Look(owner, "k", "k 3") == nil {
		t.Fatal("after the middle line emptied")
	}
	c.Leave()
	a.Leave()
	if Waiting(owner, "k") || Busy() {
		t.Error("lines left behind")
	}
}
