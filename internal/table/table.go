// Package table is the hash table under the memory store's states and the
// lease store's leases: open addressing with linear probing, each entry
// (a tag, its key and its value) held in its probe slot, so that finding
// a key and reading its value touch one cache line, not an index slot and
// then an entry elsewhere. The key's hash, which the caller has already
// computed to pick a shard, is not computed again: the caller passes a
// 32-bit tag taken from it. A Table is not safe for concurrent use.
//
// A slot holds its key as a pointer to the key's bytes, its length in the
// slot's meta word beside the tag: 16 bytes and the value, so that a
// 16-byte value makes a 32-byte slot, two to a cache line. Over many keys
// the table is what a lookup misses in the cache, and the smaller it is
// the more of it the cache keeps.
package table

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/sluicehq/sluice/internal/prefetch"
)

// Table maps keys to values of type V. The zero value is empty and ready.
type Table[V any] struct {
	slots []slot[V] // a power of two long, or nil
	used  int       // slots live or tombstones: the load that lengthens probes
	n     int       // slots live
	gen   uint64    // rehashes so far: a Cursor's keys have moved when it changes

	// base and mask are slots' address and len-1, published for Prefetch,
	// which runs without the lock that guards the rest.
	base, mask atomic.Uintptr
}

// Prefetch starts loading the slot where tag's probe begins, and the
// cache line after it, where a probe that finds its key past the first
// slots goes on (at the load the table keeps, a successful probe passes
// 2.6 slots on average): both misses are then paid at once, not one after
// the other. It is safe without the lock that guards every other method:
// it reads only base and mask, and an address made stale by a concurrent
// rehash, or past the table's end, only wastes the hint (a prefetch never
// faults). A caller prefetches, then takes its lock and reads its clock
// while the lines arrive.
func (t *Table[V]) Prefetch(tag uint32) {
	var s slot[V]
	addr := t.base.Load() + (uintptr(tag)&t.mask.Load())*unsafe.Sizeof(s)
	prefetch.Line(addr)
	prefetch.Line(addr + 64)
}

// A slot is empty (meta 0), a tombstone (a deleted key, which probes pass
// over; meta tombstone) or live (meta tag<<32 | len(key)<<22 | kind, its
// key's bytes at key). A value of 16 bytes makes a 32-byte slot, one of 48
// a 64-byte slot: a slot never straddles two cache lines.
type slot[V any] struct {
	meta uint64
	key  unsafe.Pointer // the key's bytes
	v    V
}

const tombstone = ^uint64(0)

func live(meta uint64) bool { return meta != 0 && meta != tombstone }

// A kind tells apart entries of one key, as a lease store's limits: 1 ≤
// kind ≤ MaxKind (below the kind bits all set, so that no live meta is a
// tombstone's). Find, Add and Remove use kind 1.
const MaxKind = 1<<22 - 2

// MaxKeyLen is the longest key a Table holds: its length has 10 bits of
// the meta word. Every caller's keys are shorter (sluice.MaxKeyLen).
const MaxKeyLen = 1<<10 - 1

func metaOf(tag, kind uint32, key string) uint64 {
	return uint64(tag)<<32 | uint64(len(key))<<22 | uint64(kind)
}

// keyOf is the key a live slot's meta and key pointer hold.
func keyOf(meta uint64, p unsafe.Pointer) string {
	return unsafe.String((*byte)(p), int(meta>>22)&MaxKeyLen)
}

// Find returns key's value, or nil. The pointer is valid until the next
// Add.
func (t *Table[V]) Find(tag uint32, key string) *V { return t.FindKind(tag, 1, key) }

// FindKind is Find for key's entry of that kind.
func (t *Table[V]) FindKind(tag, kind uint32, key string) *V {
	if i := t.lookup(tag, kind, key); i >= 0 {
		return &t.slots[i].v
	}
	return nil
}

// lookup returns the slot of key's entry of kind, or -1. A key longer
// than MaxKeyLen is in no slot, and must not be looked for: its length
// would spill from the meta word's 10 bits into the tag, and match a
// shorter key's meta under another tag, whose bytes the comparison would
// then read past their end.
func (t *Table[V]) lookup(tag, kind uint32, key string) int {
	if t.slots == nil || len(key) > MaxKeyLen {
		return -1
	}
	mask := len(t.slots) - 1
	m := metaOf(tag, kind, key)
	for i := int(tag) & mask; ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.meta == 0 {
			return -1
		}
		if s.meta == m && unsafe.String((*byte)(s.key), len(key)) == key { // the lengths match, in m
			return i
		}
	}
}

// Add stores v for key, which must be absent, and returns where it now
// lives (valid until the next Add).
func (t *Table[V]) Add(tag uint32, key string, v V) *V { return t.AddKind(tag, 1, key, v) }

// AddKind is Add for key's entry of that kind. A key longer than MaxKeyLen,
// or a kind out of range, is a bug in the caller: it panics.
func (t *Table[V]) AddKind(tag, kind uint32, key string, v V) *V {
	if len(key) > MaxKeyLen || kind < 1 || kind > MaxKind {
		panic(fmt.Sprintf("table: key of %d bytes (at most %d), kind %d (1 to %d)", len(key), MaxKeyLen, kind, MaxKind))
	}
	if 16*(t.used+1) > 13*len(t.slots) {
		t.rehash()
	}
	s := t.place(tag)
	s.meta, s.key, s.v = metaOf(tag, kind, key), unsafe.Pointer(unsafe.StringData(key)), v
	t.n++
	return &s.v
}

