package search_test

// Randomized adversarial search of lease's stated bounds (package lease doc):
// GCRA/TB/LB: at most B + ⌊(t+D)/I⌋ admitted over any closed interval of
// length t; a Peek at one instant decides as the Take after it.
//
// Run: go test ./lease/search -run TestSearch -v -count=1 (SEEDS=n to change).

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

var ctx = context.Background()

type op struct {
	at    int64 // µs after T0, global (store) time
	proc  int
	kind  string // take, peek, all, close, reset
	cost  int64
	cost2 int64
}

func (o op) String() string {
	return fmt.Sprintf("{%d p%d %s %d %d}", o.at, o.proc, o.kind, o.cost, o.cost2)
}

type world struct {
	now     int64 // µs after T0
	mem     *memory.Store
	procs   []*lease.Store
	offs    []int64
	admit   []int64 // times of admitted units on key k
	resets  []int64
	peekBad []string
	trace   bool
}

type cfg struct {
	l     sluice.Limit
	d     time.Duration
	sizes []int64
	offs  []int64
	fleet []int
}

func newWorld(t testing.TB, c cfg) *world {
	w := &world{}
	w.mem = memory.New(&memory.Options{Clock: func() time.Time { return storetest.T0.Add(time.Duration(w.now) * time.Microsecond) }, SweepInterval: -1})
	t.Cleanup(func() { w.mem.Close() })
	for i, size := range c.sizes {
		off := c.offs[i]
		fs := c.fleet[i]
		s, err := lease.New(w.mem, &lease.Options{MaxStaleness: c.d, Size: size,
			FleetSize: func() int { return fs },
			Clock:     func() time.Time { return storetest.T0.Add(time.Duration(w.now+off) * time.Microsecond) }})
		if err != nil {
			t.Fatal(err)
		}
		w.procs = append(w.procs, s)
		w.offs = append(w.offs, off)
	}
	return w
}

func (w *world) run(t testing.TB, l, l2 sluice.Limit, ops []op) {
	for _, o := range ops {
		w.now = o.at
		p := w.procs[o.proc]
		switch o.kind {
		case "take":
			d, err := p.Take(ctx, "k", l, o.cost)
			if err != nil {
				t.Fatal(err)
			}
			if w.trace {
				t.Logf("%v take -> %v rem %d src %v retry %v | %+v", o, d.Allowed, d.Remaining, d.Source, d.RetryAfter, p.Stats())
			}
			w.record(d.Allowed, o)
		case "peek":
			pd, err := p.Peek(ctx, "k", l, o.cost)
			if err != nil {
				t.Fatal(err)
			}
			d, err := p.Take(ctx, "k", l, o.cost)
			if err != nil {
				t.Fatal(err)
			}
			if w.trace {
				t.Logf("%v peek -> %v rem %d src %v; take -> %v rem %d src %v | %+v", o, pd.Allowed, pd.Remaining, pd.Source, d.Allowed, d.Remaining, d.Source, p.Stats())
			}
			if pd.Allowed != d.Allowed {
				w.peekBad = append(w.peekBad, fmt.Sprintf("%v: peek %+v take %+v", o, pd, d))
			}
			w.record(d.Allowed, o)
		case "all":
			ds, err := p.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: l, Cost: o.cost}, {Key: "k2", Limit: l2, Cost: o.cost2}})
			if err != nil {
				t.Fatal(err)
			}
			if w.trace {
				t.Logf("%v all -> %v %v src %v | %+v", o, ds[0].Allowed, ds[1].Allowed, ds[0].Source, p.Stats())
			}
			w.record(ds[0].Allowed && ds[1].Allowed, o)
		case "close":
			if err := p.Close(ctx); err != nil {
				t.Fatal(err)
			}
		case "reset":
			if err := p.Reset(ctx, "k", l); err != nil {
				t.Fatal(err)
			}
			w.resets = append(w.resets, o.at)
			if w.trace {
				t.Logf("%v reset", o)
			}
		}
	}
}

func (w *world) record(ok bool, o op) {
	if ok {
		for range o.cost {
			w.admit = append(w.admit, o.at)
		}
	}
}

// violation: the first closed interval [x_i, x_j] whose admissions exceed
// B + ⌊(t+D)/I⌋, with both ends in one reset segment (and, after a reset
// R, starting at ≥ R + D, when every lease granted before R has ended).
func (w *world) violation(l sluice.Limit, d time.Duration) string {
	iv := l.Interval().Microseconds()
	dd := d.Microseconds()
	if os.Getenv("SANITY") != "" {
		dd = dd * 3 / 4 // a deliberately wrong, tighter bound: the search must find it
	}
	segStart := func(x int64) (int64, int64) { // the segment's start, and its reset (−1 none)
		r := int64(-1)
		for _, R := range w.resets {
			if R <= x {
				r = R
			}
		}
		return r, r
	}
	a := w.admit
	for i := range a {
		ri, _ := segStart(a[i])
		if ri >= 0 && a[i] <= ri+dd {
			continue
		}
		for j := i; j < len(a); j++ {
			if rj, _ := segStart(a[j]); rj != ri {
				break
			}
			t := a[j] - a[i]
			n := int64(j - i + 1)
			// all units at a[j] count too
			for j+1 < len(a) && a[j+1] == a[j] {
				j++
				n++
			}
			if bound := l.Capacity() + (t+dd)/iv; n > bound {
				return fmt.Sprintf("%d admitted in [%d, %d] (t=%dµs), bound %d", n, a[i], a[j], t, bound)
			}
		}
	}
	return ""
}

type gen struct {
	r      *rand.Rand
	resets bool
	all    bool
	skew   bool
}

