package server

import (
	"testing"

	"github.com/sluicehq/sluice"
)

func TestDemoConfig(t *testing.T) {
	cfg := DemoConfig()
	seen := map[sluice.Algorithm]bool{}
	for _, p := range cfg.Policies {
		seen[p.Limit.Algorithm] = true
		if p.Limit.Capacity() >= 10 {
			t.Errorf("%s: capacity %d: Burst 10 would show no denial", p.Name, p.Limit.Capacity())
		}
	}
	for _, a := range sluice.Algorithms() {
		if !seen[a] {
			t.Errorf("no demo policy for %v", a)
		}
	}
}
