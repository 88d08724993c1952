package redistest

import (
	"testing"
	"time"
)

// The new master's first answers, seen before the promotion is noticed,
// are the new master's: the split falls in the pause after the kill.
func TestPromotedSplit(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	var takes []failoverTake
	for _, at := range []int{-20, -10, 0, 3} { // the old master's, one in flight at the kill
		takes = append(takes, failoverTake{end: ms(at), ok: true})
	}
	takes = append(takes, failoverTake{end: ms(500)}) // failures during the outage
	for at := 1900; at < 2600; at += 5 {              // the new master's, before the promotion is seen
		takes = append(takes, failoverTake{end: ms(at), ok: true})
	}
	split := promotedSplit(takes, ms(0), ms(2600))
	if !split.After(ms(3)) || !split.Before(ms(1900)) {
		t.Errorf("split at %v after the kill, want between 3 ms and 1.9 s", split.Sub(t0))
	}
	if got := promotedSplit(nil, ms(0), ms(2000)); !got.Equal(ms(1000)) {
		t.Errorf("with no answers between kill and promotion: split at %v, want 1s", got.Sub(t0))
	}
}