// place returns the first slot of tag's probe that is not live, counting
// it as used if it was empty.
func (t *Table[V]) place(tag uint32) *slot[V] {
	mask := len(t.slots) - 1
	i := int(tag) & mask
	for live(t.slots[i].meta) {
		i = (i + 1) & mask
	}
	if t.slots[i].meta == 0 {
		t.used++
	}
	return &t.slots[i]
}

// Remove deletes key and reports whether it was there.
func (t *Table[V]) Remove(tag uint32, key string) bool { return t.RemoveKind(tag, 1, key) }

// RemoveKind is Remove for key's entry of that kind.
func (t *Table[V]) RemoveKind(tag, kind uint32, key string) bool {
	i := t.lookup(tag, kind, key)
	if i < 0 {
		return false
	}
	t.Bury(i)
	return true
}

// Bury deletes the key in slot i, which must be live. The slot becomes
// empty when no probe passes it (the next slot is empty), else a
// tombstone. No other slot changes, so a walk over the slots may bury as
// it goes.
func (t *Table[V]) Bury(i int) {
	s := &t.slots[i]
	s.key, s.v = nil, *new(V) // let the collector have them
	t.n--
	if t.slots[(i+1)&(len(t.slots)-1)].meta == 0 {
		s.meta = 0
		t.used--
		return
	}
	s.meta = tombstone
}

// rehash rebuilds the table at a load of at most a half (at least 16
// slots), dropping the tombstones. Add rehashes again at 13/16: a probe
// for a key that is absent then passes about 15 slots on average, one
// that finds its key about 3, and those are adjacent lines the hardware
// prefetches; a lower load costs more memory, and memory that leaves the
// cache costs every lookup a miss (at 3/4, a table of 64-byte slots over 100,000 keys
// took 16 MB, not 8).
func (t *Table[V]) rehash() {
	n := 16
	for n < 2*(t.n+1) {
		n <<= 1
	}
	old := t.slots
	t.slots, t.used = make([]slot[V], n), 0
	t.gen++
	t.base.Store(uintptr(unsafe.Pointer(&t.slots[0])))
	t.mask.Store(uintptr(n - 1))
	for i := range old {
		if o := &old[i]; live(o.meta) {
			*t.place(uint32(o.meta >> 32)) = *o
		}
	}
}

// Fit shrinks the table when less than an eighth of its slots are live,
// as after a sweep: rehash grows it and nothing else shrinks it, so a
// burst of keys would otherwise keep its memory after its keys expired.
func (t *Table[V]) Fit() {
	if len(t.slots) > 16 && 8*t.n < len(t.slots) {
		t.rehash()
	}
}

// A Cursor walks a table's slots a chunk at a time, its lock released
// between chunks, so that a walk of a large table holds the lock for a
// chunk, not the table. The zero Cursor starts at slot 0.
type Cursor struct {
	next     int    // the next slot to walk
	gen      uint64 // the table's rehashes when the last chunk was walked
	restarts int
	started  bool
}

// MaxRestarts is how many times a Cursor's walk starts again at slot 0
// when the table was rehashed between two of its chunks.
const MaxRestarts = 2

// Chunk returns the slots [from, to) a walk with c visits next, at most n
// of them, under the lock the caller holds; ok is false when the walk has
// visited every slot. A rehash between two chunks (the table grown, shrunk,
// or rebuilt to drop its tombstones) moves keys: the walk then starts
// again at slot 0 (restarted; a caller that counts forgets what it counted
// of this table), at most MaxRestarts times, so that a key present
// throughout is visited; past that it goes on where it was, and a key
// moved behind it is not visited, one moved ahead of it may be twice.
func (t *Table[V]) Chunk(c *Cursor, n int) (from, to int, restarted, ok bool) {
	if c.started && c.gen != t.gen && c.restarts < MaxRestarts {
		c.next, restarted = 0, true
		c.restarts++
	}
	c.started, c.gen = true, t.gen
	if c.next >= len(t.slots) {
		return 0, 0, restarted, false
	}
	from, to = c.next, min(c.next+n, len(t.slots))
	c.next = to
	return from, to, restarted, true
}

// Len is the number of keys held.
func (t *Table[V]) Len() int { return t.n }

// Slots is the number of slots: Live, At and Key take 0 ≤ i < Slots.
func (t *Table[V]) Slots() int { return len(t.slots) }

// Live reports whether slot i holds a key.
func (t *Table[V]) Live(i int) bool { return live(t.slots[i].meta) }

// At returns the value in slot i, which must be live.
func (t *Table[V]) At(i int) *V { return &t.slots[i].v }

// Key returns the key in slot i, which must be live.
func (t *Table[V]) Key(i int) string { s := &t.slots[i]; return keyOf(s.meta, s.key) }

// SampleSize is how many keys Sample returns at most, as Redis's
// maxmemory-samples does for eviction.
const SampleSize = 5

// Sample returns up to SampleSize live slots (n of them), for eviction:
// each the first live slot at or after a random slot of its own, so that
// they are spread over the table. Adjacent slots would sample a key with
// the keys placed beside it, which under linear probing are often the
// ones added last: a sampled key and its own neighbourhood, not the
// table.
func (t *Table[V]) Sample() (idx [SampleSize]int, n int) {
	if t.n == 0 {
		return idx, 0
	}
	mask := len(t.slots) - 1
	for n < min(SampleSize, t.n) {
		i := rand.IntN(len(t.slots))
		for !live(t.slots[i].meta) || slices.Contains(idx[:n], i) {
			i = (i + 1) & mask
		}
		idx[n] = i
		n++
	}
	return idx, n
}
