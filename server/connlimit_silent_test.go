package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/testcert"
)

// dialSilent opens a connection to addr, writes first (maybe nothing) and
// then nothing more.
func dialSilent(t *testing.T, addr, first string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if first != "" {
		io.WriteString(c, first)
	}
	return c
}

// stillOpen reports whether the server keeps c open: reading what it sent
// (a gRPC server's settings) times out rather than ending.
func stillOpen(c net.Conn) bool {
	c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	_, err := io.Copy(io.Discard, c)
	return isTimeout(err)
}

// rlsNow asserts that a new RLS client's first call is answered within a
// second.
func rlsNow(t *testing.T, c rlsv3.RateLimitServiceClient) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := c.ShouldRateLimit(ctx, rlsRequest("d", desc("k=v"))); err != nil {
		t.Errorf("ShouldRateLimit from a new client with the gRPC listener at its cap: %v", err)
	}
}

// A TLS record header announcing a ClientHello, and no more of it.
const partialClientHello = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"

// TestSilentConnectionsMakeRoom: with each listener's places all held by
// connections that never sent a byte (or, on gRPC, only part of the HTTP/2
// preface), a new RLS client and new HTTP clients are served at once, the
// oldest silent connection closed for each (counted as idle), none
// refused: silent sockets cannot lock Envoy or API clients out until the
// 10s handshake and header timeouts.
func TestSilentConnectionsMakeRoom(t *testing.T) {
	const max = 10
	grace := shortGrace(t)
	srv := capServer(t, Options{MaxConnections: max})
	reg := srv.metrics.reg
	var httpSilent, grpcSilent []net.Conn
	for i := range max {
		httpSilent = append(httpSilent, dialSilent(t, srv.HTTPAddr(), ""))
		grpcSilent = append(grpcSilent, dialSilent(t, srv.GRPCAddr(), []string{"", "PRI * HTTP/2.0\r\n"}[i%2]))
		time.Sleep(5 * time.Millisecond) // in order of age
	}
	for _, l := range []string{"http", "grpc"} {
		waitFor(t, func() bool {
			return metricValue(t, reg, "sluice_connections_open", map[string]string{"listener": l}) == max
		})
	}
	time.Sleep(grace) // all past the grace
	rlsNow(t, dialRLS(t, srv.GRPCAddr()))
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	getNow(t, fresh, "http://"+srv.HTTPAddr()+"/v1/policies")
	getNow(t, fresh, "http://"+srv.HTTPAddr()+"/healthz")
	for _, l := range []string{"http", "grpc"} {
		lbl := map[string]string{"listener": l}
		if got := metricValue(t, reg, "sluice_connections_refused_total", lbl); got != 0 {
			t.Errorf("sluice_connections_refused_total{listener=%s} = %v, want 0", l, got)
		}
		if got := metricValue(t, reg, "sluice_connections_idle_closed_total", lbl); got < 1 {
			t.Errorf("sluice_connections_idle_closed_total{listener=%s} = %v, want at least 1", l, got)
		}
	}
	// The oldest went first; the newest are still open.
	for name, conns := range map[string][]net.Conn{"http": httpSilent, "grpc": grpcSilent} {
		if stillOpen(conns[0]) {
			t.Errorf("%s: the oldest silent connection is still open", name)
		}
		for i := 2; i < max; i++ {
			if !stillOpen(conns[i]) {
				t.Errorf("%s: silent connection %d of %d (oldest first) closed, want only the oldest closed", name, i, max)
			}
		}
	}
}

