package server

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/server/config"
)

// Counts racing with a bucket rollover are all kept: goroutines count while
// the clock crosses several buckets, and the buckets sum to every count.
func TestStatsRolloverLosesNothing(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Unix(1_700_000_000, 0).UnixNano())
	s := newStats(func() time.Time { return time.Unix(0, now.Load()) })
	r := s.setPolicies([]*config.Policy{{Name: "p"}})["p"]
	const workers, each, buckets = 8, 5000, 10
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if w == 0 && i%(each/buckets) == 0 {
					now.Add(int64(StatsBucket)) // one goroutine moves the clock on
				}
				s.add(r, i%3 == 0)
			}
		}()
	}
	wg.Wait()
	var allowed, denied int64
	for _, ser := range s.Snapshot() {
		for i := range ser.Allowed {
			allowed += ser.Allowed[i]
			denied += ser.Denied[i]
		}
	}
	wantDenied := int64(workers * ((each + 2) / 3))
	if allowed+denied != workers*each || denied != wantDenied {
		t.Errorf("counted %d allowed + %d denied, want %d + %d", allowed, denied, workers*each-wantDenied, wantDenied)
	}
}

// A bucket's counts are not reported once its slot is reused 60 buckets
// later, nor before.
func TestStatsWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	s := newStats(func() time.Time { return now })
	r := s.setPolicies([]*config.Policy{{Name: "p"}})["p"]
	s.add(r, false)
	s.add(r, true)
	ser := s.Snapshot()[0]
	if ser.Allowed[StatsBuckets-1] != 1 || ser.Denied[StatsBuckets-1] != 1 {
		t.Fatalf("current bucket: %+v", ser)
	}
	now = t0.Add(StatsBucket * (StatsBuckets - 1))
	if ser := s.Snapshot()[0]; ser.Allowed[0] != 1 {
		t.Errorf("oldest bucket lost its count: %v", ser.Allowed)
	}
	now = t0.Add(StatsBucket * StatsBuckets)
	s.add(r, true) // the same slot, a new bucket
	ser = s.Snapshot()[0]
	if ser.Allowed[StatsBuckets-1] != 0 || ser.Denied[StatsBuckets-1] != 1 || ser.Allowed[0] != 0 {
		t.Errorf("after a full turn: allowed %v denied %v", ser.Allowed, ser.Denied)
	}
}
