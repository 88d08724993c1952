package holdmax

import (
	"sync"
	"testing"
	"time"
)

// A Max only rises, in whole microseconds; its argument follows it.
func TestMax(t *testing.T) {
	t.Parallel()
	var m Max
	for _, step := range []struct {
		cover time.Duration
		us    int64
		arg   string
	}{
		{0, 0, "0"},
		{-time.Second, 0, "0"},
		{999 * time.Nanosecond, 0, "0"},
		{30 * time.Second, 30_000_000, "30000000"},
		{time.Second, 30_000_000, "30000000"},
		{30*time.Second + 1500*time.Nanosecond, 30_000_001, "30000001"},
		{time.Minute, 60_000_000, "60000000"},
		{time.Minute, 60_000_000, "60000000"},
	} {
		m.Cover(step.cover)
		if got, want := m.Micros(), step.us; got != want {
			t.Errorf("after Cover(%v): Micros() = %d, want %d", step.cover, got, want)
		}
		if got, want := m.Arg(), any(step.arg); got != want {
			t.Errorf("after Cover(%v): Arg() = %v, want %q", step.cover, got, want)
		}
	}
}

// Covers racing each other leave the longest, with its own argument.
func TestMaxConcurrent(t *testing.T) {
	t.Parallel()
	var m Max
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 1000 {
				m.Cover(time.Duration(i*8+g) * time.Microsecond)
				if a, us := m.Arg().(string), m.Micros(); a == "" || us < 0 {
					t.Errorf("Arg %q, Micros %d", a, us)
					return
				}
			}
		})
	}
	wg.Wait()
	if got, want := m.Micros(), int64(999*8+7); got != want {
		t.Errorf("Micros() = %d, want %d", got, want)
	}
	if got, want := m.Arg(), any("7999"); got != want {
		t.Errorf("Arg() = %v, want %q", got, want)
	}
}

// Reading a raised Max allocates nothing.
func TestMaxArgNoAlloc(t *testing.T) {
	var m Max
	m.Cover(time.Second)
	if n := testing.AllocsPerRun(100, func() {
		m.Cover(time.Millisecond)
		_ = m.Arg()
	}); n != 0 {
		t.Errorf("Cover and Arg allocate %v times, want 0", n)
	}
}
