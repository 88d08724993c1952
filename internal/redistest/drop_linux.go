package redistest

import (
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// dropSYNs makes 127.0.0.1:port an address whose connects time out, as
// to a host that drops packets or is gone: no refusal, no answer. It
// listens there with an accept queue of one place, fills it with a
// connection of its own and accepts nothing: Linux drops a SYN to a
// listener whose accept queue is full, with SYN cookies on or off (they
// answer for a full SYN queue, not a full accept queue), and the client
// retransmits until its dial times out. A filler that was itself dropped
// (the port's old accept queue) is retried. Connections already
// established on the port are left as they are. close releases the port.
func dropSYNs(port int) (close func(), err error) {
	fd, err := tcpSocket()
	if err != nil {
		return nil, err
	}
	// Connections the port's last listener accepted may still be open.
	if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("setsockopt", err)
	}
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("bind", err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		syscall.Close(fd)
		return nil, os.NewSyscallError("listen", err)
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	var filler net.Conn
	for range 5 {
		if filler, err = net.DialTimeout("tcp", addr, 2*time.Second); err == nil {
			break
		}
	}
	if err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("redistest: filling the accept queue of %s: %w", addr, err)
	}
	return func() { filler.Close(); syscall.Close(fd) }, nil
}

// DropAddr returns a loopback address whose connects time out, with no
// refusal and no answer (see dropSYNs), until the test's cleanup. Linux
// only: elsewhere the test is skipped.
func DropAddr(t testing.TB) string {
	t.Helper()
	for attempt := 1; ; attempt++ {
		port := freePort(t)
		release, err := dropSYNs(port)
		if err == nil {
			t.Cleanup(release)
			return fmt.Sprintf("127.0.0.1:%d", port)
		}
		if attempt == startAttempts {
			t.Fatalf("redistest: %v", err)
		}
	}
}

// Drop makes the proxy's host go dark: what its connections carry is
// taken and never passed on, either way, and new connects to its address
// time out (see dropSYNs), as when the host beyond drops every packet.
func (p *DelayProxy) Drop(t testing.TB) {
	t.Helper()
	p.dark.Store(true)
	p.ln.Close()
	port := p.ln.Addr().(*net.TCPAddr).Port
	release, err := dropSYNs(port)
	if err != nil {
		t.Fatalf("redistest: proxy %s: %v", p.Addr, err)
	}
	t.Cleanup(release)
}
