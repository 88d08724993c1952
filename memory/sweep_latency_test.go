//go:build measure

package memory_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
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
	// phase runs the request stream while during runs, or for d if during
	// is nil, and logs its latency.
	phase := func(name string, d time.Duration, during func()) {
		var (
			stop atomic.Bool
			lats []time.Duration
			wg   sync.WaitGroup
		)
		wg.Go(func() {
			r := rand.New(rand.NewPCG(1, 2))
			for !stop.Load() {
				a := time.Now()
				if _, err := s.Take(ctx, keys[r.IntN(len(keys))], l, 1); err != nil {
					t.Error(err)
					return
				}
				lats = append(lats, time.Since(a))
			}
		})
		time.Sleep(50 * time.Millisecond) // the stream is running
		a := time.Now()
		if during != nil {
			during()
		} else {
			time.Sleep(d)
		}
		took := time.Since(a)
		stop.Store(true)
		wg.Wait()
		slices.Sort(lats)
		q := func(p float64) time.Duration { return lats[int(p*float64(len(lats)-1))] }
		t.Logf("%s (%v): %d requests: p50 %v, p99 %v, p99.9 %v, p99.99 %v, max %v; %d keys",
			name, took.Round(time.Millisecond), len(lats), q(.5), q(.99), q(.999), q(.9999), lats[len(lats)-1], s.Len())
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
