//go:build unix

package server

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
)

// TestFleetMixedLimits: two `sluice serve` on one Redis hold different
// limits for the same policies, as during a config rollout; requests on
// one key alternate between them. Each limit counts in keys of its own,
// so the fleet admits at most the sum of the two limits per period (state
// shared across the two limits was read as stale by each instance in
// turn, and every request was admitted).
func TestFleetMixedLimits(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	write := func(name, yaml string) string {
		file := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(file, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		return file
	}
	type policy struct {
		name, a, b string
		n          int64         // each limit's count
		period     time.Duration // the shorter period
	}
	policies := []policy{
		{"gcra", "gcra 5/1s", "gcra 5/1d", 5, time.Second},
		{"fixed_window", "fixed_window 5/1s", "fixed_window 5/1d", 5, time.Second},
		{"sliding_window_counter", "sliding_window_counter 5/1s", "sliding_window_counter 5/1d", 5, time.Second},
		{"fixed_window_m", "fixed_window 10/1m", "fixed_window 10/10m", 10, time.Minute},
		{"sliding_window_counter_m", "sliding_window_counter 10/1m", "sliding_window_counter 10/10m", 10, time.Minute},
	}
	var cfgA, cfgB string
	for _, p := range policies {
		cfgA += fmt.Sprintf("  - name: %s\n    limit: %s\n", p.name, p.a)
		cfgB += fmt.Sprintf("  - name: %s\n    limit: %s\n", p.name, p.b)
	}
	args := func(file string) []string {
		return []string{"--config", file, "--redis", r.url(), "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0"}
	}
	procs := []*proc{
		startSluice(t, nil, args(write("a.yaml", "policies:\n"+cfgA))...),
		startSluice(t, nil, args(write("b.yaml", "policies:\n"+cfgB))...),
	}
	const rounds = 40
	admitted := make([]int64, len(policies))
	start := time.Now()
	for i := range rounds {
		p := procs[i%2]
		for j, pol := range policies {
			switch code, body := p.post(t, "/v1/check", `{"policy":"`+pol.name+`","key":"k"}`); code {
			case 200:
				admitted[j]++
			case 429:
			default:
				t.Fatalf("check %s on instance %d: %d %v", pol.name, i%2, code, body)
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	elapsed := time.Since(start)
	for j, p := range policies {
		// The longer limit admits n; the shorter n per period it spans
		// (plus one: a window boundary, or GCRA's burst).
		bound := p.n + p.n*(int64(elapsed/p.period)+2)
		t.Logf("%s (%s vs %s): %d of %d admitted in %v, bound %d", p.name, p.a, p.b, admitted[j], rounds, elapsed.Round(time.Millisecond), bound)
		if admitted[j] > bound {
			t.Errorf("%s (%s vs %s): %d of %d admitted in %v, want at most %d", p.name, p.a, p.b, admitted[j], rounds, elapsed.Round(time.Millisecond), bound)
		}
	}
	// A reset resets the key of the limit in force where it is asked.
	if code, body := procs[1].post(t, "/v1/reset", `{"policy":"fixed_window","key":"k"}`); code != 204 {
		t.Fatalf("reset: %d %v", code, body)
	}
	if code, _ := procs[1].post(t, "/v1/check", `{"policy":"fixed_window","key":"k"}`); code != 200 {
		t.Errorf("check after a reset: %d, want 200", code)
	}
}
