package line

import (
	"testing"
	"time"
)

func TestEstimate(t *testing.T) {
	bucket := Shape{Kind: Bucket, Interval: 500 * time.Millisecond, Period: time.Second, Capacity: 2}
	fixed := Shape{Kind: Fixed, Period: time.Second, Capacity: 4}
	sliding := Shape{Kind: Sliding, Period: time.Second, Capacity: 4}
	ms := time.Millisecond
	for _, tc := range []struct {
		s           Shape
		ahead, cost int64
		retry, want time.Duration
	}{
		{bucket, 0, 1, 300 * ms, 300 * ms},  // the head: its own denial
		{bucket, 3, 1, 300 * ms, 1800 * ms}, // one Interval per unit ahead
		{bucket, 3, 2, 300 * ms, 1800 * ms}, // its own units are in retry
		{fixed, 0, 1, 300 * ms, 300 * ms},
		{fixed, 3, 1, 300 * ms, 300 * ms},   // all four fit the next window
		{fixed, 4, 1, 300 * ms, 1300 * ms},  // the fifth needs the one after
		{fixed, 7, 2, 300 * ms, 2300 * ms},  // units 8 and 9: the third window
		{sliding, 0, 1, 300 * ms, 300 * ms}, // the head
		{sliding, 3, 1, 300 * ms, 1300 * ms},
		{sliding, 4, 1, 300 * ms, 2300 * ms},
	} {
		if got := tc.s.Estimate(tc.retry, tc.ahead, tc.cost); got != tc.want {
			t.Errorf("%+v: Estimate(%v, %d, %d) = %v, want %v", tc.s, tc.retry, tc.ahead, tc.cost, got, tc.want)
		}
	}
	if got := bucket.Estimate(time.Second, 1<<62, 1); got != 1<<63-1 {
		t.Errorf("huge line: %v, want saturated", got)
	}
	if got := bucket.EstimateAllowed(5, 3, 1); got != 0 {
		t.Errorf("room for all: %v", got)
	}
	if got := bucket.EstimateAllowed(2, 3, 1); got != time.Second {
		t.Errorf("two short: %v, want 1s", got)
	}
}

// Waiters take turns first come first served; a waiter whose estimate
// passes its limit is refused and never joins.
func TestLine(t *testing.T) {
	per := func(ahead []int64) time.Duration { return time.Duration(ahead[0]+1) * time.Second }
	owner := new(int)
	a, _ := Join(owner, "k", []int64{1}, per, 2*time.Second)
	b, est := Join(owner, "k", []int64{1}, per, 2*time.Second)
	if a == nil || b == nil || est != 2*time.Second {
		t.Fatalf("joins: %v %v %v", a, b, est)
	}
	if c, est := Join(owner, "k", []int64{1}, per, 2*time.Second); c != nil || est != 3*time.Second {
		t.Fatalf("third join: %v %v, want refused with 3s", c, est)
	}
	other, _ := Join(owner, "other", []int64{1}, per, time.Second)
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
