//go:build !race

// Package race tells tests whether the race detector is on. Timing tests
// (fault and fleet tests that assert how soon a timer fires) skip under
// it: it slows code unevenly, so their bounds would measure the detector.
// scripts/test runs them in a step of their own, without -race.
package race

// Enabled reports whether the binary was built with -race.
const Enabled = false
