// Package redistest connects tests to the real Redis servers that
// scripts/test starts, and can start private redis-server processes for
// tests that kill or restart one.
//
// Environment (set by scripts/test):
//
//	SLUICE_REDIS_ADDR      standalone server, host:port
//	SLUICE_REDIS_SENTINEL  a Sentinel watching it as master "sluice", host:port
//	SLUICE_REDIS_CLUSTER   cluster seed nodes, comma-separated host:port
//	SLUICE_REDIS_PORTS     lo-hi: the loopback ports private servers, stand-in
//	                       listeners (Listen) and dead addresses (DeadAddr)
//	                       may use (default: any free port)
//
// A test that needs a port of its own, open or closed, takes it from
// FreePort, Listen or DeadAddr, never from the kernel's ephemeral range
// directly: on a shared CI machine that range is other services' too.
//
// When a variable is unset the test is skipped, except under CI=true, where
// a missing Redis fails the test: CI never passes by skipping.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
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

// Deployment is one of the shared test deployments: a name for t.Run and a
// client of it, closed at cleanup.
type Deployment struct {
	Name   string
	Client func(t testing.TB) redis.UniversalClient
}

// Deployments are the standalone server and the cluster, for tests that
// run on each.
func Deployments() []Deployment {
	return []Deployment{
		{"standalone", func(t testing.TB) redis.UniversalClient { return Client(t) }},
		{"cluster", func(t testing.TB) redis.UniversalClient { return ClusterClient(t) }},
	}
}

// EachDeployment runs f as a subtest on each of Deployments.
func EachDeployment(t *testing.T, f func(t *testing.T, d Deployment)) {
	t.Helper()
	for _, d := range Deployments() {
		t.Run(d.Name, func(t *testing.T) { f(t, d) })
	}
}

// Each is EachDeployment with a client of the deployment.
func Each(t *testing.T, f func(t *testing.T, c redis.UniversalClient)) {
	t.Helper()
	EachDeployment(t, func(t *testing.T, d Deployment) { f(t, d.Client(t)) })
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

// Server is a private redis-server process (a data server or a Sentinel).
type Server struct {
	// Addr is the server's loopback host:port (its TLS port under
	// ServerOptions.TLS).
	Addr string

	dir  string
	port int
	bus  int // cluster bus port, 0 unless ServerOptions.Cluster
	opts ServerOptions
	cmd  *exec.Cmd
	exit chan struct{} // closed when cmd has exited
	// held free the ports a stopped server holds until its restart.
	held []func()
}

// ServerOptions configures a private server. A nil *ServerOptions starts a
// plain standalone server.
type ServerOptions struct {
	// Args are extra redis-server arguments, such as "--requirepass", "pw".
	// Default: none.
	Args []string
	// TLS serves TLS on the port and no plaintext; Args must name the
	// certificate files (--tls-cert-file, --tls-key-file, --tls-ca-cert-file).
	// Default: plaintext.
	TLS bool
	// Cluster enables cluster mode with a private bus port. The node has no
	// slots: it is a cluster node that serves no keys. Default: standalone.
	Cluster bool
	// Sentinel runs a Sentinel (redis-server --sentinel) instead, with
	// Args as lines of its configuration file ("sentinel monitor m
	// 127.0.0.1 6379 1"). Default: a data server.
	Sentinel bool
}

// startAttempts bounds the ports tried when another process takes the
// picked port before the server binds it.
const startAttempts = 20

// StartServer starts a private redis-server on a free loopback port and
// stops it at cleanup. args go on its command line after sluice's
// defaults, so they win ("--appendonly", "yes" for a server that keeps its
// data across a kill). It needs redis-server on PATH (scripts/test installs
// it); without one it skips, or fails under CI=true.
func StartServer(t testing.TB, args ...string) *Server {
	t.Helper()
	return StartServerOptions(t, &ServerOptions{Args: args})
}

// StartServerOptions is StartServer with options. A port taken between
// being picked and being bound is noticed as soon as the server exits
// (within milliseconds), and another port is tried.
func StartServerOptions(t testing.TB, opts *ServerOptions) *Server {
	t.Helper()
	s := &Server{dir: t.TempDir()}
	if opts != nil {
		s.opts = *opts
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		missing(t, "redis-server on PATH")
	}
	t.Cleanup(func() {
		s.Stop()
		s.unhold()
	})
	for attempt := 1; ; attempt++ {
		s.port = freePort(t)
		if s.opts.Cluster {
			s.bus = freePort(t)
		}
		s.Addr = fmt.Sprintf("127.0.0.1:%d", s.port)
		err := s.start()
		if err == nil {
			return s
		}
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			t.Fatal(err)
		}
	}
}

