package server

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestFaultBreakerProbedWhenStoreBack: the health check that finds Redis
// back probes the open breaker at once, even one whose probe has just
// failed, so the instance leaves its fallback within about a check of
// Redis's return, not a probe interval later: the fleet's stagger S, and
// the r·S it adds to the degraded bound, shrink. Six outages, Redis back at different points of the probe cycle; without it
// the breaker closed up to a probe interval after the check (596ms in
// one of five).
func TestFaultBreakerProbedWhenStoreBack(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	admin := r.Client(t)
	ctx := context.Background()
	sluiceUser(t, admin, "flaky")
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(slotsConfig), 0o600); err != nil {
		t.Fatal(err)
	}
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://flaky:pw@" + r.Addr + "/0", StoreCheckInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	var worst time.Duration
	for episode := range 6 {
		if err := admin.Do(ctx, "acl", "setuser", "flaky", "-@write").Err(); err != nil {
			t.Fatal(err)
		}
		for i := 0; !srv.health.Status().FallbackActive || !srv.health.storeDown(); i++ {
			if i == 400 {
				t.Fatalf("episode %d: the breaker never opened, or the store was never lost", episode)
			}
			if _, err := srv.Service().Check(ctx, "api", "ann", 1); err != nil {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Let a probe fail: the breaker's next one is then a probe interval away.
		time.Sleep(time.Duration(episode) * 170 * time.Millisecond)
		if err := admin.Do(ctx, "acl", "setuser", "flaky", "+@write").Err(); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		for srv.health.Status().FallbackActive {
			if time.Since(back) > 5*time.Second {
				t.Fatalf("episode %d: breaker still open 5s after Redis took writes again", episode)
			}
			time.Sleep(10 * time.Millisecond)
		}
		took := time.Since(back)
		t.Logf("episode %d: breaker closed %v after Redis took writes again", episode, took)
		worst = max(worst, took)
	}
	// A check every 100ms, then the probe: well under the probe interval.
	if worst > 400*time.Millisecond {
		t.Errorf("slowest close %v after Redis came back, want within 400ms (a check and a probe)", worst)
	}
}
