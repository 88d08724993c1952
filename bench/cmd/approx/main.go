// Command approx measures what sluice's approximations cost, with numbers
// README.md and docs/algorithms.md quote:
//
//   - the sliding window counter against an exact sliding window log, on a
//     one-hour trace of 1,000 clients (a light and a heavy traffic mix):
//     the share of decisions that differ, and the most a client bursting
//     at a window edge gets through within one true sliding window;
//   - the sliding window log under a caller clock that steps backwards:
//     the admissions beyond the limit per step.
//
// Both run on the memory store, whose arithmetic the Redis scripts match
// (a differential test holds them to the same decisions). The traces are
// seeded, so every run prints the same numbers:
//
//	cd bench && go run ./cmd/approx
package main

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

var t0 = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// clock is the time the memory stores read; the command sets it before
// every call.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

// pair decides each request under both algorithms, each with its own store.
type pair struct {
	clk              clock
	log, counter     *memory.Store
	logLim, countLim sluice.Limit
}

func newPair(limit sluice.Limit) *pair {
	p := &pair{logLim: limit.WithAlgorithm(sluice.SlidingWindowLog), countLim: limit.WithAlgorithm(sluice.SlidingWindowCounter)}
	opts := &memory.Options{Clock: p.clk.Now, SweepInterval: -1, MaxKeys: 1 << 20}
	p.log, p.counter = memory.New(opts), memory.New(opts)
	return p
}

func (p *pair) close() { p.log.Close(); p.counter.Close() }

func take(s *memory.Store, key string, l sluice.Limit) bool {
	d, err := s.Take(context.Background(), key, l, 1)
	if err != nil {
		fmt.Fprintln(os.Stderr, "approx:", err)
		os.Exit(1)
	}
	return d.Allowed
}

// mix is a traffic mix: each client sends a Poisson stream at a rate
// drawn uniformly between lo and hi times the limit's rate.
type mix struct {
	name   string
	lo, hi float64
}

type result struct {
	requests, differ, counterMore, counterFewer int
}

func runMix(m mix, limit sluice.Limit, clients int, length time.Duration, seed uint64) result {
	p := newPair(limit)
	defer p.close()
	rng := rand.New(rand.NewPCG(seed, 0))
	perSecond := float64(limit.Rate) / limit.Period.Seconds()
	var r result
	for c := range clients {
		key := fmt.Sprintf("client-%d", c)
		rate := perSecond * (m.lo + rng.Float64()*(m.hi-m.lo))
		for t := time.Duration(0); ; {
			t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
			if t >= length {
				break
			}
			p.clk.now = t0.Add(t)
			a, b := take(p.log, key, p.logLim), take(p.counter, key, p.countLim)
			r.requests++
			if a != b {
				r.differ++
				if b {
					r.counterMore++
				} else {
					r.counterFewer++
				}
			}
		}
	}
	return r
}

// maxInWindow is the most of times (sorted) inside any interval of length w.
func maxInWindow(times []time.Duration, w time.Duration) int {
	best, lo := 0, 0
	for hi := range times {
		for times[hi]-times[lo] >= w {
			lo++
		}
		best = max(best, hi-lo+1)
	}
	return best
}

// edgeBurst is the worst a client gets through the sliding window counter
// within one true window: idle, then a flood (a request every
// period/1000) starting at every hundredth of a window, for three windows.
func edgeBurst(limit sluice.Limit) (ratio float64, offset float64) {
	l := limit.WithAlgorithm(sluice.SlidingWindowCounter)
	step := limit.Period / 1000
	for i := range 100 {
		var clk clock
		s := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
		start := 2*limit.Period + time.Duration(i)*limit.Period/100
		var admitted []time.Duration
		for t := start; t < start+3*limit.Period; t += step {
			clk.now = t0.Add(t)
			if take(s, "k", l) {
				admitted = append(admitted, t)
			}
		}
		s.Close()
		if r := float64(maxInWindow(admitted, limit.Period)) / float64(limit.Rate); r > ratio {
			ratio, offset = r, float64(i)/100
		}
	}
	return ratio, offset
}

// clockSteps: a client floods a sliding window log for one true window
// (a request every period/1000) while the caller's clock is wrong. With
// "back", the clock steps back by d once the limit is taken and stays
// behind; with "behind, then corrected", the clock is d behind while the
// limit is taken and then jumps to the true time (as a clock fixed by NTP
// does, or a second host whose clock is d ahead of the first). It returns
// the admissions beyond the limit within that one true window.
func clockSteps(limit sluice.Limit, d time.Duration, corrected bool) int {
	l := limit.WithAlgorithm(sluice.SlidingWindowLog)
	var clk clock
	s := memory.New(&memory.Options{Clock: clk.Now, SweepInterval: -1})
	defer s.Close()
	start := t0.Add(time.Hour)
	admitted := int64(0)
	step := limit.Period / 1000
	for t := start; t.Before(start.Add(limit.Period)); t = t.Add(step) {
		switch full := admitted >= limit.Rate; {
		case corrected && !full:
			clk.now = t.Add(-d) // behind while the limit is taken
		case !corrected && full:
			clk.now = t.Add(-d) // stepped back once the limit is taken
		default:
			clk.now = t
		}
		if take(s, "k", l) {
			admitted++
		}
	}
	return int(admitted - limit.Rate)
}

func main() {
	clients := flag.Int("clients", 1000, "clients in the trace")
	length := flag.Duration("length", time.Hour, "trace length")
	flag.Parse()
	limit := sluice.PerMinute(20)
	fmt.Printf("sliding_window_counter against an exact sliding_window_log, %d/%s per client,\n%d clients, %s of Poisson traffic (seeded):\n\n",
		limit.Rate, limit.Period, *clients, *length)
	fmt.Printf("%-6s %-22s %10s %8s %14s %14s\n", "mix", "rates (× the limit)", "requests", "differ", "counter more", "counter fewer")
	for i, m := range []mix{{"light", 0.1, 1.0}, {"heavy", 0.5, 3.0}} {
		r := runMix(m, limit, *clients, *length, uint64(i+1))
		fmt.Printf("%-6s %-22s %10d %7.1f%% %13.1f%% %13.1f%%\n", m.name, fmt.Sprintf("%.1f to %.1f", m.lo, m.hi), r.requests,
			100*float64(r.differ)/float64(r.requests), 100*float64(r.counterMore)/float64(r.requests), 100*float64(r.counterFewer)/float64(r.requests))
	}
	ratio, offset := edgeBurst(limit)
	fmt.Printf("\nworst burst at a window edge: the counter admits %.2f× the limit within one true sliding window\n(a flood starting %.0f%% into a window)\n", ratio, 100*offset)
	fmt.Printf("\nsliding_window_log, %d/%s, a client flooding for one true window under a wrong caller clock\n(admitted beyond the limit within that window):\n", limit.Rate, limit.Period)
	fmt.Printf("  %-10s %-22s %-26s\n", "step d", "steps back, stays", "d behind, then corrected")
	for _, d := range []time.Duration{time.Second, limit.Period / 2, limit.Period, 2 * limit.Period} {
		back, fixed := clockSteps(limit, d, false), clockSteps(limit, d, true)
		fmt.Printf("  %-10s %-22s %-26s\n", d, fmt.Sprintf("%d (%.2f× the limit)", back, float64(back)/float64(limit.Rate)),
			fmt.Sprintf("%d (%.2f× the limit)", fixed, float64(fixed)/float64(limit.Rate)))
	}
}
