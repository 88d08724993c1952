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

// A flood of new keys, one unit each, into a full store evicts flood keys,
// never the keys it wants afresh: keys that have taken their whole limit.
// With four exhausted keys in a one-shard store, every sample of five keys
// holds a flood key, which has taken less; so no exhausted key may go,
// under any algorithm, the flood's the same or another: GCRA's keys and
// the others' live in tables of their own, and a sample drawn from one
// table alone was all victims whenever it was theirs (1 in 50 here).
// (Evicting the sample's soonest to expire, as before, evicted them under
// the window algorithms and the log, where the keys taken first expire
// first.)
func TestFloodKeepsExhaustedKeys(t *testing.T) {
	t.Parallel()
	for _, a := range sluice.Algorithms() {
		other := sluice.GCRA // the flood's algorithm, in the other table
		if a == sluice.GCRA {
			other = sluice.TokenBucket
		}
		for _, fa := range []sluice.Algorithm{a, other} {
			t.Run(a.String()+"_flood_"+fa.String(), func(t *testing.T) {
				t.Parallel()
				testFloodKeepsExhaustedKeys(t, a, fa)
			})
		}
	}
}

// testFloodKeepsExhaustedKeys floods victims of algorithm a with keys of fa.
func testFloodKeepsExhaustedKeys(t *testing.T, a, fa sluice.Algorithm) {
	ctx := context.Background()
	const maxKeys = 200
	s, clock := newClocked(t, memory.Options{MaxKeys: maxKeys, Shards: 1})
	l := sluice.Limit{Algorithm: a, Rate: 5, Period: 15 * time.Minute}
	flood := l.WithAlgorithm(fa)
	victims := []string{"victim-0", "victim-1", "victim-2", "victim-3"}
	for _, v := range victims {
		for i := range 6 {
			d, err := s.Take(ctx, v, l, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed != (i < 5) {
				t.Fatalf("%s take %d: allowed=%v under 5/15m", v, i+1, d.Allowed)
			}
		}
	}
	for i := range 10 * maxKeys {
		clock.Advance(50 * time.Millisecond) // 100 s in all: no unit comes back (one in 3 min)
		if _, err := s.Take(ctx, fmt.Sprint("flood-", i), flood, 1); err != nil {
			t.Fatal(err)
		}
		if i%10 != 0 {
			continue
		}
		for _, v := range victims {
			if d, err := s.Peek(ctx, v, l, 1); err != nil || d.Allowed {
				t.Fatalf("after %d flood keys %s is admitted again (%+v, %v): evicted", i+1, v, d, err)
			}
		}
	}
	if n := s.Len(); n != maxKeys {
		t.Errorf("holding %d keys, want %d", n, maxKeys)
	}
	want := memory.Evictions{Keys: uint64(len(victims) + 10*maxKeys - maxKeys)}
	if got := s.Evictions(); got != want {
		t.Errorf("Evictions() = %+v, want %+v: every flood key past the bound, none exhausted", got, want)
	}
}

// A flood whose every key is spent by its one unit (a limit of 1 a day,
// outliving the victims' 15 minutes) still evicts its own keys: among
// keys that have all taken their whole limit, the one of the smallest
// capacity goes first, whose eviction admits the fewest units. (Evicting
// the soonest to expire among them, as before, evicted the victims.)
func TestFloodOfSpentKeysKeepsExhaustedKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const maxKeys = 200
	s, clock := newClocked(t, memory.Options{MaxKeys: maxKeys, Shards: 1})
	login := sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 5, Period: 15 * time.Minute}
	signup := sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 1, Period: 24 * time.Hour}
	victims := []string{"victim-0", "victim-1", "victim-2", "victim-3"}
	for _, v := range victims {
		for range 6 {
			if _, err := s.Take(ctx, v, login, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	for i := range 10 * maxKeys {
		clock.Advance(50 * time.Millisecond)
		if d, err := s.Take(ctx, fmt.Sprint("signup-", i), signup, 1); err != nil || !d.Allowed {
			t.Fatalf("flood key %d: %+v, %v", i, d, err)
		}
		if i%10 != 0 {
			continue
		}
		for _, v := range victims {
			if d, err := s.Peek(ctx, v, login, 1); err != nil || d.Allowed {
				t.Fatalf("after %d spent flood keys %s is admitted again (%+v, %v): evicted", i+1, v, d, err)
			}
		}
	}
}

// Evictions counts the keys evicted before they expired, and apart those
// that had taken their whole limit; an expired key is fresh already, and
// its removal is no eviction. MaxKeys reports the bound.
func TestEvictionsCounted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, clock := newClocked(t, memory.Options{MaxKeys: 1, Shards: 1})
	if got := s.MaxKeys(); got != 1 {
		t.Errorf("MaxKeys() = %d, want 1", got)
	}
	if got := memory.New(&memory.Options{SweepInterval: -1}).MaxKeys(); got != memory.DefaultMaxKeys {
		t.Errorf("default MaxKeys() = %d, want %d", got, memory.DefaultMaxKeys)
	}
	take := func(key string, l sluice.Limit) {
		t.Helper()
		if _, err := s.Take(ctx, key, l, 1); err != nil {
			t.Fatal(err)
		}
	}
	hourly, twice := sluice.PerHour(1), sluice.PerHour(2)
	steps := []struct {
		do   func()
		want memory.Evictions
	}{
		{func() { take("a", hourly) }, memory.Evictions{}},
		{func() { take("b", twice) }, memory.Evictions{Keys: 1, Exhausted: 1}},                            // a, exhausted
		{func() { take("c", hourly) }, memory.Evictions{Keys: 2, Exhausted: 1}},                           // b, half taken
		{func() { clock.Advance(time.Hour); take("d", hourly) }, memory.Evictions{Keys: 2, Exhausted: 1}}, // c, expired
	}
	for i, st := range steps {
		st.do()
		if got := s.Evictions(); got != st.want {
			t.Errorf("step %d: Evictions() = %+v, want %+v", i, got, st.want)
		}
	}
	var zero memory.Store
	if got := zero.Evictions(); got != (memory.Evictions{}) || zero.MaxKeys() != 0 {
		t.Errorf("zero Store: Evictions() = %+v, MaxKeys() = %d", got, zero.MaxKeys())
	}
}

// The review's login scenario: sliding_window_log 5/15m, a victim key
// denied, then 1.5 × MaxKeys distinct keys, again and again. The victim
// stays denied all along (it was admitted 5 times more after each flood
// when eviction took the soonest to expire), until its own entries expire.
func TestKeyFloodLogin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const maxKeys = 1000
	s, clock := newClocked(t, memory.Options{MaxKeys: maxKeys}) // 64 shards of 16
	login := sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 5, Period: 15 * time.Minute}
	victim := "victim@example.com"
	for i := range 6 {
		d, err := s.Take(ctx, victim, login, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != (i < 5) {
			t.Fatalf("victim attempt %d: allowed=%v", i+1, d.Allowed)
		}
	}
	next := 0
	for round := range 5 {
		for range maxKeys * 3 / 2 {
			if _, err := s.Take(ctx, fmt.Sprint("flood-", next), login, 1); err != nil {
				t.Fatal(err)
			}
			next++
		}
		clock.Advance(30 * time.Second) // the review's flood took 28 s
		for i := range 6 {
			d, err := s.Take(ctx, victim, login, 1)
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				t.Fatalf("round %d, attempt %d: the victim was admitted after %d flood keys", round, i+1, next)
			}
			if want := 15*time.Minute - time.Duration(round+1)*30*time.Second; d.RetryAfter != want {
				t.Fatalf("round %d: retry after %v, want %v (its first entry's expiry)", round, d.RetryAfter, want)
			}
		}
		if n := s.Len(); n > maxKeys+64 { // rounded up per shard
			t.Fatalf("round %d: holding %d keys", round, n)
		}
	}
	clock.Advance(15 * time.Minute)
	if d, err := s.Take(ctx, victim, login, 1); err != nil || !d.Allowed {
		t.Errorf("15 minutes on: %+v, %v; want the victim admitted again", d, err)
	}
}

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
