package sluice_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/line"
	"github.com/sluicehq/sluice/internal/middlewaretest"
	"github.com/sluicehq/sluice/internal/openloop"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/storetest"
)

// WaitN's waiters on one key form a line: with a 2s deadline and
// PerSecond(2), 20 at once get 2 at once and 3 more at 0.5s, 1s and 1.5s;
// the other 15 fail at once (the next unit, at 2s, would pass the
// deadline), told how long they would have waited, rather than sleeping
// until the deadline and failing then.
func TestWaitLineFailsAtOnce(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	checkWaitLine(t, newMemory(t, nil))
}

func TestRedisWaitLineFailsAtOnce(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	checkWaitLine(t, middlewaretest.Redis(t, nil))
}

func checkWaitLine(t *testing.T, store sluice.Store) {
	const runs, n = 4, 20
	var (
		mu      sync.Mutex
		refused []time.Duration
		wg      sync.WaitGroup
	)
	served := make([]int, runs)
	for r := range runs {
		l, err := sluice.NewLimiter(store, sluice.PerSecond(2), nil)
		if err != nil {
			t.Fatal(err)
		}
		key := string(rune('a' + r))
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		t.Cleanup(cancel)
		deadline, _ := ctx.Deadline()
		for range n {
			wg.Go(func() {
				start := time.Now()
				d, err := l.Wait(ctx, key)
				took := time.Since(start)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil && d.Allowed:
					served[r]++
				case errors.Is(err, context.DeadlineExceeded) && !d.Allowed:
					refused = append(refused, took)
					if left := time.Until(deadline); d.RetryAfter <= left {
						t.Errorf("refused with RetryAfter %v, %v before the deadline", d.RetryAfter, left)
					}
				default:
					t.Errorf("Wait = %+v, %v", d, err)
				}
			})
		}
	}
	wg.Wait()
	for r, s := range served {
		if s != 5 {
			t.Errorf("run %d: %d served, want 5", r, s)
		}
	}
	if len(refused) == 0 {
		t.Fatal("none refused")
	}
	slices.Sort(refused)
	p90, most := refused[len(refused)*9/10], refused[len(refused)-1]
	t.Logf("%d refusals: p90 %v, max %v", len(refused), p90, most)
	// Generous for a busy machine and the race detector; a waiter that
	// sleeps to its deadline takes 2s.
	if p90 > 250*time.Millisecond || most > 1500*time.Millisecond {
		t.Errorf("refusals took p90 %v, max %v; want at once", p90, most)
	}
}

// The window algorithms' estimates are exact (the log) or err long:
// whatever the window's phase, a waiter is served or refused at once,
// never held and then refused.
func TestWaitLineWindows(t *testing.T) {
	t.Parallel()
	store := newMemory(t, nil)
	for _, a := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowLog, sluice.SlidingWindowCounter} {
		t.Run(a.String(), func(t *testing.T) {
			t.Parallel()
			l, err := sluice.NewLimiter(store, sluice.Limit{Algorithm: a, Rate: 4, Period: 400 * time.Millisecond}, &sluice.Options{Prefix: a.String()})
			if err != nil {
				t.Fatal(err)
			}
			var (
				mu      sync.Mutex
				late    []time.Duration
				wg      sync.WaitGroup
				refused int
			)
			for round := range 3 {
				ctx, cancel := context.WithTimeout(context.Background(), 700*time.Millisecond)
				t.Cleanup(cancel)
				for range 16 {
					wg.Go(func() {
						start := time.Now()
						d, err := l.Wait(ctx, "k")
						took := time.Since(start)
						if err != nil && !errors.Is(err, context.DeadlineExceeded) || err == nil && !d.Allowed {
							t.Errorf("round %d: Wait = %+v, %v", round, d, err)
						}
						if err != nil {
							mu.Lock()
							refused++
							late = append(late, took)
							mu.Unlock()
						}
					})
				}
				wg.Wait()
			}
			if refused == 0 {
				t.Fatal("none refused")
			}
			slices.Sort(late)
			t.Logf("%d refusals: p90 %v, max %v", refused, late[len(late)*9/10], late[len(late)-1])
			if p90, most := late[len(late)*9/10], late[len(late)-1]; p90 > 250*time.Millisecond || most > 600*time.Millisecond {
				t.Errorf("refusals took p90 %v, max %v; want at once", p90, most)
			}
		})
	}
}

