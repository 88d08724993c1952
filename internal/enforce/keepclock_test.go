package enforce

import (
	"context"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// steppedClock is time.Now after the host's wall clock was stepped by
// step (NTP, an operator): the wall reading moved, the monotonic one not.
// time.Time has no API for that, so its wall seconds are moved in place
// (the layout of a reading with a monotonic part: 33 bits of seconds
// above 30 of nanoseconds); ok is false if the layout is not that one.
func steppedClock(step *atomic.Int64) (clock func() time.Time, ok bool) {
	at := func(step int64) time.Time {
		t := time.Now()
		p := (*struct {
			wall uint64
			ext  int64
			loc  *time.Location
		})(unsafe.Pointer(&t))
		p.wall += uint64(step/int64(time.Second)) << 30
		return t
	}
	now, c := time.Now(), at(int64(time.Hour))
	moved := c.UnixNano() - now.UnixNano()
	ok = moved > int64(time.Hour-time.Second) && moved < int64(time.Hour+time.Second) && c.Sub(now).Abs() < time.Second
	return func() time.Time { return at(step.Load()) }, ok
}

// A step of the wall clock moves neither the extends of a running
// request's slots nor the reports of their expiry: the keeper's times are
// the monotonic clock's. Stepped back an hour, the extends stopped (due an
// hour later), so the store freed the slot at its hold timeout while its
// request ran and another request took it; stepped forward, every running
// request's slots were reported expired at once (sluice_inflight_held
// fell, sluice_inflight_expired_total rose) though they were extended.
func TestKeepWallClockStep(t *testing.T) {
	for _, step := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(step.String(), func(t *testing.T) {
			t.Parallel()
			const hold = 600 * time.Millisecond
			store := memory.New(nil) // the store's own clock, as Redis's TIME
			t.Cleanup(func() { store.Close() })
			obs := &slotEvents{}
			rs := observedRules(t, store, obs, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(1, hold), Key: ident})
			var by atomic.Int64
			clock, ok := steppedClock(&by)
			if !ok {
				t.Skip("time.Time's layout is not the one steppedClock moves")
			}
			rs.env.clock = clock
			h, v, err := rs.Acquire(context.Background(), "k", sluice.PriorityCritical)
			if err != nil || !v.Allowed {
				t.Fatal(v, err)
			}
			time.Sleep(hold / 10)
			by.Store(int64(step))
			time.Sleep(3 * hold) // the request runs on
			if _, v, err := rs.Acquire(context.Background(), "k", sluice.PriorityCritical); err != nil || v.Allowed {
				t.Errorf("another request 3 holds in: %+v %v, want refused (the slot extended)", v, err)
			}
			h.Release()
			if n := obs.count("extend/allowed"); n < 5 {
				t.Errorf("%d extends in 3 holds, want about 9: %s", n, obs)
			}
			if n := obs.count("expire/allowed"); n != 0 {
				t.Errorf("%d expiries reported of a slot extended and released: %s", n, obs)
			}
		})
	}
}
