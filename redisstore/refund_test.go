package redisstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/storetest"
)

// TestRefund: a take given back by refund, at once or later, leaves a key
// that decides exactly as a twin key that never took. Random walks, caller
// clock, periods of hours so no key expires in real time during the test.
func TestRefund(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	var limits []sluice.Limit
	for _, a := range sluice.Algorithms() {
		limits = append(limits, sluice.Limit{Algorithm: a, Rate: 5, Period: time.Hour})
	}
	limits = append(limits,
		sluice.Limit{Algorithm: sluice.GCRA, Rate: 3, Period: time.Hour, Burst: 7},
		sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 3, Period: time.Hour, Burst: 7},
		sluice.Limit{Algorithm: sluice.LeakyBucket, Rate: 3, Period: time.Hour, Burst: 7})
	for i, l := range limits {
		t.Run(fmt.Sprintf("%d_%v", i, l.Algorithm), func(t *testing.T) {
			t.Parallel()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			clock := storetest.NewClock(storetest.T0.Add(time.Duration(rng.Int64N(int64(time.Hour)))))
			s := New(c, &Options{Prefix: redistest.Prefix(t), Clock: clock.Now})
			capacity := l.Capacity()
			refunds := 0
			// twins makes the same call on the refunded key and its twin,
			// which must answer alike.
			twins := func(step int, op string, cost int64, call func(context.Context, string, sluice.Limit, int64) (sluice.Decision, error)) {
				t.Helper()
				da, erra := call(ctx, "a", l, cost)
				db, errb := call(ctx, "b", l, cost)
				if erra != nil || errb != nil {
					t.Fatal(erra, errb)
				}
				if da != db {
					t.Fatalf("step %d %s %d: refunded key %+v, twin %+v", step, op, cost, da, db)
				}
			}
			for step := range 400 {
				if rng.IntN(3) > 0 {
					clock.Advance(time.Duration(rng.Int64N(int64(l.Period/4))) / time.Microsecond * time.Microsecond)
				}
				cost := 1 + rng.Int64N(capacity)
				if rng.IntN(2) == 0 { // take on the twin only, then give it back
					r, err := s.decide(ctx, modeTake, "a", l, cost)
					if err != nil {
						t.Fatal(err)
					}
					if !r.allowed {
						continue
					}
					if rng.IntN(2) == 0 {
						clock.Advance(time.Duration(rng.Int64N(int64(l.Period / 3))))
					}
					if err := s.refund(ctx, sluice.Request{Key: "a", Limit: l, Cost: cost}, r); err != nil {
						t.Fatal(err)
					}
					refunds++
				} else { // the same take on both
					twins(step, "take", cost, s.Take)
				}
				for _, cost := range []int64{1, capacity} {
					twins(step, "peek", cost, s.Peek)
				}
			}
			if refunds < 25 {
				t.Errorf("only %d refunds ran", refunds)
			}
		})
	}
}
