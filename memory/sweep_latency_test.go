//go:build measure

package memory_test

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/latencytest"
	"github.com/sluicehq/sluice/memory"
)

// TestSweepLatency measures what a sweep of a large store costs the
// requests around it: SLUICE_SWEEP_KEYS keys of an hour's limit, then a
// goroutine taking from 1,000 other keys (in the same 64 shards), first
// alone, then while Sweep walks the store over and over (nothing expired),
// then while one Sweep removes every one of the keys, an hour later. It
// logs the requests' latency in each phase.
//
//	SLUICE_SWEEP_KEYS=1000000 go test -tags measure -run TestSweepLatency -v ./memory/
func TestSweepLatency(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SLUICE_SWEEP_KEYS"))
	if n <= 0 {
		t.Skip("SLUICE_SWEEP_KEYS not set")
	}
	var skew atomic.Int64 // added to the running clock
	s := memory.New(&memory.Options{
		MaxKeys:       2 * n,
		SweepInterval: -1,
		Clock:         func() time.Time { return time.Now().Add(time.Duration(skew.Load())) },
	})
	defer s.Close()
	ctx := context.Background()
	burst := sluice.PerHour(1)
	b := time.Now()
	for i := range n {
		if _, err := s.Take(ctx, "b"+strconv.Itoa(i), burst, 1); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("built %d keys in %v", s.Len(), time.Since(b))
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("s", i)
	}
	l := sluice.PerSecond(1_000_000)
	phase := func(name string, d time.Duration, during func()) {
		latencytest.Phase(t, name, keys, func(k string) error { _, err := s.Take(ctx, k, l, 1); return err }, d, during, func() string { return fmt.Sprintf("%d keys", s.Len()) })
	}
	phase("no sweep", 2*time.Second, nil)
	phase("sweeps, nothing expired", 0, func() {
		sweeps := 0
		for a := time.Now(); time.Since(a) < 2*time.Second; sweeps++ {
			s.Sweep()
		}
		t.Logf("%d sweeps", sweeps)
	})
	skew.Store(int64(2 * time.Hour))
	phase("one sweep removing every key", 0, s.Sweep)
}
