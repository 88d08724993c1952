package search_test

// Search with store calls "in flight": a wrapper granter advances the
// clock before and/or after the memory store answers, and runs other
// requests (other processes', and the same process's when the lease's
// refill lock is not held: Take, TakeAll and Peek) while the call is out.
// A TakeAll's grants go out together, on goroutines of their own: a top
// level op's calls take turns (the world's lock, which the first to come
// holds while its nested ops run), so the hook goes to either.

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

type hook struct {
	pre, post int64
	nested    []op
	owner     int
}

type iworld struct {
	mu      sync.Mutex   // a top-level op's store calls, which a TakeAll sends at once
	now     atomic.Int64 // µs after T0; the leases' clocks read it from the grants' goroutines
	mem     *memory.Store
	procs   []*lease.Store
	admit   []int64
	resets  []int64
	hooks   []*hook // one per op being run (a stack)
	lastTk  []int64 // per stack level: the store time of the last Take/TakeAll of k, −1 none
	peekBad []string
	trace   bool
	t       testing.TB
	l, l2   sluice.Limit
}

// wrap is the granter each process sees.
type wrap struct {
	w    *iworld
	proc int
}

// nested marks the context of a nested op's calls, which run while the
// call that runs them holds the world's lock.
type nested struct{}

func (g *wrap) call(ctx context.Context, lockFree bool, f func()) {
	w := g.w
	if ctx.Value(nested{}) == nil {
		w.mu.Lock()
		defer w.mu.Unlock()
	}
	var h *hook
	if n := len(w.hooks); n > 0 && w.hooks[n-1] != nil && w.hooks[n-1].owner == g.proc {
		h = w.hooks[n-1]
		w.hooks[n-1] = nil // one-shot
	}
	if h != nil {
		w.now.Add(h.pre)
	}
	f()
	if h != nil {
		for _, o := range h.nested {
			if o.proc == g.proc && !lockFree {
				continue // would wait for the refill lock this call holds
			}
			w.execIn(context.WithValue(ctx, nested{}, true), iop{op: o})
		}
		w.now.Add(h.post)
	}
}

func (g *wrap) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (d sluice.Decision, err error) {
	g.call(ctx, true, func() {
		d, err = g.w.mem.Take(ctx, key, l, cost)
		if key == "k" {
			g.w.lastTk[len(g.w.lastTk)-1] = g.w.now.Load()
		}
	})
	return
}
func (g *wrap) Peek(ctx context.Context, key string, l sluice.Limit, cost int64) (d sluice.Decision, err error) {
	g.call(ctx, true, func() { d, err = g.w.mem.Peek(ctx, key, l, cost) })
	return
}
func (g *wrap) Reset(ctx context.Context, key string, l sluice.Limit) error {
	return g.w.mem.Reset(ctx, key, l)
}
func (g *wrap) TakeAll(ctx context.Context, reqs []sluice.Request) (ds []sluice.Decision, err error) {
	g.call(ctx, true, func() {
		ds, err = g.w.mem.TakeAll(ctx, reqs)
		for _, r := range reqs {
			if r.Key == "k" {
				g.w.lastTk[len(g.w.lastTk)-1] = g.w.now.Load()
			}
		}
	})
	return
}
func (g *wrap) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (gr sluice.Grant, err error) {
	g.call(ctx, false, func() { gr, err = g.w.mem.Grant(ctx, key, l, n) })
	return
}
func (g *wrap) Return(ctx context.Context, key string, l sluice.Limit, gr sluice.Grant, unused int64) (n int64, err error) {
	g.call(ctx, false, func() { n, err = g.w.mem.Return(ctx, key, l, gr, unused) })
	return
}
func (g *wrap) Regrant(ctx context.Context, key string, l sluice.Limit, gr sluice.Grant, unused, n int64) (b int64, next sluice.Grant, err error) {
	g.call(ctx, false, func() { b, next, err = g.w.mem.Regrant(ctx, key, l, gr, unused, n) })
	return
}

