package race

import "testing"

// SkipTiming skips a test that asserts time bounds when the race detector
// is on; scripts/test runs such tests again without it.
func SkipTiming(t testing.TB) {
	t.Helper()
	if Enabled {
		t.Skip("timing test: runs without -race (scripts/test's fault and fleet step)")
	}
}
