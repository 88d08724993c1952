package memory

import (
	"math/rand/v2"

	"github.com/sluicehq/sluice"
)

// table is one shard's keys: a small open-addressing index (linear
// probing, 8 bytes a slot) over the states, which sit in a slice in the
// order their keys arrived. The index is a third the size of a Go map of
// pointers, so more of it stays in cache, and the key's hash, already
// computed to pick the shard, is not computed again. The caller holds the
// shard's lock.
type table struct {
	index []uint64 // a power of two long, or nil; see slotOf
	used  int      // index slots live or tombstones: the load that lengthens probes
	ents  []entry
	free  []uint32 // indexes of ents no key holds
}

// entry is one key's state under one algorithm.
type entry struct {
	key string
	st  state
}

// An index slot is empty (0), a tombstone (a deleted key, which probes
// pass over), or tag<<32 | (the entry's index + 1).
const tombstone = ^uint64(0)

// tagOf is key's tag under a, from the key's hash h: its high half, which
// the shard (picked by the low bits) does not use, mixed with a.
func tagOf(h uint64, a sluice.Algorithm) uint32 { return uint32(h>>32) ^ uint32(a)*0x9e3779b9 }

func live(slot uint64) bool { return slot != 0 && slot != tombstone }

// find returns key's state, or nil. It is valid until the next add.
func (t *table) find(tag uint32, key string) *state {
	if i := t.lookup(tag, key); i >= 0 {
		return &t.ents[uint32(t.index[i])-1].st
	}
	return nil
}

// lookup returns key's index slot, or -1.
func (t *table) lookup(tag uint32, key string) int {
	if t.index == nil {
		return -1
	}
	mask := len(t.index) - 1
	for i := int(tag) & mask; ; i = (i + 1) & mask {
		slot := t.index[i]
		if slot == 0 {
			return -1
		}
		if uint32(slot>>32) == tag && slot != tombstone && t.ents[uint32(slot)-1].key == key {
			return i
		}
	}
}

// add stores st for key, which must be absent, and returns where it now
// lives (valid until the next add).
func (t *table) add(tag uint32, key string, st state) *state {
	if 4*(t.used+1) > 3*len(t.index) {
		t.rehash()
	}
	var e uint32
	if n := len(t.free); n > 0 {
		e, t.free = t.free[n-1], t.free[:n-1]
		t.ents[e] = entry{key: key, st: st}
	} else {
		e = uint32(len(t.ents))
		t.ents = append(t.ents, entry{key: key, st: st})
	}
	t.place(uint64(tag)<<32 | uint64(e+1))
	return &t.ents[e].st
}

// place puts slot in the first free index slot of its probe.
func (t *table) place(slot uint64) {
	mask := len(t.index) - 1
	i := int(slot>>32) & mask
	for live(t.index[i]) {
		i = (i + 1) & mask
	}
	if t.index[i] == 0 {
		t.used++
	}
	t.index[i] = slot
}

// remove deletes key and reports whether it was there.
func (t *table) remove(tag uint32, key string) bool {
	i := t.lookup(tag, key)
	if i < 0 {
		return false
	}
	t.bury(i)
	return true
}

// bury deletes the key in index slot i. The slot becomes empty when no
// probe passes it (the next slot is empty), else a tombstone.
func (t *table) bury(i int) {
	e := uint32(t.index[i]) - 1
	t.ents[e] = entry{}
	t.free = append(t.free, e)
	if t.index[(i+1)&(len(t.index)-1)] == 0 {
		t.index[i] = 0
		t.used--
		return
	}
	t.index[i] = tombstone
}

// rehash rebuilds the index at a load of at most a half (at least 16
// slots), dropping the tombstones; add rehashes again at 3/4. An index
// that small stays in cache, and linear probes at that load stay short.
func (t *table) rehash() {
	n := 16
	for n < 2*(len(t.ents)-len(t.free)+1) {
		n <<= 1
	}
	old := t.index
	t.index, t.used = make([]uint64, n), 0
	for _, slot := range old {
		if live(slot) {
			t.place(slot)
		}
	}
}

// state returns the state in index slot i, which must be live.
func (t *table) state(i int) *state { return &t.ents[uint32(t.index[i])-1].st }

// sampleSize is how many keys eviction compares, as Redis's
// maxmemory-samples does.
const sampleSize = 5

// sample returns up to sampleSize live index slots (n of them), from a
// random place on, for eviction.
func (t *table) sample() (idx [sampleSize]int, n int) {
	if len(t.index) == 0 {
		return idx, 0
	}
	mask := len(t.index) - 1
	start := rand.IntN(len(t.index))
	for j := 0; j < len(t.index) && n < sampleSize; j++ {
		if i := (start + j) & mask; live(t.index[i]) {
			idx[n] = i
			n++
		}
	}
	return idx, n
}
