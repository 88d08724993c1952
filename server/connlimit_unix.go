//go:build unix

package server

import (
	"net"
	"syscall"
)

// unread reports whether bytes from c's peer wait in its socket, not yet
// read. It peeks without the read lock, so a Read in progress does not
// hold it up.
func unread(c net.Conn) bool {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	n := 0
	rc.Control(func(fd uintptr) {
		var b [1]byte
		// The socket is non-blocking (Go's poller): no data is EAGAIN.
		n, _, _ = syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
	})
	return n > 0
}
