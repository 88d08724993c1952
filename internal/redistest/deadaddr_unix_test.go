//go:build unix

package redistest

import (
	"errors"
	"fmt"
	"net"
	"syscall"
	"testing"
	"time"
)

// DeadAddr's port is held until the test's cleanup: its connections are
// refused, nobody can listen on it, and freePort hands it to no other
// test of the run; after the cleanup it is free again.
func TestDeadAddrHeld(t *testing.T) {
	refused := func(t *testing.T, addr string) {
		t.Helper()
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			c.Close()
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial DeadAddr %s: %v, want connection refused", addr, err)
		}
	}
	held := func(t *testing.T, addr string) {
		t.Helper()
		// net.Listen sets SO_REUSEADDR, as redis-server does.
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			t.Errorf("listened on DeadAddr %s before the test's cleanup", addr)
		}
		refused(t, addr)
	}
	free := func(t *testing.T, addr string) {
		t.Helper()
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("DeadAddr %s still held after its test's cleanup: %v", addr, err)
		}
		l.Close()
	}

	t.Run("any port", func(t *testing.T) {
		t.Setenv("SLUICE_REDIS_PORTS", "")
		var dead string
		t.Run("held", func(t *testing.T) {
			dead = DeadAddr(t)
			held(t, dead)
		})
		free(t, dead)
	})

	t.Run("in SLUICE_REDIS_PORTS", func(t *testing.T) {
		taken, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := taken.Addr().(*net.TCPAddr).Port
		taken.Close()
		next, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port+1))
		if err != nil {
			t.Skipf("port %d, beside a free one, is not free: %v", port+1, err)
		}
		next.Close()
		t.Setenv("SLUICE_REDIS_PORTS", fmt.Sprintf("%d-%d", port, port+1))
		var dead string
		t.Run("held", func(t *testing.T) {
			dead = DeadAddr(t)
			held(t, dead)
			// freePort tries the range from a random port: 20 picks
			// would all miss a port it could return with odds of 1 in 10⁶.
			for range 20 {
				if got := fmt.Sprintf("127.0.0.1:%d", FreePort(t)); got == dead {
					t.Fatalf("FreePort = %s, DeadAddr's port, while it is held", got)
				}
			}
		})
		free(t, dead)
	})
}

// A stopped server's port is held until its restart, as DeadAddr's is:
// connections are refused, and no other listener (a client's ephemeral
// port, another test's server) can take it and make the restart fail
// with "address in use". The cleanup frees it.
func TestStoppedServerPortHeld(t *testing.T) {
	for _, cluster := range []bool{false, true} {
		t.Run(fmt.Sprintf("cluster=%v", cluster), func(t *testing.T) {
			var addrs []string
			t.Run("stopped", func(t *testing.T) {
				s := StartServerOptions(t, &ServerOptions{Cluster: cluster})
				addrs = []string{s.Addr}
				if cluster {
					addrs = append(addrs, fmt.Sprintf("127.0.0.1:%d", s.bus))
				}
				s.Stop()
				for _, addr := range addrs {
					if l, err := net.Listen("tcp", addr); err == nil {
						l.Close()
						t.Errorf("listened on stopped server's %s before its restart", addr)
					}
				}
				c, err := net.DialTimeout("tcp", s.Addr, time.Second)
				if err == nil {
					c.Close()
				}
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("dial stopped server %s: %v, want connection refused", s.Addr, err)
				}
				s.Start(t)
				s.Stop()
			})
			for _, addr := range addrs {
				l, err := net.Listen("tcp", addr)
				if err != nil {
					t.Fatalf("stopped server's %s still held after its test's cleanup: %v", addr, err)
				}
				l.Close()
			}
		})
	}
}
