package memory_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// TestEvictionCrowdedByOwnKeys: a TakeAll whose own new keys fill a full
// shard never evicts a denied key while the shard holds keys that took
// less, and evicts it not at all from samples its own keys crowd: the
// shard holds more than its bound for a while instead. One sample of the
// call's own keys and the denied key evicted the denied key, which then
// admitted its whole limit again (1 run in 10 of sluice serve's eviction
// test, 128 keys a request, 10 a shard).
func TestEvictionCrowdedByOwnKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := storetest.NewClock(storetest.T0)
	login := sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 5, Period: 15 * time.Minute}
	for run := range 50 {
		s := memory.New(&memory.Options{Shards: 1, MaxKeys: 10, Clock: clock.Now, SweepInterval: -1})
		for range 5 {
			if d, err := s.Take(ctx, "victim", login, 1); err != nil || !d.Allowed {
				t.Fatalf("victim: %+v, %v", d, err)
			}
		}
		for i := range 9 {
			if _, err := s.Take(ctx, fmt.Sprint("flood-", i), login, 1); err != nil {
				t.Fatal(err)
			}
		}
		var reqs []sluice.Request
		for i := range 12 {
			reqs = append(reqs, sluice.Request{Key: fmt.Sprint("call-", i), Limit: login, Cost: 1})
		}
		if _, err := s.TakeAll(ctx, reqs); err != nil {
			t.Fatal(err)
		}
		if d, err := s.Take(ctx, "victim", login, 1); err != nil || d.Allowed {
			t.Fatalf("run %d: the denied key after a TakeAll of 12 new keys into its full shard: %+v, %v (evicted: %+v)", run, d, err, s.Evictions())
		}
		// Only flood keys go; one that no sample finds stays, and the
		// shard holds more than its bound, by fewer keys than the call has.
		if e := s.Evictions(); e.Exhausted != 0 || e.Keys == 0 || e.Keys > 9 || s.Len() > 10+len(reqs) {
			t.Fatalf("run %d: evictions %+v, %d keys held; want only flood keys evicted, at most %d keys", run, e, s.Len(), 10+len(reqs))
		}
		s.Close()
	}
}
