// Package holdmax keeps the longest hold a store's in-flight acquires and
// extends have asked for: how long a release that finds no holder keeps
// its tombstone, so that the tombstone outlives the hold of any acquire
// the store may have abandoned (its answer lost, the slot perhaps taken).
// The memory store and redisstore share it.
package holdmax

import (
	"strconv"
	"sync/atomic"
	"time"
)

// Max is the longest hold covered, in whole microseconds. The zero value
// is ready and holds 0 (no tombstone). It is safe for concurrent use.
// Raised rarely (a store's holds are few and fixed by its policies), it
// is read without a lock, and its script argument is made once per raise.
type Max struct {
	p atomic.Pointer[longest]
}

// longest is one value of a Max, never changed once stored.
type longest struct {
	us  int64
	arg any // us as a decimal string, boxed once
}

// Cover raises m to hold, truncated to microseconds, if that is longer.
func (m *Max) Cover(hold time.Duration) {
	us := hold.Microseconds()
	for {
		old := m.p.Load()
		if old.micros() >= us || m.p.CompareAndSwap(old, &longest{us, strconv.FormatInt(us, 10)}) {
			return
		}
	}
}

// Micros returns the longest hold covered, µs: 0 before any.
func (m *Max) Micros() int64 {
	return m.p.Load().micros()
}

// micros is l's hold, µs: 0 for none.
func (l *longest) micros() int64 {
	if l == nil {
		return 0
	}
	return l.us
}

// Arg returns Micros as a script argument, a decimal string boxed when m
// was raised, so that a call sends it without allocating: "0" before any.
func (m *Max) Arg() any {
	if l := m.p.Load(); l != nil {
		return l.arg
	}
	return "0"
}
