// Package table is the hash table under the memory store's states and the
// lease store's leases: a small open-addressing index (linear probing, 8
// bytes a slot) over entries kept in a slice in the order their keys
// arrived. The index is a third the size of a Go map of pointers, so more
// of it stays in cache, and the key's hash, which the caller has already
// computed to pick a shard, is not computed again: the caller passes a
// 32-bit tag taken from it. A Table is not safe for concurrent use.
package table

import "math/rand/v2"

// Table maps keys to values of type V. The zero value is empty and ready.
type Table[V any] struct {
	index []uint64 // a power of two long, or nil; see Live
	used  int      // index slots live or tombstones: the load that lengthens probes
	ents  []entry[V]
	free  []uint32 // indexes of ents no key holds
}

type entry[V any] struct {
	key string
	v   V
}

// An index slot is empty (0), a tombstone (a deleted key, which probes
// pass over), or tag<<32 | (the entry's index + 1).
const tombstone = ^uint64(0)

func live(slot uint64) bool { return slot != 0 && slot != tombstone }

// Find returns key's value, or nil. The pointer is valid until the next
// Add.
func (t *Table[V]) Find(tag uint32, key string) *V {
	if i := t.lookup(tag, key); i >= 0 {
		return &t.ents[uint32(t.index[i])-1].v
	}
	return nil
}

// lookup returns key's index slot, or -1.
func (t *Table[V]) lookup(tag uint32, key string) int {
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

// Add stores v for key, which must be absent, and returns where it now
// lives (valid until the next Add).
func (t *Table[V]) Add(tag uint32, key string, v V) *V {
	if 4*(t.used+1) > 3*len(t.index) {
		t.rehash()
	}
	var e uint32
	if n := len(t.free); n > 0 {
		e, t.free = t.free[n-1], t.free[:n-1]
		t.ents[e] = entry[V]{key: key, v: v}
	} else {
		e = uint32(len(t.ents))
		t.ents = append(t.ents, entry[V]{key: key, v: v})
	}
	t.place(uint64(tag)<<32 | uint64(e+1))
	return &t.ents[e].v
}

// place puts slot in the first free index slot of its probe.
func (t *Table[V]) place(slot uint64) {
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

// Remove deletes key and reports whether it was there.
func (t *Table[V]) Remove(tag uint32, key string) bool {
	i := t.lookup(tag, key)
	if i < 0 {
		return false
	}
	t.Bury(i)
	return true
}

// Bury deletes the key in index slot i, which must be live. The slot
// becomes empty when no probe passes it (the next slot is empty), else a
// tombstone. No other slot changes, so a walk over the slots may bury as
// it goes.
func (t *Table[V]) Bury(i int) {
	e := uint32(t.index[i]) - 1
	t.ents[e] = entry[V]{}
	t.free = append(t.free, e)
	if t.index[(i+1)&(len(t.index)-1)] == 0 {
		t.index[i] = 0
		t.used--
		return
	}
	t.index[i] = tombstone
}

// rehash rebuilds the index at a load of at most a half (at least 16
// slots), dropping the tombstones; Add rehashes again at 3/4. An index
// that small stays in cache, and linear probes at that load stay short.
func (t *Table[V]) rehash() {
	n := 16
	for n < 2*(t.Len()+1) {
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

// Len is the number of keys held.
func (t *Table[V]) Len() int { return len(t.ents) - len(t.free) }

// Slots is the number of index slots: Live, At and Key take 0 ≤ i < Slots.
func (t *Table[V]) Slots() int { return len(t.index) }

// Live reports whether index slot i holds a key.
func (t *Table[V]) Live(i int) bool { return live(t.index[i]) }

// At returns the value in index slot i, which must be live.
func (t *Table[V]) At(i int) *V { return &t.ents[uint32(t.index[i])-1].v }

// Key returns the key in index slot i, which must be live.
func (t *Table[V]) Key(i int) string { return t.ents[uint32(t.index[i])-1].key }

// SampleSize is how many keys Sample returns at most, as Redis's
// maxmemory-samples does for eviction.
const SampleSize = 5

// Sample returns up to SampleSize live index slots (n of them), from a
// random place on, for eviction.
func (t *Table[V]) Sample() (idx [SampleSize]int, n int) {
	if len(t.index) == 0 {
		return idx, 0
	}
	mask := len(t.index) - 1
	start := rand.IntN(len(t.index))
	for j := 0; j < len(t.index) && n < SampleSize; j++ {
		if i := (start + j) & mask; live(t.index[i]) {
			idx[n] = i
			n++
		}
	}
	return idx, n
}
