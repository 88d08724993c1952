package memory

import (
	"math/rand/v2"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/table"
)

// gcraState is a GCRA key's state as its table holds it: the TAT
// (state.a) and the fill. A GCRA state expires at its TAT (a decision
// that takes sets state.expires to it, one that does not leaves both), so
// the TAT alone is kept: 16 bytes, a 32-byte slot, two to a cache line,
// where another algorithm's state takes a whole line. Over many keys the
// table is what a decision misses in the cache; GCRA, the default, keeps
// half as much of it.
type gcraState struct {
	tat  int64
	fill uint32
}

// ref is where a key's state lives in its shard: a GCRA key's slot (g) or
// another algorithm's (w); neither for a key the shard does not hold. It
// is valid until the shard's next insert.
type ref struct {
	g *gcraState
	w *state
}

// find returns key's ref under algorithm a.
func (sh *shard) find(tag uint32, key string, a sluice.Algorithm) ref {
	if a == sluice.GCRA {
		return ref{g: sh.gcra.Find(tag, key)}
	}
	return ref{w: sh.tab.Find(tag, key)}
}

func (r ref) found() bool { return r.g != nil || r.w != nil }

// get returns the key's state as the algorithms read it (a sliding log's
// ring is shared, not copied).
func (r ref) get() state {
	if r.g != nil {
		return state{a: r.g.tat, fill: r.g.fill, expires: r.g.tat}
	}
	return *r.w
}

// set stores st as the key's state. A GCRA state's expires is its TAT, or
// zero with it (cleared).
func (r ref) set(st *state) {
	if r.g != nil {
		r.g.tat, r.g.fill = st.a, st.fill
		return
	}
	*r.w = *st
}

// add stores st under key and a, which must be absent, and returns its ref.
func (sh *shard) add(tag uint32, key string, a sluice.Algorithm, st *state) ref {
	if a == sluice.GCRA {
		return ref{g: sh.gcra.Add(tag, key, gcraState{tat: st.a, fill: st.fill})}
	}
	return ref{w: sh.tab.Add(tag, key, *st)}
}

// remove deletes key under a and reports whether it was there.
func (sh *shard) remove(tag uint32, key string, a sluice.Algorithm) bool {
	if a == sluice.GCRA {
		return sh.gcra.Remove(tag, key)
	}
	return sh.tab.Remove(tag, key)
}

// A candidate is a key eviction may remove: slot i of the GCRA table (g)
// or of the other.
type candidate struct {
	g bool
	i int
}

// sample returns up to table.SampleSize live keys of sh, drawn from both
// tables: each pick is a GCRA key or another in proportion to the keys
// left in each, in random order, so that every key is as likely to be
// sampled, and a sample of one table holds the other's keys too. Drawn
// from one table alone (a table picked per sample), a sample was all a
// small table's keys whenever it was that table's: a flood of GCRA keys
// into a full shard evicted the few token-bucket keys that had taken
// their whole limit, one sample in every few dozen.
func (sh *shard) sample() (c [table.SampleSize]candidate, n int) {
	ng, nw := sh.gcra.Len(), sh.tab.Len()
	var fromG [table.SampleSize]bool
	k := 0 // GCRA picks
	for i := range min(table.SampleSize, ng+nw) {
		// Without replacement: ng-k GCRA keys of the ng+nw-i left.
		fromG[i] = rand.IntN(ng+nw-i) < ng-k
		if fromG[i] {
			k++
		}
		n++
	}
	var gi, wi [table.SampleSize]int
	if k > 0 {
		gi, _ = sh.gcra.Sample() // min(SampleSize, ng) ≥ k keys
	}
	if k < n {
		wi, _ = sh.tab.Sample() // min(SampleSize, nw) ≥ n-k keys
	}
	g, w := 0, 0
	for i := range n {
		if fromG[i] {
			c[i] = candidate{true, gi[g]}
			g++
		} else {
			c[i] = candidate{false, wi[w]}
			w++
		}
	}
	return c, n
}

// key is candidate c's key, at its state, and drop removes it.
func (sh *shard) key(c candidate) string {
	if c.g {
		return sh.gcra.Key(c.i)
	}
	return sh.tab.Key(c.i)
}

func (sh *shard) at(c candidate) state {
	if c.g {
		return ref{g: sh.gcra.At(c.i)}.get()
	}
	return *sh.tab.At(c.i)
}

func (sh *shard) drop(c candidate) {
	if c.g {
		sh.gcra.Bury(c.i)
	} else {
		sh.tab.Bury(c.i)
	}
}
