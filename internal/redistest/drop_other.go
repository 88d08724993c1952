//go:build !linux

package redistest

import "testing"

// DropAddr skips the test: only Linux is known to drop a SYN to a
// listener whose accept queue is full.
func DropAddr(t testing.TB) string {
	t.Helper()
	t.Skip("redistest: no address whose connects time out here (Linux only)")
	return ""
}

// Drop skips the test, as DropAddr does.
func (p *DelayProxy) Drop(t testing.TB) {
	t.Helper()
	t.Skip("redistest: no address whose connects time out here (Linux only)")
}
