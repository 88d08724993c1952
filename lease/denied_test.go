package lease_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/storetest"
)

// TestTakeAllDeniedElsewhereKeepsBudget: a leased check whose requests
// another check keeps denying spends nothing, so it must lose nothing.
// Counted as demand, those requests kept the key leased: every lease
// ended unspent and went back less the return rule's unit per Interval
// begun, about one unit per D, which drained a limit that refills slower
// than that (300 a minute lost 195 units in 10 s at D = 50 ms) and starved
// the key's other traffic.
func TestTakeAllDeniedElsewhereKeepsBudget(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	m := newMemory(t, clock)
	s, err := lease.New(m, &lease.Options{Clock: clock.Now, For: func(key string, _ sluice.Limit) time.Duration {
		if key == "user" {
			return 50 * time.Millisecond
		}
		return 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	user, ep, open := sluice.PerMinute(300), sluice.PerMinute(1), sluice.PerSecond(1000)
	take := func(other string) bool {
		l := ep
		if other == "open" {
			l = open
		}
		ds, err := s.TakeAll(ctx, []sluice.Request{{Key: "user", Limit: user, Cost: 1}, {Key: other, Limit: l, Cost: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return ds[0].Allowed && ds[1].Allowed
	}
	// First the key is hot and leased, its requests admitted: 40 in
	// 80 ms, with another check that has room.
	for range 40 {
		if !take("open") {
			t.Fatal("a request with room was denied")
		}
		clock.Advance(2 * time.Millisecond)
	}
	if s.Stats().Grants == 0 {
		t.Fatal("user was never leased")
	}
	// Then a request spends ep's one unit: every later one is denied by
	// ep for the next minute, while user has units throughout (41 taken,
	// 50 refilled by the end).
	if !take("ep") {
		t.Fatal("the first request was denied")
	}
	admitted := 0
	for end := clock.Now().Add(10 * time.Second); clock.Now().Before(end); clock.Advance(2 * time.Millisecond) {
		if take("ep") {
			admitted++
		}
	}
	if err := s.Close(ctx); err != nil {
		t.Fatal(err)
	}
	d, err := m.Peek(ctx, "user", user, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("admitted %d; user's remaining %d; stats %+v", admitted, d.Remaining, s.Stats())
	// What the return rule kept is counted: a unit or so per lease of
	// the first 80 ms, where it was a unit per D throughout.
	if st := s.Stats(); st.Forfeited > 10 {
		t.Errorf("%d units forfeited to the return rule, want at most 10", st.Forfeited)
	}
	if admitted != 0 {
		t.Errorf("admitted %d requests that ep denies", admitted)
	}
	if d.Remaining != user.Capacity() {
		t.Errorf("user's remaining is %d after 10 s of requests denied by another check, want %d", d.Remaining, user.Capacity())
	}
}
