package enforce

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/line"
	"github.com/sluicehq/sluice/internal/openloop"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// namedStore is a store for a subtest.
type namedStore struct {
	name  string
	store sluice.Store
}

// delayStores are a memory store and a real Redis, their clocks clock
// (nil: the real one).
func delayStores(t *testing.T, clock func() time.Time) []namedStore {
	mem := memory.New(&memory.Options{Clock: clock})
	t.Cleanup(func() { mem.Close() })
	return []namedStore{
		{"memory", mem},
		{"redis", redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock})},
	}
}

// enforceOne runs one request of cost 1 on key under r and reports how
// long it took.
func enforceOne(ctx context.Context, t *testing.T, e *Engine, r *Rule, key string) (Verdict, time.Duration) {
	start := time.Now()
	v, err := e.Enforce(ctx, []Check{{Rule: r, Key: key, Cost: 1}})
	if err != nil && ctx.Err() == nil {
		t.Error(err)
	}
	return v, time.Since(start)
}

// A request whose expected wait is within a store round trip and
// line.Wake of MaxDelay is refused at once, with that wait, rather than
// held to MaxDelay and refused (its turn would come too late to ask for
// the units); one with room to spare waits. A frozen clock: 1/min, Burst
// 1, its unit taken, so the wait is exactly a minute (and Redis keeps the
// key a minute of real time).
func TestDelayMarginOfMaxDelay(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	for _, s := range delayStores(t, clock.Now) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			e := New(s.store, nil)
			for _, tt := range []struct {
				maxDelay time.Duration
				held     bool
			}{
				{time.Minute + 10*time.Millisecond, false},
				{time.Minute + time.Second, true},
			} {
				r := &Rule{Name: "d", Limit: sluice.PerMinute(1).WithBurst(1), Strategy: Delay, MaxDelay: tt.maxDelay}
				key := fmt.Sprint("margin:", tt.maxDelay)
				if v, _ := enforceOne(context.Background(), t, e, r, key); !v.Allowed {
					t.Fatalf("MaxDelay %v: first request refused", tt.maxDelay)
				}
				// The clock never moves: a request held is held until its
				// context ends (cancelled: a deadline would bound the wait).
				ctx, cancel := context.WithCancel(context.Background())
				stop := time.AfterFunc(300*time.Millisecond, cancel)
				v, took := enforceOne(ctx, t, e, r, key)
				stop.Stop()
				cancel()
				switch {
				case v.Allowed:
					t.Errorf("MaxDelay %v: admitted on a frozen clock", tt.maxDelay)
				case tt.held && took < 250*time.Millisecond:
					t.Errorf("MaxDelay %v: refused after %v, want held (a minute's wait fits)", tt.maxDelay, took)
				case !tt.held && took >= 250*time.Millisecond:
					t.Errorf("MaxDelay %v: held %v, want refused at once (a minute's wait leaves no time to ask)", tt.maxDelay, took)
				case !tt.held && v.Decision.RetryAfter < time.Minute:
					t.Errorf("MaxDelay %v: refused with RetryAfter %v, want the minute it needs", tt.maxDelay, v.Decision.RetryAfter)
				}
			}
		})
	}
}