func (g gen) config(alg sluice.Algorithm) (cfg, sluice.Limit) {
	r := g.r
	periods := []time.Duration{time.Second, 700 * time.Millisecond, 999_999 * time.Microsecond}
	top := int64(8)
	if os.Getenv("BIG") != "" {
		top = 24
	}
	l := sluice.Limit{Algorithm: alg, Rate: 1 + r.Int64N(top), Period: periods[r.IntN(len(periods))], Burst: 1 + r.Int64N(top)}
	if r.IntN(4) == 0 || alg == sluice.FixedWindow || alg == sluice.SlidingWindowCounter {
		l.Burst = 0
	}
	var c cfg
	c.l = l
	pm := l.Period.Microseconds()
	switch r.IntN(4) {
	case 0:
		c.d = l.Period
	case 1:
		c.d = l.Interval() * time.Duration(1+r.Int64N(3))
		c.d = min(c.d, l.Period)
	default:
		c.d = time.Duration(1+r.Int64N(pm)) * time.Microsecond
	}
	n := 1 + r.IntN(4)
	for range n {
		sz := int64(0)
		if r.IntN(2) == 0 {
			sz = r.Int64N(l.Capacity() + 1)
		}
		c.sizes = append(c.sizes, sz)
		off := int64(0)
		if g.skew && r.IntN(2) == 0 {
			off = r.Int64N(2*pm) - pm
		}
		c.offs = append(c.offs, off)
		c.fleet = append(c.fleet, 1+r.IntN(3))
	}
	return c, l
}

func (g gen) schedule(c cfg) []op {
	r := g.r
	l := c.l
	iv := l.Interval().Microseconds()
	dd := c.d.Microseconds()
	pm := l.Period.Microseconds()
	var ops []op
	at := int64(0)
	var sends []int64
	for range 30 + r.IntN(90) {
		switch r.IntN(10) {
		case 0, 1, 2:
			// same instant
		case 3:
			at += r.Int64N(iv + 1)
		case 4:
			at += iv + r.Int64N(3) - 1
		case 5:
			if len(sends) > 0 { // relative to an earlier event: lease edges
				s := sends[r.IntN(len(sends))] + dd + r.Int64N(3) - 1
				at = max(at, s)
			}
		case 6:
			at += dd + r.Int64N(3) - 1
		default:
			at += r.Int64N(pm/2 + 1)
		}
		at = max(at, 0)
		sends = append(sends, at)
		o := op{at: at, proc: r.IntN(len(c.sizes)), kind: "take", cost: 1}
		if r.IntN(2) == 0 {
			o.cost = 1 + r.Int64N(l.Capacity())
		}
		switch x := r.IntN(40); {
		case x < 3:
			o.kind = "close"
		case x < 4 && g.resets:
			o.kind = "reset"
		case x < 12:
			o.kind = "peek"
		case x < 16 && g.all:
			o.kind = "all"
			o.cost2 = 1 + r.Int64N(3)
		}
		for range 1 + r.IntN(2) {
			ops = append(ops, o)
		}
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].at < ops[j].at })
	return ops
}

// seeds is how many schedules each search tries: SEEDS, else a number
// that keeps the suite to seconds (20,000 found nothing more).
func seeds() int {
	if s := os.Getenv("SEEDS"); s != "" {
		n, _ := strconv.Atoi(s)
		return n
	}
	if race.Enabled {
		return 60
	}
	return 500
}

// variants are the kinds of schedule every search tries.
var variants = []struct {
	name string
	g    func(r *rand.Rand) gen
}{
	{"plain", func(r *rand.Rand) gen { return gen{r: r} }},
	{"all", func(r *rand.Rand) gen { return gen{r: r, all: true} }},
	{"skew", func(r *rand.Rand) gen { return gen{r: r, skew: true, all: true} }},
	{"reset", func(r *rand.Rand) gen { return gen{r: r, resets: true, all: true} }},
}

func TestSearch(t *testing.T) {
	for _, v := range variants {
		for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket} {
			t.Run(v.name+"/"+alg.String(), func(t *testing.T) {
				peekBad, tight, total := 0, 0, 0
				for seed := range uint64(seeds()) {
					r := rand.New(rand.NewPCG(seed, uint64(alg)+100*uint64(len(v.name))))
					g := v.g(r)
					c, l := g.config(alg)
					ops := g.schedule(c)
					l2 := sluice.PerSecond(3)
					w := newWorld(t, c)
					w.run(t, l, l2, ops)
					if msg := w.violation(l, c.d); msg != "" {
						t.Fatalf("seed %d: %v D=%v sizes=%v offs=%v fleet=%v: %s\nops=%v", seed, l, c.d, c.sizes, c.offs, c.fleet, msg, ops)
					}
					total += len(w.admit)
					if len(w.resets) == 0 && w.tightest(l, c.d) == 0 {
						tight++
					}
					if len(w.peekBad) > 0 {
						peekBad++
						if peekBad <= 3 {
							t.Errorf("seed %d: %v D=%v sizes=%v offs=%v: peek/take mismatch: %s", seed, l, c.d, c.sizes, c.offs, strings.Join(w.peekBad, "; "))
						}
					}
				}
				t.Logf("tight (slack 0) schedules: %d, admitted units %d", tight, total)
				if peekBad > 0 {
					t.Errorf("%d schedules with Peek/Take mismatches", peekBad)
				}
			})
		}
	}
}

// tightest is the least slack (bound − admitted) over all intervals.
func (w *world) tightest(l sluice.Limit, d time.Duration) int64 {
	iv := l.Interval().Microseconds()
	dd := d.Microseconds()
	best := int64(1 << 60)
	a := w.admit
	for i := range a {
		for j := i; j < len(a); j++ {
			n := int64(j - i + 1)
			best = min(best, l.Capacity()+(a[j]-a[i]+dd)/iv-n)
		}
	}
	return best
}
