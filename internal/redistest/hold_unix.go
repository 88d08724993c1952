//go:build unix

package redistest

import (
	"os"
	"syscall"
)

// holdPort binds a TCP socket to 127.0.0.1:port (0: one the kernel picks)
// and never listens on it. With no listener the kernel refuses
// connections to the port; with our socket bound without SO_REUSEADDR it
// refuses every other bind of it (on Linux also another address's, and
// whether or not that socket sets SO_REUSEADDR), so nobody can start
// answering there. close releases the port.
func holdPort(port int) (held int, close func(), err error) {
	fd, err := tcpSocket()
	if err != nil {
		return 0, nil, err
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return 0, nil, os.NewSyscallError("bind", err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		syscall.Close(fd)
		return 0, nil, os.NewSyscallError("getsockname", err)
	}
	return sa.(*syscall.SockaddrInet4).Port, func() { syscall.Close(fd) }, nil
}

// tcpSocket returns a new IPv4 TCP socket, close-on-exec as package net
// makes them where that cannot be asked at once: a redis-server started
// meanwhile must not inherit it.
func tcpSocket() (int, error) {
	syscall.ForkLock.RLock()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err == nil {
		syscall.CloseOnExec(fd)
	}
	syscall.ForkLock.RUnlock()
	if err != nil {
		return 0, os.NewSyscallError("socket", err)
	}
	return fd, nil
}