// On a bucket with Burst 1, each waiter ahead adds the heads' lateness to
// a newcomer's wait: at 10/min with heads a second late, the ninth
// request behind a taken unit waits 6s + 8×(6s + 1s) = 62s, past a
// minute's MaxDelay, and is refused at once (the shape alone says 54s,
// which fits). A frozen clock, so no head is admitted and the lateness
// stays (Redis keeps the key 6s of real time).
func TestDelayLineLatenessAhead(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	for _, s := range delayStores(t, clock.Now) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			e := New(s.store, nil)
			e.turnLate.Store(int64(time.Second))
			r := &Rule{Name: "d", Limit: sluice.PerMinute(10).WithBurst(1), Strategy: Delay, MaxDelay: time.Minute}
			if v, _ := enforceOne(context.Background(), t, e, r, "k"); !v.Allowed {
				t.Fatal("first request refused")
			}
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			defer wg.Wait()
			defer cancel()
			var early atomic.Int64 // waiters refused before the test ended them
			for i := range 8 {
				wg.Go(func() {
					if _, took := enforceOne(ctx, t, e, r, "k"); ctx.Err() == nil {
						early.Add(1)
						t.Errorf("waiter %d answered after %v, want held", i, took)
					}
				})
				// One at a time, so that each finds those before it.
				for deadline := time.Now().Add(5 * time.Second); inLine(e, "k", r.Limit) < int64(i+1) && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
			}
			// Cancelled after a second, not by a deadline, which would bound
			// the wait itself: held, it would be held until then.
			nctx, ncancel := context.WithCancel(context.Background())
			defer ncancel()
			time.AfterFunc(time.Second, ncancel)
			v, took := enforceOne(nctx, t, e, r, "k")
			if v.Allowed || took > 250*time.Millisecond {
				t.Errorf("ninth waiter: allowed %v after %v, want refused at once", v.Allowed, took)
			}
			if want := 62 * time.Second; v.Decision.RetryAfter < want-5*time.Millisecond || v.Decision.RetryAfter > want+5*time.Millisecond {
				t.Errorf("ninth waiter told RetryAfter %v, want about %v", v.Decision.RetryAfter, want)
			}
		})
	}
}

// inLine returns the units in e's line on key under limit.
func inLine(e *Engine, key string, limit sluice.Limit) int64 {
	reqs := []sluice.Request{{Key: key, Limit: limit}}
	if snap := line.Look(line.Owner(e.store, e), key, lineName(reqs)); snap != nil {
		return snap.Ahead()[0]
	}
	return 0
}

// refusedAfter returns how long each refused request was held, sorted.
func refusedAfter(out []openloop.Outcome) []time.Duration {
	var refused []time.Duration
	for _, o := range out {
		if !o.Allowed {
			refused = append(refused, o.End.Sub(o.Start))
		}
	}
	slices.Sort(refused)
	return refused
}

// checkNotInVain fails t when more than one request in every perHeld was
// refused after being held longer than quick, or any after longer than
// slow: a Delay rule refuses at once what it cannot serve within MaxDelay.
func checkNotInVain(t *testing.T, requests int, refused []time.Duration, perHeld int, quick, slow time.Duration) {
	t.Helper()
	held := slices.DeleteFunc(slices.Clone(refused), func(d time.Duration) bool { return d <= quick })
	t.Logf("%d requests, %d refused, %d of them held over %v and then refused: %v", requests, len(refused), len(held), quick, held)
	if most := max(1, requests/perHeld); len(held) > most {
		t.Errorf("%d requests held over %v and then refused; want at most %d (1 in %d)", len(held), quick, most, perHeld)
	}
	if len(refused) > 0 && refused[len(refused)-1] > slow {
		t.Errorf("a request refused after %v, want none later than %v", refused[len(refused)-1], slow)
	}
}

// A burst of 30 at once on 10/s (GCRA with Burst 1, and the sliding
// window log, whose 10 units all come back at 1s), MaxDelay 1s, three
// times: the requests the rate cannot serve within MaxDelay are refused
// at once. On the log, the waiters told just under 1s were held 1s and
// then refused (4 to 25 in 90), all their units coming back as MaxDelay
// ended.
func TestDelayBurstAtOnce(t *testing.T) {
	race.SkipTiming(t) // and not parallel: the other timing test's load would be its
	const maxDelay = time.Second
	for _, s := range delayStores(t, nil) {
		for _, limit := range []sluice.Limit{
			sluice.PerSecond(10).WithBurst(1),
			{Algorithm: sluice.SlidingWindowLog, Rate: 10, Period: time.Second},
		} {
			t.Run(s.name+"/"+limit.Algorithm.String(), func(t *testing.T) {
				r := &Rule{Name: "d", Limit: limit, Strategy: Delay, MaxDelay: maxDelay}
				e := New(s.store, nil)
				var (
					mu      sync.Mutex
					refused []time.Duration
				)
				for run := range 3 {
					key := fmt.Sprint("burst:", limit.Algorithm, ":", run)
					var wg sync.WaitGroup
					start := make(chan struct{})
					for range 30 {
						wg.Go(func() {
							<-start
							if v, took := enforceOne(context.Background(), t, e, r, key); !v.Allowed {
								mu.Lock()
								refused = append(refused, took)
								mu.Unlock()
							}
						})
					}
					close(start)
					wg.Wait()
				}
				slices.Sort(refused)
				checkNotInVain(t, 90, refused, 30, 250*time.Millisecond, maxDelay+250*time.Millisecond)
			})
		}
	}
}

