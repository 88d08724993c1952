// Package latencytest measures what a long operation (a sweep, a stats
// walk) costs the requests around it: a stream of calls on one goroutine,
// its latency logged per phase. The -tags measure tests of memory and
// lease use it.
package latencytest

import (
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Phase calls take with one of keys, chosen at random, over and over on a
// goroutine while during runs (or for d when during is nil), and logs the
// calls' latency under name: p50 to max, and extra.
func Phase(t testing.TB, name string, keys []string, take func(key string) error, d time.Duration, during func(), extra func() string) {
	t.Helper()
	var (
		stop atomic.Bool
		lats []time.Duration
		wg   sync.WaitGroup
	)
	wg.Go(func() {
		r := rand.New(rand.NewPCG(1, 2))
		for !stop.Load() {
			a := time.Now()
			if err := take(keys[r.IntN(len(keys))]); err != nil {
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
	if len(lats) == 0 {
		t.Errorf("%s: no request answered", name)
		return
	}
	slices.Sort(lats)
	q := func(p float64) time.Duration { return lats[int(p*float64(len(lats)-1))] }
	more := ""
	if extra != nil {
		more = "; " + extra()
	}
	t.Logf("%s (%v): %d requests: p50 %v, p99 %v, p99.9 %v, p99.99 %v, max %v%s",
		name, took.Round(time.Millisecond), len(lats), q(.5), q(.99), q(.999), q(.9999), lats[len(lats)-1], more)
}
