package sluice_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/openloop"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
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
	checkWaitLine(t, redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)}))
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

// The window algorithms' estimates err long: whatever the window's phase,
// a waiter is served or refused at once, never held and then refused.
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
	checkWaitOpenLoop(t, redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)}))
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
