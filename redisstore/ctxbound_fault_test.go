package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultEveryCallDeadline: every exported call that talks to Redis,
// Check, CheckAccess and Membership's included, returns within its
// context's deadline plus a slack, with an error wrapping
// context.DeadlineExceeded (never a success past the deadline), while
// Redis holds its commands: paused by CLIENT PAUSE ALL or stopped by
// SIGSTOP. Clients have go-redis's defaults (no ContextTimeoutEnabled),
// whose reads would wait out the fault. Each fault lasts faultFor, well
// past maxLate, so a call that waits for Redis fails the bound.
func TestFaultEveryCallDeadline(t *testing.T) {
	race.SkipTiming(t)
	const (
		deadline = 50 * time.Millisecond
		faultFor = 800 * time.Millisecond
		rounds   = 3
		pLate    = 100 * time.Millisecond // at the 90th percentile
		maxLate  = 300 * time.Millisecond
	)
	ctx := context.Background()
	rate := sluice.PerMinute(1000)
	swl := rate.WithAlgorithm(sluice.SlidingWindowLog)
	slots := sluice.Concurrent(100, time.Hour)
	type env struct {
		s     *redisstore.Store
		c     redis.UniversalClient
		m     *redisstore.Membership
		round int
		grant sluice.Grant
	}
	calls := []struct {
		name string
		call func(ctx context.Context, e *env) error
	}{
		{"Check", func(ctx context.Context, e *env) error { _, err := redisstore.Check(ctx, e.c); return err }},
		{"CheckAccess", func(ctx context.Context, e *env) error { return e.s.CheckAccess(ctx) }},
		{"Membership.Heartbeat", func(ctx context.Context, e *env) error { _, err := e.m.Heartbeat(ctx, "me", time.Minute); return err }},
		{"Membership.Roster", func(ctx context.Context, e *env) error { _, _, err := e.m.Roster(ctx, "me", time.Minute); return err }},
		{"Membership.Leave", func(ctx context.Context, e *env) error { return e.m.Leave(ctx, "gone", time.Minute) }},
		{"Take", func(ctx context.Context, e *env) error { _, err := e.s.Take(ctx, "k", rate, 1); return err }},
		{"Peek", func(ctx context.Context, e *env) error { _, err := e.s.Peek(ctx, "k", rate, 1); return err }},
		{"Reset", func(ctx context.Context, e *env) error { return e.s.Reset(ctx, "r", rate) }},
		{"Reset (sliding window log)", func(ctx context.Context, e *env) error { return e.s.Reset(ctx, "r", swl) }},
		{"TakeAll", func(ctx context.Context, e *env) error {
			_, err := e.s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: rate, Cost: 1}, {Key: "b", Limit: rate, Cost: 1}})
			return err
		}},
		{"Grant", func(ctx context.Context, e *env) error { _, err := e.s.Grant(ctx, "g", rate, 2); return err }},
		{"Return", func(ctx context.Context, e *env) error { _, err := e.s.Return(ctx, "g", rate, e.grant, 1); return err }},
		{"Regrant", func(ctx context.Context, e *env) error {
			_, _, err := e.s.Regrant(ctx, "g", rate, e.grant, 1, 2)
			return err
		}},
		{"Acquire", func(ctx context.Context, e *env) error { _, err := e.s.Acquire(ctx, "s", slots, 1, "new"); return err }},
		{"Extend", func(ctx context.Context, e *env) error { _, err := e.s.Extend(ctx, "s", slots, "held"); return err }},
		{"Release (young holder)", func(ctx context.Context, e *env) error {
			_, err := e.s.Release(ctx, "s", fmt.Sprint("young", e.round))
			return err
		}},
		{"ReleaseOnce", func(ctx context.Context, e *env) error {
			_, _, err := e.s.ReleaseOnce(ctx, "s", "held", time.Minute)
			return err
		}},
	}
	type fault struct{ start, stop func(t testing.TB) }
	targets := []struct {
		name  string
		setUp func(t *testing.T) (redis.UniversalClient, fault)
	}{
		{"standalone/client pause", func(t *testing.T) (redis.UniversalClient, fault) {
			srv := redistest.StartServer(t)
			admin := srv.Client(t)
			pause := func(t testing.TB) {
				if err := admin.Do(ctx, "client", "pause", faultFor.Milliseconds(), "all").Err(); err != nil {
					t.Fatal(err)
				}
			}
			return srv.Client(t), fault{pause, func(testing.TB) {}} // the pause ends by itself
		}},
		{"standalone/sigstop/ContextTimeoutEnabled", func(t *testing.T) (redis.UniversalClient, fault) {
			// go-redis ends the read itself at the deadline, racing the
			// context's own timer: the error must still be the context's.
			srv := redistest.StartServer(t)
			c := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
			t.Cleanup(func() { c.Close() })
			return c, fault{srv.Pause, srv.Resume}
		}},
		{"standalone/sigstop", func(t *testing.T) (redis.UniversalClient, fault) {
			srv := redistest.StartServer(t)
			return srv.Client(t), fault{srv.Pause, srv.Resume}
		}},
		{"cluster/sigstop", func(t *testing.T) (redis.UniversalClient, fault) {
			cl := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 1})
			return cl.Client(t), fault{cl.Nodes[0].Pause, cl.Nodes[0].Resume}
		}},
	}
	for _, tg := range targets {
		t.Run(tg.name, func(t *testing.T) {
			c, f := tg.setUp(t)
			s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
			e := &env{s: s, c: c, m: s.Membership()}
			late := map[string][]time.Duration{}
			var all []time.Duration
			for round := range rounds {
				e.round = round
				// Warm: scripts cached, connections pooled, state to act on.
				wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				for _, tc := range calls {
					var err error
					if e.grant, err = s.Grant(wctx, "g", rate, 2); err != nil { // one for each return
						t.Fatal(err)
					}
					if err := tc.call(wctx, e); err != nil {
						t.Fatalf("%s before the fault: %v", tc.name, err)
					}
				}
				var err error
				if e.grant, err = s.Grant(wctx, "g", rate, 2); err != nil {
					t.Fatal(err)
				}
				for _, h := range []string{"held", fmt.Sprint("young", round)} {
					if _, err := s.Acquire(wctx, "s", slots, 1, h); err != nil {
						t.Fatal(err)
					}
				}
				cancel()

				f.start(t)
				faultEnd := time.Now().Add(faultFor)
				var mu sync.Mutex
				var wg sync.WaitGroup
				for _, tc := range calls {
					wg.Go(func() {
						// Staggered, so that one stall of the machine costs
						// a few samples, not all of a round's.
						time.Sleep(time.Duration(rand.IntN(20_000)) * time.Microsecond)
						cctx, cancel := context.WithTimeout(ctx, deadline)
						defer cancel()
						end, _ := cctx.Deadline()
						err := tc.call(cctx, e)
						d := time.Since(end)
						if !errors.Is(err, context.DeadlineExceeded) {
							t.Errorf("round %d: %s during the fault returned %v after %v past its deadline; want an error wrapping context.DeadlineExceeded",
								round, tc.name, err, d.Round(time.Millisecond))
						}
						mu.Lock()
						late[tc.name] = append(late[tc.name], d)
						all = append(all, d)
						mu.Unlock()
					})
				}
				// The fault ends on time even for calls that wait for it.
				time.Sleep(time.Until(faultEnd))
				f.stop(t)
				wg.Wait()
				waitAnswers(t, c)
			}
			for _, tc := range calls {
				d := late[tc.name]
				if worst := slices.Max(d); worst > maxLate {
					t.Errorf("%s returned %v past its deadline (samples %v): want at most %v", tc.name, worst, d, maxLate)
				}
			}
			slices.Sort(all)
			p := all[(len(all)-1)*90/100]
			t.Logf("%d calls past their deadline by p50 %v, p90 %v, max %v", len(all), all[len(all)/2], p, all[len(all)-1])
			if p > pLate {
				t.Errorf("calls returned p90 %v past their deadline: want at most %v", p, pLate)
			}
		})
	}
}

// waitAnswers waits until Redis answers a PING again after a fault.
func waitAnswers(t *testing.T, c redis.UniversalClient) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); ; {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("Redis does not answer after the fault: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