// An open-loop schedule: requests arriving at twice the rate
// (periodic, and seeded Poisson), each waiting at most 1s. Every newcomer that finds a line joins its end
// instead of taking the unit its head waits for, so none is held to its
// deadline and then refused: a request the line cannot serve in time is
// refused at once.
func TestWaitLineOpenLoop(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	checkWaitOpenLoop(t, newMemory(t, nil))
}

func TestRedisWaitLineOpenLoop(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	checkWaitOpenLoop(t, middlewaretest.Redis(t, nil))
}

func checkWaitOpenLoop(t *testing.T, store sluice.Store) {
	limit := sluice.PerSecond(10)
	openloop.Replay(t, 1, limit, func(t *testing.T, name string) func() bool {
		l, err := sluice.NewLimiter(store, limit, &sluice.Options{Prefix: name + ":"})
		if err != nil {
			t.Fatal(err)
		}
		return func() bool {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			d, err := l.Wait(ctx, "open")
			if err != nil && !errors.Is(err, context.DeadlineExceeded) || err == nil && !d.Allowed {
				t.Errorf("Wait = %+v, %v", d, err)
			}
			return err == nil
		}
	})
}

// A sliding window log's waiter behind the line is told its exact wait:
// 2/s, both units taken at T0 (a frozen clock), one waiter in line. Both
// units come back at 1s, so the second waiter's wait is 1s (it was told
// 2s, a Period more, and refused at once with a 1.3s deadline), and a
// third's is 2s, a Period after the first unit.
func TestWaitLineSlidingLogExact(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	checkSlidingLogExact(t, newMemory(t, clock.Now))
}

func TestRedisWaitLineSlidingLogExact(t *testing.T) {
	t.Parallel()
	clock := storetest.NewClock(storetest.T0)
	checkSlidingLogExact(t, middlewaretest.Redis(t, clock))
}

func checkSlidingLogExact(t *testing.T, store sluice.Store) {
	l, err := sluice.NewLimiter(store, sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 2, Period: time.Second}, nil)
	if err != nil {
		t.Fatal(err)
	}
	bg := context.Background()
	for range 2 {
		if d, err := l.Allow(bg, "k"); err != nil || !d.Allowed {
			t.Fatalf("Allow: %+v, %v", d, err)
		}
	}
	// The clock never moves: the waiters in line stay there until cancelled.
	ctx, cancel := context.WithCancel(bg)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wait := func(timeout time.Duration) (sluice.Decision, error) {
		c, stop := context.WithTimeout(ctx, timeout)
		defer stop()
		return l.Wait(c, "k")
	}
	wg.Go(func() { l.Wait(ctx, "k") })
	for start := time.Now(); !line.Waiting(store, "k"); time.Sleep(time.Millisecond) {
		if time.Since(start) > 5*time.Second {
			t.Fatal("first waiter not in line after 5s")
		}
	}
	// A deadline short of the wait: refused at once with the wait.
	if d, err := wait(500 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) || d.Allowed || d.RetryAfter != time.Second {
		t.Errorf("second waiter, 0.5s deadline: %+v, %v; want refused with RetryAfter 1s", d, err)
	}
	// A deadline past it: waits in line.
	second := make(chan error, 1)
	wg.Go(func() { _, err := wait(1300 * time.Millisecond); second <- err })
	select {
	case err := <-second:
		t.Fatalf("second waiter, 1.3s deadline, refused: %v; want it in line", err)
	case <-time.After(200 * time.Millisecond):
	}
	// The third's units come back a Period after the first's.
	if d, err := wait(1500 * time.Millisecond); !errors.Is(err, context.DeadlineExceeded) || d.Allowed || d.RetryAfter != 2*time.Second {
		t.Errorf("third waiter, 1.5s deadline: %+v, %v; want refused with RetryAfter 2s", d, err)
	}
	cancel()
	if err := <-second; !errors.Is(err, context.Canceled) {
		t.Errorf("second waiter: %v, want cancelled in line", err)
	}
}
