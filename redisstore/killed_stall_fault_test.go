package redisstore_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultKilledRedisIsNoStall: a killed Redis refuses connections, and
// its calls time out in the client's dial retries as a stopped one's do
// unanswered; only the stopped one is a stall (the WARN line, Stalls).
// Before, 50 ms takes on a killed Redis wrote "Redis stopped answering"
// and counted a stall, batched or not. A Redis whose host drops packets
// (behind a proxy gone dark: connects time out, no refusal) is
// unreachable too; it was told as a stall, as its dial timed out.
func TestFaultKilledRedisIsNoStall(t *testing.T) {
	race.SkipTiming(t)
	for _, tc := range []struct {
		name     string
		maxBatch int
		killed   bool
		dropped  bool // killed by its host dropping packets, not by a kill
	}{
		{"killed", 0, true, false}, {"killed MaxBatch 1", 1, true, false},
		{"dropped", 0, true, true}, {"dropped MaxBatch 1", 1, true, true},
		{"stopped", 0, false, false}, {"stopped MaxBatch 1", 1, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			addr := srv.Addr
			var p *redistest.DelayProxy
			if tc.dropped {
				p = redistest.StartDelayProxy(t, srv.Addr)
				addr = p.Addr
			}
			c := timedClient(t, redis.Options{Addr: addr})
			var logs logtest.Log
			s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), MaxBatch: tc.maxBatch, Logger: logs.TextLogger()})
			l := sluice.PerSecond(1_000_000)
			take := func(wait time.Duration) error {
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				defer cancel()
				_, err := s.Take(ctx, "k", l, 1)
				return err
			}
			if err := take(time.Second); err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.dropped:
				p.Drop(t)
			case tc.killed:
				srv.Stop()
			default:
				srv.Pause(t)
				t.Cleanup(func() { srv.Resume(t) })
			}
			// Callers' own deadlines, long (told at once) and short
			// (confirmed by the Store's script).
			for i := range 20 {
				wait := 50 * time.Millisecond
				if i%2 == 1 {
					wait = 5 * time.Millisecond
				}
				if err := take(wait); err == nil {
					t.Fatal("a take answered with Redis down")
				}
				time.Sleep(10 * time.Millisecond)
			}
			settle := 300 * time.Millisecond // any confirmation under way ends
			if tc.dropped {
				settle += time.Second // and the Store's dial, which times out
			}
			time.Sleep(settle)
			told := strings.Contains(logs.String(), "Redis stopped answering")
			t.Logf("%d stalls, log:\n%s", s.Stalls(), logs.String())
			switch {
			case tc.killed && (told || s.Stalls() != 0):
				t.Errorf("a killed Redis told as stalled: Stalls() = %d", s.Stalls())
			case !tc.killed && (!told || s.Stalls() == 0):
				t.Errorf("a stopped Redis not told as stalled: Stalls() = %d", s.Stalls())
			}
		})
	}
}
