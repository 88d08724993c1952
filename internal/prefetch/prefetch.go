// Package prefetch asks the processor to start loading a cache line that
// a caller will read soon, so that the load overlaps work before it (a
// lock, a clock read) rather than following it.
package prefetch

// Line hints that the cache line holding addr will be read soon. addr
// need not be valid: a prefetch never faults, and a wrong address only
// wastes the hint.
func Line(addr uintptr) { line(addr) }
