// Package openloop drives a limiter with requests arriving on their own
// schedule (periodic, or seeded Poisson arrivals), each held at most a
// deadline, and checks the wait line's promise:
// no request held to its deadline and then refused, and no more admitted
// than the limit allows.
package openloop

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// Outcome is one request: when it arrived and was answered, and whether
// it was admitted.
type Outcome struct {
	Start, End time.Time
	Allowed    bool
}

// Poisson returns the arrival times of requests at rate per second for
// dur, at seeded exponential intervals.
func Poisson(seed uint64, rate float64, dur time.Duration) []time.Duration {
	rng := rand.New(rand.NewPCG(seed, seed))
	var at []time.Duration
	for t := time.Duration(0); t < dur; t += time.Duration(rng.ExpFloat64() / rate * float64(time.Second)) {
		at = append(at, t)
	}
	return at
}

// Periodic returns arrival times every 1/rate seconds for dur: at twice a
// GCRA limit's rate, every other request arrives just as a unit comes
// back, which is when a newcomer that took first would beat the line's
// head to it.
func Periodic(rate float64, dur time.Duration) []time.Duration {
	var at []time.Duration
	for i := 0; time.Duration(float64(i)/rate*float64(time.Second)) < dur; i++ {
		at = append(at, time.Duration(float64(i)/rate*float64(time.Second)))
	}
	return at
}

// Replay replays, in a parallel subtest per schedule (20 requests a
// second for 4s, periodic and seeded Poisson), the requests that
// newRequest(t, name) returns a function to answer, and checks their
// outcomes under limit (see Check): refusals within 100ms, none admitted
// beyond the limit.
func Replay(t *testing.T, seed uint64, limit sluice.Limit, newRequest func(t *testing.T, name string) func() bool) {
	for name, arrivals := range map[string][]time.Duration{
		"periodic": Periodic(20, 4*time.Second),
		"poisson":  Poisson(seed, 20, 4*time.Second),
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			out := Run(arrivals, newRequest(t, name))
			Check(t, out, 100*time.Millisecond, int(limit.Capacity()), limit.Interval())
		})
	}
}

// Run starts a request at each arrival time, in its own goroutine, and
// returns their outcomes once all are answered. do answers one request:
// whether it was admitted.
func Run(arrivals []time.Duration, do func() bool) []Outcome {
	var (
		mu  sync.Mutex
		out []Outcome
		wg  sync.WaitGroup
	)
	begin := time.Now()
	for _, at := range arrivals {
		time.Sleep(time.Until(begin.Add(at)))
		wg.Go(func() {
			start := time.Now()
			ok := do()
			o := Outcome{Start: start, End: time.Now(), Allowed: ok}
			mu.Lock()
			out = append(out, o)
			mu.Unlock()
		})
	}
	wg.Wait()
	return out
}

// Check fails t if more than one request in 50 (at least one) was held
// longer than atOnce and then refused (the line refuses at once what it
// cannot serve within the deadline; a timer that fires late on a loaded
// machine may still let a waiter's units come back just after it), or if
// more were admitted in some stretch of time than burst plus one per
// interval of it (plus one for the clock's slack in timing the answers).
// It fails too if none was held and admitted, or none refused: then the
// run did not test the line.
func Check(t *testing.T, out []Outcome, atOnce time.Duration, burst int, interval time.Duration) {
	t.Helper()
	var (
		held, refused []time.Duration
		admitted      []time.Time
		waited        int
	)
	for _, o := range out {
		took := o.End.Sub(o.Start)
		if !o.Allowed {
			refused = append(refused, took)
			if took > atOnce {
				held = append(held, took)
			}
			continue
		}
		admitted = append(admitted, o.End)
		if took > interval/2 {
			waited++
		}
	}
	slices.Sort(refused)
	t.Logf("%d requests: %d admitted (%d after waiting), %d refused (longest after %v), %d held and then refused",
		len(out), len(admitted), waited, len(refused), last(refused), len(held))
	if most := max(1, len(out)/50); len(held) > most {
		t.Errorf("%d requests held and then refused, after %v; want at most %d refused later than %v", len(held), held, most, atOnce)
	}
	if waited == 0 || len(refused) == 0 {
		t.Errorf("%d admitted after waiting, %d refused: the line was not tested", waited, len(refused))
	}
	slices.SortFunc(admitted, func(a, b time.Time) int { return a.Compare(b) })
	for i := range admitted {
		for j := i; j < len(admitted); j++ {
			span := admitted[j].Sub(admitted[i])
			if n, most := j-i+1, burst+int(span/interval)+1; n > most {
				t.Errorf("%d admitted within %v, want at most %d", n, span, most)
				return
			}
		}
	}
}

func last(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[len(d)-1]
}

// Paced runs callers goroutines for d, each calling do(c, i) for its i-th
// request every period (from a random phase), the first caller at once
// and the others joining one by one over ramp, and waits for them. do
// returns how long its request took; Paced returns every such time,
// sorted.
func Paced(callers int, period, ramp, d time.Duration, do func(c, i int) time.Duration) []time.Duration {
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for c := range callers {
		wg.Go(func() {
			next := time.Now().Add(ramp*time.Duration(c)/time.Duration(callers) + time.Duration(rand.Int64N(int64(period))))
			for i := 0; ; i++ {
				time.Sleep(time.Until(next))
				if !time.Now().Before(end) {
					return
				}
				next = next.Add(period)
				took := do(c, i)
				mu.Lock()
				lat = append(lat, took)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(lat)
	return lat
}