func newIWorld(t testing.TB, c cfg, l, l2 sluice.Limit) *iworld {
	w := &iworld{t: t, l: l, l2: l2}
	w.mem = memory.New(&memory.Options{Clock: func() time.Time { return storetest.T0.Add(time.Duration(w.now.Load()) * time.Microsecond) }, SweepInterval: -1})
	t.Cleanup(func() { w.mem.Close() })
	for i, size := range c.sizes {
		off, fs := c.offs[i], c.fleet[i]
		s, err := lease.New(&wrap{w, i}, &lease.Options{MaxStaleness: c.d, Size: size,
			FleetSize: func() int { return fs },
			Clock:     func() time.Time { return storetest.T0.Add(time.Duration(w.now.Load()+off) * time.Microsecond) }})
		if err != nil {
			t.Fatal(err)
		}
		w.procs = append(w.procs, s)
	}
	return w
}

type iop struct {
	op
	h *hook
}

func (w *iworld) execH(o iop) { w.execIn(ctx, o) }

func (w *iworld) execIn(ctx context.Context, o iop) {
	t := w.t
	w.now.Store(max(w.now.Load(), o.at))
	start := w.now.Load()
	if o.h != nil {
		o.h.owner = o.proc
	}
	w.hooks = append(w.hooks, o.h)
	w.lastTk = append(w.lastTk, -1)
	defer func() {
		w.hooks = w.hooks[:len(w.hooks)-1]
		w.lastTk = w.lastTk[:len(w.lastTk)-1]
	}()
	p := w.procs[o.proc]
	when := func(src sluice.Source) int64 {
		if src == sluice.SourceLease {
			return start // a Take's local decisions are made before any call
		}
		if tk := w.lastTk[len(w.lastTk)-1]; tk >= 0 {
			return tk
		}
		return w.now.Load() // spent from a grant on its return
	}
	rec := func(ok bool, at int64, cost int64) {
		if ok {
			for range cost {
				w.admit = append(w.admit, at)
			}
		}
	}
	switch o.kind {
	case "take":
		d, err := p.Take(ctx, "k", w.l, o.cost)
		if err != nil {
			t.Fatal(err)
		}
		at := when(d.Source)
		if w.trace {
			t.Logf("%v @%d take -> %v rem %d src %v at %d", o.op, start, d.Allowed, d.Remaining, d.Source, at)
		}
		rec(d.Allowed, at, o.cost)
	case "peek":
		pd, err := p.Peek(ctx, "k", w.l, o.cost)
		if err != nil {
			t.Fatal(err)
		}
		pnow := w.now.Load()
		w.lastTk[len(w.lastTk)-1] = -1
		d, err := p.Take(ctx, "k", w.l, o.cost)
		if err != nil {
			t.Fatal(err)
		}
		at := when(d.Source)
		if d.Source == sluice.SourceLease {
			at = pnow
		}
		if w.trace {
			t.Logf("%v @%d peek -> %v; take -> %v src %v at %d", o.op, start, pd.Allowed, d.Allowed, d.Source, at)
		}
		if pd.Allowed != d.Allowed && o.h == nil {
			w.peekBad = append(w.peekBad, fmt.Sprintf("%v: peek %+v take %+v", o.op, pd, d))
		}
		rec(d.Allowed, at, o.cost)
	case "all":
		ds, err := p.TakeAll(ctx, []sluice.Request{{Key: "k", Limit: w.l, Cost: o.cost}, {Key: "k2", Limit: w.l2, Cost: o.cost2}})
		if err != nil {
			t.Fatal(err)
		}
		at := when(ds[0].Source)
		if ds[0].Source == sluice.SourceLease {
			at = w.now.Load() // spent when the request is admitted, after k2's calls
		}
		if w.trace {
			t.Logf("%v @%d all -> %v %v src %v at %d", o.op, start, ds[0].Allowed, ds[1].Allowed, ds[0].Source, at)
		}
		rec(ds[0].Allowed && ds[1].Allowed, at, o.cost)
	case "close":
		if err := p.Close(ctx); err != nil {
			t.Fatal(err)
		}
	case "reset":
		if err := p.Reset(ctx, "k", w.l); err != nil {
			t.Fatal(err)
		}
		w.resets = append(w.resets, w.now.Load())
		if w.trace {
			t.Logf("%v @%d reset", o.op, start)
		}
	}
}