// Sustained overload on a Delay rule whose bucket has no burst to absorb
// a late head (GCRA 100/s, Burst 1; MaxDelay 500ms), offered twice its
// rate for 4s: a request expected near MaxDelay is refused at once, so
// that at most 1 in 50 is held and then refused (38 to 161 in 800 were,
// held ~490ms, when only the deadline had a margin for the store's round
// trip and timers, and each head's lateness went uncounted). The promise
// assumes timers late by less than line.Wake: a run in which the machine
// stalled longer (a 1ms ticker's tick came later) says nothing of the
// line, and is run again, up to 3 times.
func TestDelayBurstOneOpenLoop(t *testing.T) {
	race.SkipTiming(t) // and not parallel: the other timing test's load would be its
	const maxDelay = 500 * time.Millisecond
	for _, s := range delayStores(t, nil) {
		t.Run(s.name, func(t *testing.T) {
			r := &Rule{Name: "d", Limit: sluice.PerSecond(100).WithBurst(1), Strategy: Delay, MaxDelay: maxDelay}
			for attempt := 1; ; attempt++ {
				e := New(s.store, nil)
				key := fmt.Sprint("burst-one:", attempt)
				var out []openloop.Outcome
				stall := stalls(func() {
					out = openloop.Run(openloop.Periodic(200, 4*time.Second), func() bool {
						v, _ := enforceOne(context.Background(), t, e, r, key)
						return v.Allowed
					})
				})
				if stall > line.Wake && attempt < 3 {
					t.Logf("attempt %d: the machine stalled %v; again", attempt, stall)
					continue
				}
				t.Logf("attempt %d: longest stall %v", attempt, stall)
				waited := 0
				for _, o := range out {
					if o.Allowed && o.End.Sub(o.Start) > 100*time.Millisecond {
						waited++
					}
				}
				refused := refusedAfter(out)
				if waited == 0 || len(refused) == 0 {
					t.Fatalf("%d admitted after waiting, %d refused: the line was not tested", waited, len(refused))
				}
				perHeld := 50
				if stall > line.Wake {
					perHeld = 10 // three busy runs: a bound that still tells the line's
				}
				checkNotInVain(t, len(out), refused, perHeld, 100*time.Millisecond, maxDelay+250*time.Millisecond)
				return
			}
		})
	}
}

// stalls runs f and returns the longest a 1ms ticker's tick came late
// meanwhile.
func stalls(f func()) time.Duration {
	done := make(chan struct{})
	var most time.Duration
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-tick.C:
				most = max(most, now.Sub(last)-time.Millisecond)
				last = now
			}
		}
	})
	f()
	close(done)
	wg.Wait()
	return most
}

// waitLimit keeps a store round trip and line.Wake of MaxDelay, as of the
// deadline, for the request to ask for its units in time, but never more
// than half of MaxDelay.
func TestWaitLimit(t *testing.T) {
	t.Parallel()
	rtt := time.Millisecond
	bg := context.Background()
	for _, tt := range []struct {
		maxDelay, waited, want time.Duration
	}{
		{500 * time.Millisecond, 0, 500*time.Millisecond - rtt - line.Wake},
		{500 * time.Millisecond, 100 * time.Millisecond, 400*time.Millisecond - rtt - line.Wake},
		{10 * time.Millisecond, 0, 5 * time.Millisecond},
	} {
		if got := waitLimit(bg, tt.maxDelay, tt.waited, rtt); got != tt.want {
			t.Errorf("waitLimit(MaxDelay %v, waited %v) = %v, want %v", tt.maxDelay, tt.waited, got, tt.want)
		}
	}
	ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
	defer cancel()
	if got := waitLimit(ctx, time.Second, 0, rtt); got > 200*time.Millisecond-rtt-line.Wake || got < 100*time.Millisecond {
		t.Errorf("waitLimit within a 200ms deadline = %v, want about %v", got, 200*time.Millisecond-rtt-line.Wake)
	}
}