// freePort picks a free loopback port, within SLUICE_REDIS_PORTS
// ("lo-hi") when it is set, so that a shared machine can keep the tests'
// servers to ports of their own; a variable so that a test can hand out a
// taken one.
var freePort = func(t testing.TB) int {
	t.Helper()
	if r := os.Getenv("SLUICE_REDIS_PORTS"); r != "" {
		return portIn(t, r, func(port int) bool {
			_, err := portFree(port)
			return err == nil
		})
	}
	port, err := portFree(0)
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// portFree returns port (0: one the kernel picks) if a socket can bind it
// without SO_REUSEADDR. net.Listen sets SO_REUSEADDR, and so binds a port
// whose connections linger (TIME_WAIT, FIN_WAIT2) after a server was
// killed: the port of a stopped server that Stop could not hold, which
// another test would then take, and the stopped server's clients
// reconnect to (one test's client met another's maxclients 1).
func portFree(port int) (int, error) {
	held, release, err := holdPort(port)
	if err != nil {
		return 0, err
	}
	release()
	return held, nil
}

// portIn returns the first port of the range "lo-hi" that take accepts
// (a free one, on loopback), trying them from a random one, so that test
// processes running at once seldom pick the same.
func portIn(t testing.TB, r string, take func(port int) bool) int {
	t.Helper()
	a, b, _ := strings.Cut(r, "-")
	lo, err1 := strconv.Atoi(a)
	hi, err2 := strconv.Atoi(b)
	if err1 != nil || err2 != nil || lo < 1 || hi < lo || hi > 65535 {
		t.Fatalf("redistest: SLUICE_REDIS_PORTS=%q: want lo-hi, such as 27400-27499", r)
	}
	n := hi - lo + 1
	start := rand.IntN(n)
	for i := range n {
		if port := lo + (start+i)%n; take(port) {
			return port
		}
	}
	t.Fatalf("redistest: no free port in SLUICE_REDIS_PORTS=%s", r)
	return 0
}

// FreePort returns a loopback port free now, within SLUICE_REDIS_PORTS when
// it is set: for a server process of the test's own that binds it.
func FreePort(t testing.TB) int {
	t.Helper()
	return freePort(t)
}

// DeadAddr returns a loopback address where nothing listens: connections
// are refused, as by a Redis that is down. Until the test's cleanup its
// port stays bound to a socket that never listens, so that no other test
// of the run (FreePort, Listen, a private server) nor another process can
// listen there and answer in its place. (On systems other than unix ones
// the port is only free when picked.)
func DeadAddr(t testing.TB) string {
	t.Helper()
	var port int
	var release func()
	var err error
	hold := func(p int) bool {
		port, release, err = holdPort(p)
		return err == nil
	}
	if r := os.Getenv("SLUICE_REDIS_PORTS"); r != "" {
		portIn(t, r, hold)
	} else if !hold(0) {
		t.Fatalf("redistest: %v", err)
	}
	t.Cleanup(release)
	return fmt.Sprintf("127.0.0.1:%d", port)
}

// Listen returns a loopback listener on a port of freePort's, closed at
// cleanup: a stand-in server (one that never answers, a proxy) is then
// kept to SLUICE_REDIS_PORTS as the private redis-servers are.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	for attempt := 1; ; attempt++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", freePort(t)))
		if err == nil {
			t.Cleanup(func() { l.Close() })
			return l
		}
		// Another process took the port since it was picked.
		if attempt == startAttempts {
			t.Fatalf("redistest: %v", err)
		}
	}
}

