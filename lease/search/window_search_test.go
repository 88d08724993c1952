package search_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/storetest"
)

// windowViolation checks FixedWindow (count per store window ≤ Rate) and
// SlidingWindowCounter (prev·weight + cur ≤ Rate at every admission), for
// windows with no Reset within D before them or in them.
func (w *world) windowViolation(l sluice.Limit, d time.Duration) string {
	P := l.Period.Microseconds()
	base := storetest.T0.UnixMicro()
	dd := d.Microseconds()
	win := func(x int64) int64 { return (base + x) / P } // T0 > 0
	start := func(wi int64) int64 { return wi*P - base } // µs after T0
	clean := func(from, to int64) bool {
		for _, R := range w.resets {
			if R >= from-dd && R <= to {
				return false
			}
		}
		return true
	}
	per := map[int64]int64{}
	for _, x := range w.admit {
		per[win(x)]++
	}
	if l.Algorithm == sluice.FixedWindow {
		for wi, n := range per {
			if n > l.Rate && clean(start(wi), start(wi+1)) {
				return fmt.Sprintf("window starting %dµs admitted %d > %d", start(wi), n, l.Rate)
			}
		}
		return ""
	}
	cnt := map[int64]int64{}
	for _, x := range w.admit {
		wi := win(x)
		cnt[wi]++
		if !clean(start(wi-1), x) {
			continue
		}
		el := base + x - wi*P
		est := float64(cnt[wi-1])*float64(P-el)/float64(P) + float64(cnt[wi])
		if est > float64(l.Rate)+1e-9 {
			return fmt.Sprintf("estimate %.4f > %d at %dµs (prev %d cur %d)", est, l.Rate, x, cnt[wi-1], cnt[wi])
		}
	}
	return ""
}

func TestSearchWindows(t *testing.T) {
	for _, v := range variants {
		for _, alg := range []sluice.Algorithm{sluice.FixedWindow, sluice.SlidingWindowCounter} {
			t.Run(v.name+"/"+alg.String(), func(t *testing.T) {
				peekBad, full := 0, 0
				for seed := range uint64(seeds()) {
					r := rand.New(rand.NewPCG(seed, uint64(alg)+100*uint64(len(v.name))))
					g := v.g(r)
					c, l := g.config(alg)
					ops := g.schedule(c)
					w := newWorld(t, c)
					w.run(t, l, sluice.PerSecond(3), ops)
					if msg := w.windowViolation(l, c.d); msg != "" {
						t.Fatalf("seed %d: %v D=%v sizes=%v offs=%v fleet=%v: %s\nops=%v", seed, l, c.d, c.sizes, c.offs, c.fleet, msg, ops)
					}
					if len(w.peekBad) > 0 {
						peekBad++
						if peekBad <= 3 {
							t.Errorf("seed %d: %v D=%v sizes=%v offs=%v: peek/take mismatch: %v", seed, l, c.d, c.sizes, c.offs, w.peekBad)
						}
					}
					if len(w.admit) > 0 {
						full++
					}
				}
				if peekBad > 0 {
					t.Errorf("%d schedules with Peek/Take mismatches", peekBad)
				}
			})
		}
	}
}

// TestReplay replays one schedule with a trace: REPLAY=variant/alg/seed.
func TestReplay(t *testing.T) {
	name, alg, seed, ok := replaySpec()
	if !ok {
		t.Skip("REPLAY unset")
	}
	r := rand.New(rand.NewPCG(seed, uint64(alg)+100*uint64(len(name))))
	g := gen{r: r, all: name != "plain", skew: name == "skew", resets: name == "reset"}
	c, l := g.config(alg)
	ops := g.schedule(c)
	w := newWorld(t, c)
	w.trace = true
	t.Logf("%v D=%v sizes=%v offs=%v fleet=%v", l, c.d, c.sizes, c.offs, c.fleet)
	w.run(t, l, sluice.PerSecond(3), ops)
	t.Logf("violation: %q %q peekBad %v", w.violation(l, c.d), w.windowViolation(l, c.d), w.peekBad)
}

func replaySpec() (string, sluice.Algorithm, uint64, bool) {
	spec := os.Getenv("REPLAY")
	if spec == "" {
		return "", 0, 0, false
	}
	parts := strings.Split(spec, "/")
	var alg sluice.Algorithm
	for _, a := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket, sluice.FixedWindow, sluice.SlidingWindowCounter} {
		if a.String() == parts[1] {
			alg = a
		}
	}
	seed, _ := strconv.ParseUint(parts[2], 10, 64)
	return parts[0], alg, seed, true
}