// A bucket with Burst 1 adds each head's lateness per waiter ahead; one
// whose burst leaves more slack than the lateness, and the windows, add
// nothing.
func TestLineDrift(t *testing.T) {
	t.Parallel()
	late := time.Millisecond
	req := func(l sluice.Limit, cost int64) sluice.Request { return sluice.Request{Key: "k", Limit: l, Cost: cost} }
	for _, tt := range []struct {
		name  string
		r     sluice.Request
		ahead int64
		want  time.Duration
	}{
		{"burst 1", req(sluice.PerSecond(100).WithBurst(1), 1), 47, 47 * late},
		{"burst 1, none ahead", req(sluice.PerSecond(100).WithBurst(1), 1), 0, 0},
		{"burst 2", req(sluice.PerSecond(100).WithBurst(2), 1), 47, 0},
		{"burst 2, 0.5ms interval, cost 2", req(sluice.PerSecond(2000).WithBurst(2), 2), 10, 5 * late / 2},
		{"token bucket, burst 1", req(sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 10, Period: time.Second, Burst: 1}, 1), 3, 3 * late},
		{"sliding window log", req(sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 1, Period: time.Second}, 1), 47, 0},
		{"fixed window", req(sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 1, Period: time.Second}, 1), 47, 0},
	} {
		if got := lineDrift(tt.r, tt.ahead, late); got != tt.want {
			t.Errorf("%s: lineDrift = %v, want %v", tt.name, got, tt.want)
		}
	}
}

// A request whose context ends while a Delay rule holds it is Abandoned
// and observed as nothing, through Enforce (the middleware) and
// EnforceAll (the service) alike, as a store call of an ended context is
// not: no client hears its denial. One refused at once, its context
// alive, is observed as denied. On frozen clocks (memory and a real
// Redis): 1/min, its unit taken.
func TestDelayAbandonedNotObserved(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	for _, s := range delayStores(t, clock.Now) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			var obs events
			e := New(s.store, &obs)
			held := &Rule{Name: "held", Limit: sluice.PerMinute(1).WithBurst(1), Strategy: Delay, MaxDelay: 2 * time.Minute}
			short := &Rule{Name: "short", Limit: held.Limit, Strategy: Delay, MaxDelay: time.Second}
			for _, all := range []bool{false, true} {
				enforce := func(ctx context.Context, r *Rule, key string) Verdict {
					checks := []Check{{Rule: r, Key: key, Cost: 1}}
					var v Verdict
					var err error
					if all {
						v, err = e.EnforceAll(ctx, checks)
					} else {
						v, err = e.Enforce(ctx, checks)
					}
					if err != nil && ctx.Err() == nil {
						t.Fatal(err)
					}
					return v
				}
				key := "k"
				if all {
					key = "all"
				}
				obs = nil
				if v := enforce(context.Background(), held, key); !v.Allowed {
					t.Fatalf("all=%v: first request refused", all)
				}
				obs = nil
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(100*time.Millisecond, cancel)
				v := enforce(ctx, held, key)
				if v.Allowed || !v.Abandoned {
					t.Errorf("all=%v: held request cancelled: %+v, want Abandoned", all, v)
				}
				if len(obs) != 0 {
					t.Errorf("all=%v: held request cancelled: observed %q, want nothing", all, obs.String())
				}
				obs = nil
				if v := enforce(context.Background(), short, key); v.Allowed || v.Abandoned {
					t.Errorf("all=%v: request refused at once: %+v, want a denial", all, v)
				}
				if got := obs.String(); got != "short=denied" {
					t.Errorf("all=%v: request refused at once: observed %q, want short=denied", all, got)
				}
			}
		})
	}
}
