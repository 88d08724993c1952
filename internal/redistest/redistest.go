// Package redistest connects tests to the real Redis servers that
// scripts/test starts, and can start private redis-server processes for
// tests that kill or restart one.
//
// Environment (set by scripts/test):
//
//	SLUICE_REDIS_ADDR      standalone server, host:port
//	SLUICE_REDIS_SENTINEL  a Sentinel watching it as master "sluice", host:port
//	SLUICE_REDIS_CLUSTER   cluster seed nodes, comma-separated host:port
//
// When a variable is unset the test is skipped, except under CI=true, where
// a missing Redis fails the test: CI never passes by skipping.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func missing(t testing.TB, what string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not set: run the tests with scripts/test (CI requires Redis)", what)
	}
	t.Skipf("%s is not set; run scripts/test to test against real Redis", what)
}

// env returns the variable's value; an unset one skips or fails the test.
func env(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		missing(t, name)
	}
	return v
}

// Addr returns the standalone test server's address.
func Addr(t testing.TB) string {
	t.Helper()
	return env(t, "SLUICE_REDIS_ADDR")
}

// SentinelMaster is the name under which the test Sentinel watches the
// standalone server.
const SentinelMaster = "sluice"

// SentinelAddr returns the test Sentinel's address.
func SentinelAddr(t testing.TB) string {
	t.Helper()
	return env(t, "SLUICE_REDIS_SENTINEL")
}

// ClusterAddrs returns the test cluster's seed addresses.
func ClusterAddrs(t testing.TB) []string {
	t.Helper()
	return strings.Split(env(t, "SLUICE_REDIS_CLUSTER"), ",")
}

// Client returns a client of the standalone server, closed at cleanup.
func Client(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: Addr(t)})
	ping(t, c)
	return c
}

// ClusterClient returns a client of the test cluster, closed at cleanup.
func ClusterClient(t testing.TB) *redis.ClusterClient {
	t.Helper()
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: ClusterAddrs(t)})
	ping(t, c)
	return c
}

func ping(t testing.TB, c redis.UniversalClient) {
	t.Helper()
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis: %v", err)
	}
}

var seq atomic.Int64

// Prefix returns a key prefix unique to this test run and test, so tests can
// share servers without FLUSHDB.
func Prefix(t testing.TB) string {
	return fmt.Sprintf("test:%d:%d:%s:", os.Getpid(), seq.Add(1), t.Name())
}

// Server is a private redis-server process.
type Server struct {
	Addr string
	dir  string
	port int
	args []string
	cmd  *exec.Cmd
}

// StartServer starts a private redis-server on a free loopback port and
// stops it at cleanup. args go on its command line after sluice's
// defaults, so they win ("--appendonly", "yes" for a server that keeps its
// data across a kill). It needs redis-server on PATH (scripts/test installs
// it); without one it skips, or fails under CI=true.
func StartServer(t testing.TB, args ...string) *Server {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing(t, "redis-server on PATH")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	s := &Server{Addr: fmt.Sprintf("127.0.0.1:%d", port), dir: t.TempDir(), port: port, args: args}
	s.Start(t)
	t.Cleanup(s.Stop)
	return s
}

// Start (re)starts the server on its address and waits until it answers.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	s.cmd = exec.Command("redis-server", "--port", fmt.Sprint(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--logfile", filepath.Join(s.dir, "redis.log"))
	s.cmd.Args = append(s.cmd.Args, s.args...)
	DieWithParent(s.cmd)
	if err := s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; {
		if c.Ping(context.Background()).Err() == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s did not start", s.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop kills the server (SIGKILL: a crash, not a clean shutdown) and waits
// for it to exit. Stopping a stopped server does nothing.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
	s.cmd = nil
}
