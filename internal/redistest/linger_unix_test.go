//go:build unix

package redistest

import (
	"bufio"
	"fmt"
	"net"
	"testing"
)

// A killed server's connections linger on its port (FIN_WAIT2 while the
// client keeps its end, TIME_WAIT after), so Stop cannot hold the port;
// net.Listen, which sets SO_REUSEADDR, binds it all the same. The ports
// handed out for other servers must not be such a port: a server started
// there answers the stopped server's clients when they reconnect.
func TestLingeringPortNotFree(t *testing.T) {
	s := StartServer(t)
	c, err := net.Dial("tcp", s.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	fmt.Fprint(c, "PING\r\n")
	if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "+PONG\r\n" {
		t.Fatalf("PING: %q, %v", line, err)
	}
	s.Stop()
	if len(s.held) > 0 {
		t.Skip("Stop held the port: nothing lingered on it here")
	}
	if l, err := net.Listen("tcp", s.Addr); err == nil {
		l.Close() // what the old check saw: free
	}
	if _, err := portFree(s.port); err == nil {
		t.Errorf("port %d of a stopped server with a connection lingering reads as free", s.port)
	}
	c.Close()
	if _, err := portFree(s.port); err == nil {
		t.Errorf("port %d with a connection in TIME_WAIT reads as free", s.port)
	}
}