// TestFaultCapSilentConnectionsGoBeforeIdle: at the cap, a connection that never
// sent a byte is closed before one idle between requests, however long
// that one has been idle: a keep-alive pool has shown it is a client.
func TestFaultCapSilentConnectionsGoBeforeIdle(t *testing.T) {
	// Which connection goes depends on how long each has been silent or
	// idle (grace, idleMin): a timing test, run without -race.
	race.SkipTiming(t)
	const max = 6
	grace := shortGrace(t)
	srv := capServer(t, Options{MaxConnections: max})
	reg := srv.metrics.reg
	lbl := map[string]string{"listener": "http"}
	var idle []net.Conn
	for range max - 2 {
		// In order of idleness, as the server sees it: idle[0] the longest.
		idle = append(idle, idleKeepAlive(t, srv))
	}
	time.Sleep(20 * time.Millisecond) // idle longer than the silent ones are old
	silent := []net.Conn{dialSilent(t, srv.HTTPAddr(), ""), dialSilent(t, srv.HTTPAddr(), "")}
	full := func() {
		waitFor(t, func() bool { return metricValue(t, reg, "sluice_connections_open", lbl) == max })
		time.Sleep(grace) // the silent ones past the grace
	}
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	url := "http://" + srv.HTTPAddr() + "/healthz"
	full()
	getNow(t, fresh, url)
	if stillOpen(silent[0]) || !stillOpen(silent[1]) {
		t.Error("the first connection past the cap did not close the older silent connection, and only it")
	}
	silent = append(silent, dialSilent(t, srv.HTTPAddr(), "")) // at the cap again
	full()
	getNow(t, fresh, url)
	if stillOpen(silent[1]) || !stillOpen(silent[2]) {
		t.Error("the second connection past the cap did not close the oldest silent connection, and only it")
	}
	for i, c := range idle {
		if !stillOpen(c) {
			t.Errorf("idle keep-alive connection %d closed while silent ones were open", i)
		}
	}
	// With the silent one a client at last, the longest idle goes.
	io.WriteString(silent[2], "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	silent[2].SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(silent[2]), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	idle = append(idle, keepAlive(t, srv.HTTPAddr())) // at the cap again
	full()
	getNow(t, fresh, url)
	if stillOpen(idle[0]) {
		t.Error("with no silent connection left, the longest idle one was not closed")
	}
	if got := metricValue(t, reg, "sluice_connections_idle_closed_total", lbl); got != 3 {
		t.Errorf("sluice_connections_idle_closed_total{listener=http} = %v, want 3", got)
	}
}

// TestSilentConnectionsLeaveProbePlaces: with every place under the cap
// busy, connections that send nothing cannot hold the probe places past
// it: each new one takes the place of the oldest silent one past the
// grace, so /healthz and /readyz are still answered at once and a pod busy to its cap is not
// restarted for refused liveness probes.
func TestSilentConnectionsLeaveProbePlaces(t *testing.T) {
	const max = 10
	grace := shortGrace(t)
	srv, hold, _ := holdingServer(t, Options{MaxConnections: max})
	var busy []net.Conn
	for range max {
		busy = append(busy, hold(dialHTTP(t, srv)))
	}
	for range 3 * probePlaces {
		dialSilent(t, srv.HTTPAddr(), "")
	}
	time.Sleep(100 * time.Millisecond) // all accepted
	client := &http.Client{Timeout: 2 * time.Second}
	for range 2 * probePlaces {
		time.Sleep(grace) // the new silent ones past the grace
		for _, path := range []string{"/healthz", "/readyz"} {
			start := time.Now()
			resp, err := client.Get("http://" + srv.HTTPAddr() + path)
			if err != nil {
				t.Fatalf("GET %s with every place busy and silent connections past the cap: %v", path, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || time.Since(start) > time.Second {
				t.Errorf("GET %s: %s after %v, want 200 at once", path, resp.Status, time.Since(start))
			}
		}
		dialSilent(t, srv.HTTPAddr(), "") // and more keep coming
	}
	// Silent connections coming faster than the grace are refused once
	// every place is held (not counted here): the probes are what matter.
	for i, b := range busy {
		if !stillOpen(b) {
			t.Errorf("busy connection %d closed, want it still waiting for its answer", i)
		}
	}
}

// TestSilentTLSConnectionsMakeRoom: over TLS a connection is silent until
// its handshake is done: ones that sent nothing or only the start of a
// ClientHello give their places to new HTTPS (HTTP/1.1 and HTTP/2) and
// gRPC clients. Closing them is logged once, not once a connection as
// net/http would (a handshake error each).
func TestSilentTLSConnectionsMakeRoom(t *testing.T) {
	const max = 6
	certs := testcert.New(t, "silent")
	files := TLSFiles{CertFile: certs.CertFile, KeyFile: certs.KeyFile}
	var logs syncBuffer
	grace := shortGrace(t)
	srv := capServer(t, Options{HTTPTLS: files, GRPCTLS: files, MaxConnections: max, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	reg := srv.metrics.reg
	open := func(l string, n float64) {
		t.Helper()
		waitFor(t, func() bool {
			return metricValue(t, reg, "sluice_connections_open", map[string]string{"listener": l}) == n
		})
	}
	for i := range max {
		dialSilent(t, srv.HTTPAddr(), []string{"", partialClientHello}[i%2])
		dialSilent(t, srv.GRPCAddr(), []string{"", partialClientHello}[i%2])
	}
	open("http", max)
	open("grpc", max)
	time.Sleep(grace)
	for i := range 4 {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certs.Pool}, ForceAttemptHTTP2: i%2 == 1, DisableKeepAlives: true}
		if i%2 == 0 {
			tr.TLSClientConfig.NextProtos = []string{"http/1.1"}
		}
		// Not a probe, which would be answered past the cap.
		getNow(t, &http.Client{Transport: tr, Timeout: 2 * time.Second}, "https://"+srv.HTTPAddr()+"/v1/policies")
		open("http", max-1) // the new client gone
		dialSilent(t, srv.HTTPAddr(), []string{"", partialClientHello}[i%2])
		open("http", max)
	}
	cc, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(&tls.Config{RootCAs: certs.Pool})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	rlsNow(t, rlsv3.NewRateLimitServiceClient(cc))
	for _, l := range []string{"http", "grpc"} {
		if got := metricValue(t, reg, "sluice_connections_refused_total", map[string]string{"listener": l}); got != 0 {
			t.Errorf("sluice_connections_refused_total{listener=%s} = %v, want 0", l, got)
		}
	}
	if got := metricValue(t, reg, "sluice_connections_idle_closed_total", map[string]string{"listener": "http"}); got != 4 {
		t.Errorf("sluice_connections_idle_closed_total{listener=http} = %v, want 4", got)
	}
	time.Sleep(100 * time.Millisecond) // the closed handshakes end
	if n := strings.Count(logs.String(), "closing silent, stalled or idle connections"); n != 2 || strings.Contains(logs.String(), "handshake error") {
		t.Errorf("log: want one line of closing silent connections per listener, no handshake errors:\n%s", logs.String())
	}
}