var errAddrInUse = errors.New("redistest: address in use")

// Start restarts a stopped server on its address and waits until it is
// ready.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatal(err)
	}
}

// start runs the server and waits for its log to say it is ready. It
// watches the log rather than connecting, so a password or TLS makes no
// difference, and another process answering on the port cannot pass for
// this one.
func (s *Server) start() error {
	s.unhold()
	logFile := filepath.Join(s.dir, fmt.Sprintf("redis-%d.log", s.port))
	os.Remove(logFile)
	args := []string{"--bind", "127.0.0.1", "--dir", s.dir, "--logfile", logFile}
	if s.opts.TLS {
		args = append(args, "--port", "0", "--tls-port", fmt.Sprint(s.port))
	} else {
		args = append(args, "--port", fmt.Sprint(s.port))
	}
	what := "redis-server"
	if s.opts.Sentinel {
		conf := filepath.Join(s.dir, "sentinel.conf")
		if err := os.WriteFile(conf, []byte(strings.Join(s.opts.Args, "\n")+"\n"), 0o600); err != nil {
			return err
		}
		what, args = "Sentinel", append([]string{conf, "--sentinel"}, args...)
	} else {
		args = append(args, "--save", "", "--appendonly", "no")
		if s.opts.Cluster {
			args = append(args, "--cluster-enabled", "yes", "--cluster-port", fmt.Sprint(s.bus),
				"--cluster-config-file", fmt.Sprintf("nodes-%d.conf", s.port))
		}
		args = append(args, s.opts.Args...)
	}
	s.cmd = exec.Command("redis-server", args...)
	DieWithParent(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return err
	}
	s.exit = make(chan struct{})
	go func(cmd *exec.Cmd, exit chan struct{}) {
		cmd.Wait()
		close(exit)
	}(s.cmd, s.exit)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case <-s.exit:
			s.cmd = nil
			log, _ := os.ReadFile(logFile)
			if bytes.Contains(log, []byte("Address already in use")) {
				return fmt.Errorf("%w: %s", errAddrInUse, s.Addr)
			}
			return fmt.Errorf("redistest: %s on %s exited at start: %s", what, s.Addr, lastLines(log, 5))
		case <-deadline:
			s.Stop()
			log, _ := os.ReadFile(logFile)
			return fmt.Errorf("redistest: %s on %s not ready after 10s: %s", what, s.Addr, lastLines(log, 5))
		case <-tick.C:
			if log, _ := os.ReadFile(logFile); bytes.Contains(log, []byte("Ready to accept connections")) ||
				(s.opts.Sentinel && bytes.Contains(log, []byte("Sentinel ID is"))) {
				return nil
			}
		}
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// Client returns a client of the server, closed at cleanup.
func (s *Server) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { c.Close() })
	return c
}

// Stop kills the server (SIGKILL: a crash, not a clean shutdown) and waits
// for it to exit. Stopping a stopped server does nothing. Until Start, or
// the test's cleanup, its port (and cluster bus port) stays bound to a
// socket that never listens, as DeadAddr's: connections are refused, and
// neither a client's ephemeral port nor another server can take it and
// fail the restart with "address in use". Where connections the kill
// closed linger (TIME_WAIT) that bind fails; their own binding then keeps
// clients' ephemeral ports and servers started on port 0 off it.
func (s *Server) Stop() {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Kill()
	<-s.exit
	s.cmd = nil
	for _, port := range []int{s.port, s.bus} {
		if port == 0 {
			continue
		}
		if _, release, err := holdPort(port); err == nil {
			s.held = append(s.held, release)
		}
	}
}

// unhold frees the ports Stop held.
func (s *Server) unhold() {
	for _, release := range s.held {
		release()
	}
	s.held = nil
}
