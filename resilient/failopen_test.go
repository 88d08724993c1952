package resilient

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// FailOpen's decisions are exactly what the memory store decides on a
// fresh key, for every algorithm, on every path that answers by the
// policy: Take, Peek, TakeAll, TakeByPolicy, TakeAllByPolicy and
// Acquire. Its ResetAfter was 0, so the middleware's RateLimit header said
// t=0 (the whole budget back at once) right after a unit was taken. The
// backend is a Redis that refuses connections; the windows' instants
// fall at, inside and at the last µs of a window.
func TestFailOpenAsFresh(t *testing.T) {
	t.Parallel()
	clk := storetest.NewClock(t0)
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	s := newMultiStore(t, redisstore.New(client, nil), &Options{Policy: FailOpen, Clock: clk.Now, Logger: discard})
	ref := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	t.Cleanup(func() { ref.Close() })
	ctx := context.Background()
	n := 0
	fresh := func() string { n++; return fmt.Sprintf("fresh-%d", n) }
	same := func(t *testing.T, op string, got, want sluice.Decision) {
		t.Helper()
		want.Source = sluice.SourceFailOpen
		if got != want {
			t.Errorf("%s: got %+v, want %+v (a fresh key's)", op, got, want)
		}
	}
	at := []time.Duration{0, 17*time.Second + 345678*time.Microsecond, time.Minute - time.Microsecond}
	for _, a := range sluice.Algorithms() {
		for _, lim := range []sluice.Limit{
			sluice.PerMinute(10).WithAlgorithm(a),
			{Algorithm: a, Rate: 3, Period: 7 * time.Second}, // an interval rounded up, windows not on the minute
		} {
			for _, cost := range []int64{1, lim.Capacity()} {
				for _, off := range at {
					t.Run(fmt.Sprintf("%v/cost %d/+%v", lim, cost, off), func(t *testing.T) {
						clk.Set(t0.Add(off))
						for _, peek := range []bool{false, true} {
							call, op := s.Take, "Take"
							refCall := ref.Take
							if peek {
								call, op, refCall = s.Peek, "Peek", ref.Peek
							}
							got, err := call(ctx, "k", lim, cost)
							if err != nil {
								t.Fatal(err)
							}
							want, err := refCall(ctx, fresh(), lim, cost)
							if err != nil {
								t.Fatal(err)
							}
							same(t, op, got, want)
						}
						got, err := s.TakeByPolicy(ctx, "k", lim, cost, nil)
						if err != nil {
							t.Fatal(err)
						}
						want, _ := ref.Take(ctx, fresh(), lim, cost)
						same(t, "TakeByPolicy", got, want)

						reqs := []sluice.Request{{Key: "a", Limit: lim, Cost: cost}, {Key: "b", Limit: sluice.PerSecond(7), Cost: 2}}
						refReqs := []sluice.Request{{Key: fresh(), Limit: lim, Cost: cost}, {Key: fresh(), Limit: sluice.PerSecond(7), Cost: 2}}
						wants, err := ref.TakeAll(ctx, refReqs)
						if err != nil {
							t.Fatal(err)
						}
						for name, takeAll := range map[string]func() ([]sluice.Decision, error){
							"TakeAll":         func() ([]sluice.Decision, error) { return s.TakeAll(ctx, reqs) },
							"TakeAllByPolicy": func() ([]sluice.Decision, error) { return s.TakeAllByPolicy(ctx, reqs, nil) },
						} {
							gots, err := takeAll()
							if err != nil {
								t.Fatal(err)
							}
							for i := range reqs {
								same(t, fmt.Sprintf("%s[%d]", name, i), gots[i], wants[i])
							}
						}
					})
				}
			}
		}
	}
	t.Run("acquire", func(t *testing.T) {
		l := sluice.InFlightLimit{Max: 5, Hold: time.Minute}
		for _, w := range []int64{1, 5} {
			got, err := s.Acquire(ctx, "slot", l, w, sluice.NewHolderID())
			if err != nil {
				t.Fatal(err)
			}
			want, err := ref.Acquire(ctx, fresh(), l, w, sluice.NewHolderID())
			if err != nil {
				t.Fatal(err)
			}
			want.Source = sluice.SourceFailOpen
			if got != want {
				t.Errorf("weight %d: got %+v, want %+v (a fresh key's)", w, got, want)
			}
		}
	})
}
