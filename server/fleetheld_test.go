package server

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// An instance that crashed leaves its last report in Redis until the
// report expires (10 s): the others count its slots no longer than their
// holds, when the store frees them, rather than until then.
func TestHeldFiguresEndAtHold(t *testing.T) {
	client := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr})
	t.Cleanup(func() { client.Close() })
	clock := newFakeClock()
	prefix := redistest.Prefix(t) + "fleet"
	const cfg = `
policies:
  - name: jobs
    in_flight: {max: 10, hold: 4s}
`
	a, b := newMemService(t, cfg, clock), newMemService(t, cfg, clock)
	fa, fb := NewFleet(client, a, &FleetOptions{Prefix: prefix}), NewFleet(client, b, &FleetOptions{Prefix: prefix})
	held := func() int64 {
		t.Helper()
		publish(t, fa)
		for _, p := range a.mon.overview(a.Stats().Snapshot()).Policies {
			if p.Policy == "jobs" {
				return p.Held
			}
		}
		t.Fatal("no jobs policy in the overview")
		return 0
	}
	acquire := func(svc *Service, w int64) {
		t.Helper()
		if res, err := svc.Acquire(context.Background(), "jobs", "ann", w, sluice.PriorityCritical); err != nil || !res.Decision.Allowed {
			t.Fatalf("acquire %d: %+v, %v", w, res.Decision, err)
		}
	}
	acquire(b, 5) // held until t0+4s
	clock.Advance(3 * time.Second)
	acquire(b, 1)  // until t0+7s
	acquire(a, 2)  // until t0+7s
	publish(t, fb) // b's last report: b crashes
	if n := held(); n != 8 {
		t.Fatalf("held %d at t0+3s, want 8", n)
	}
	clock.Advance(2 * time.Second) // t0+5s: b's report is fresh, its weight 5 freed
	if n := held(); n != 3 {
		t.Errorf("held %d at t0+5s, after the hold of b's weight 5, want 3", n)
	}
	clock.Advance(3 * time.Second) // t0+8s: every hold has passed
	if n := held(); n != 0 {
		t.Errorf("held %d at t0+8s, after every hold, want 0", n)
	}
}