func (w *iworld) asWorld() *world {
	a := append([]int64(nil), w.admit...)
	sort.Slice(a, func(i, j int) bool { return a[i] < a[j] })
	return &world{admit: a, resets: w.resets}
}

func ischedule(g gen, c cfg) []iop {
	r := g.r
	base := g.schedule(c)
	iv := c.l.Interval().Microseconds()
	dd := c.d.Microseconds()
	delay := func() int64 {
		switch r.IntN(5) {
		case 0:
			return 0
		case 1:
			return r.Int64N(iv + 1)
		case 2:
			return dd + r.Int64N(3) - 1
		case 3:
			return r.Int64N(dd + 1)
		default:
			return r.Int64N(3)
		}
	}
	var out []iop
	for _, o := range base {
		io := iop{op: o}
		if o.kind != "close" && o.kind != "reset" && r.IntN(3) == 0 {
			h := &hook{}
			if r.IntN(2) == 0 {
				h.pre = delay()
			}
			if r.IntN(2) == 0 {
				h.post = delay()
			}
			for range r.IntN(4) {
				n := op{proc: r.IntN(len(c.sizes)), kind: "take", cost: 1}
				if r.IntN(2) == 0 {
					n.cost = 1 + r.Int64N(c.l.Capacity())
				}
				if r.IntN(5) == 0 {
					n.kind = "peek"
				}
				h.nested = append(h.nested, n)
			}
			io.h = h
		}
		out = append(out, io)
	}
	return out
}

func TestSearchInflight(t *testing.T) {
	for _, v := range []string{"plain", "skew", "reset"} {
		for _, alg := range []sluice.Algorithm{sluice.GCRA, sluice.TokenBucket, sluice.LeakyBucket, sluice.FixedWindow, sluice.SlidingWindowCounter} {
			t.Run(v+"/"+alg.String(), func(t *testing.T) {
				bad := 0
				for seed := range uint64(seeds()) {
					r := rand.New(rand.NewPCG(seed, uint64(alg)+1000*uint64(len(v))))
					g := gen{r: r, all: true, skew: v == "skew", resets: v == "reset"}
					c, l := g.config(alg)
					ops := ischedule(g, c)
					w := newIWorld(t, c, l, sluice.PerSecond(3))
					for _, o := range ops {
						w.execH(o)
					}
					ww := w.asWorld()
					var msg string
					if windowed(alg) {
						msg = ww.windowViolation(l, c.d)
					} else {
						msg = ww.violation(l, c.d)
					}
					if msg != "" {
						t.Fatalf("seed %d: %v D=%v sizes=%v offs=%v fleet=%v: %s", seed, l, c.d, c.sizes, c.offs, c.fleet, msg)
					}
					if len(w.peekBad) > 0 && v != "reset" {
						bad++
						if bad <= 3 {
							t.Errorf("seed %d: %v D=%v sizes=%v offs=%v: peek/take mismatch: %v", seed, l, c.d, c.sizes, c.offs, w.peekBad)
						}
					}
				}
			})
		}
	}
}

func windowed(a sluice.Algorithm) bool {
	return a == sluice.FixedWindow || a == sluice.SlidingWindowCounter
}

// TestReplayInflight: REPLAY=variant/alg/seed with a trace.
func TestReplayInflight(t *testing.T) {
	v, alg, seed, ok := replaySpec()
	if !ok {
		t.Skip("REPLAY unset")
	}
	r := rand.New(rand.NewPCG(seed, uint64(alg)+1000*uint64(len(v))))
	g := gen{r: r, all: true, skew: v == "skew", resets: v == "reset"}
	c, l := g.config(alg)
	ops := ischedule(g, c)
	w := newIWorld(t, c, l, sluice.PerSecond(3))
	w.trace = true
	t.Logf("%v D=%v I=%v sizes=%v offs=%v fleet=%v", l, c.d, l.Interval(), c.sizes, c.offs, c.fleet)
	for _, o := range ops {
		if o.h != nil {
			t.Logf("  hook pre %d post %d nested %v", o.h.pre, o.h.post, o.h.nested)
		}
		w.execH(o)
	}
	ww := w.asWorld()
	t.Logf("violation %q / %q; peek %v", ww.violation(l, c.d), ww.windowViolation(l, c.d), w.peekBad)
}
