package server

import (
	"bufio"
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/internal/testcert"
)

// keepAlive sends one GET /healthz on a new connection, reads the answer
// and leaves the connection open, idle between requests.
func keepAlive(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.Close {
		t.Fatalf("keep-alive /healthz: %s, close %v", resp.Status, resp.Close)
	}
	return c
}

// idleKeepAlive is keepAlive on srv's HTTP listener, returning once the
// server has marked the connection idle. It does so after writing the
// answer, which the client may read first, and orders idle connections by
// that mark: under load, the next connection's whole exchange can come in
// between.
func idleKeepAlive(t *testing.T, srv *Server) net.Conn {
	t.Helper()
	c := keepAlive(t, srv.HTTPAddr())
	l := srv.httpCap
	waitFor(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		cc := l.byAddr[c.LocalAddr().String()]
		return cc != nil && cc.state == connIdle
	})
	return c
}

// getNow asserts that a fresh connection's GET answers 200 within a second.
func getNow(t *testing.T, c *http.Client, url string) {
	t.Helper()
	start := time.Now()
	resp, err := c.Get(url)
	if err != nil {
		t.Errorf("GET %s with the listener at its cap: %v", url, err)
		return
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || time.Since(start) > time.Second {
		t.Errorf("GET %s: %s after %v, want 200 at once", url, resp.Status, time.Since(start))
	}
}

// TestIdleConnectionsMakeRoom: with the HTTP listener's places all held by
// idle keep-alive connections, fresh /healthz and /metrics requests are
// answered at once, each closing the connection idle the longest (not
// waiting out the 2-minute idle timeout), counted; none is refused.
func TestIdleConnectionsMakeRoom(t *testing.T) {
	const max = 20
	srv := slowClientServer(t, max)
	var idle []net.Conn
	for range max {
		idle = append(idle, idleKeepAlive(t, srv)) // in order of idleness
	}
	time.Sleep(idleMin) // all idle long enough to give way
	reg := srv.metrics.reg
	lbl := map[string]string{"listener": "http"}
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	for i := range 6 {
		getNow(t, fresh, "http://"+srv.HTTPAddr()+[]string{"/healthz", "/metrics"}[i%2])
		// Back at the cap once the fresh connection is closed.
		waitFor(t, func() bool { return metricValue(t, reg, "sluice_connections_open", lbl) == max-1 })
		idle = append(idle, keepAlive(t, srv.HTTPAddr()))
	}
	// The six longest idle were closed, the others kept.
	for i, c := range idle {
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		if closed := !isTimeout(err); closed != (i < 6) {
			t.Errorf("idle connection %d (of %d, oldest first): read %v", i, len(idle), err)
		}
	}
	if got := metricValue(t, reg, "sluice_connections_idle_closed_total", lbl); got != 6 {
		t.Errorf("sluice_connections_idle_closed_total{listener=http} = %v, want 6", got)
	}
	if got := metricValue(t, reg, "sluice_connections_refused_total", lbl); got != 0 {
		t.Errorf("sluice_connections_refused_total{listener=http} = %v, want 0", got)
	}
	waitFor(t, func() bool { return metricValue(t, reg, "sluice_connections_open", lbl) == max })
}

// TestIdleConnectionsMakeRoomTLS: the same over HTTPS, HTTP/2 connections
// without streams being idle.
func TestIdleConnectionsMakeRoomTLS(t *testing.T) {
	const max = 10
	certs := testcert.New(t, "http")
	srv := runServer(t, Options{HTTPTLS: TLSFiles{CertFile: certs.CertFile, KeyFile: certs.KeyFile}, MaxConnections: max})
	url := "https://" + srv.HTTPAddr() + "/healthz"
	client := func(keepAlive bool) *http.Client {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certs.Pool}, ForceAttemptHTTP2: true, DisableKeepAlives: !keepAlive}
		t.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr, Timeout: 2 * time.Second}
	}
	lbl := map[string]string{"listener": "http"}
	idle := func() {
		resp, err := client(true).Get(url)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.ProtoMajor != 2 {
			t.Fatalf("keep-alive client spoke %s, want HTTP/2", resp.Proto)
		}
	}
	for range max {
		idle()
	}
	for range 3 {
		time.Sleep(idleMin) // just idle ones go only when no probe place is free
		getNow(t, client(false), url)
		waitFor(t, func() bool { return metricValue(t, srv.metrics.reg, "sluice_connections_open", lbl) == max-1 })
		idle()
	}
	if got := metricValue(t, srv.metrics.reg, "sluice_connections_idle_closed_total", lbl); got != 3 {
		t.Errorf("sluice_connections_idle_closed_total{listener=http} = %v, want 3", got)
	}
}

// TestBusyConnectionsStillCap: with every place held by a request in
// progress (arrived whole, its decision pending) and no probe place free,
// a new connection is closed at once and counted as refused; no busy
// connection is closed for it.
func TestBusyConnectionsStillCap(t *testing.T) {
	const max = 10
	// No probe places: a connection can hold one busy only while its probe
	// is answered (a silent one gives way as under the cap).
	noProbePlaces(t)
	srv, hold, _ := holdingServer(t, Options{MaxConnections: max})
	var busy []net.Conn
	for range max {
		busy = append(busy, hold(dialHTTP(t, srv)))
	}
	closedAtOnce(t, srv.HTTPAddr(), "connection past the cap of busy ones")
	reg := srv.metrics.reg
	lbl := map[string]string{"listener": "http"}
	if got := metricValue(t, reg, "sluice_connections_refused_total", lbl); got != 1 {
		t.Errorf("sluice_connections_refused_total{listener=http} = %v, want 1", got)
	}
	if got := metricValue(t, reg, "sluice_connections_idle_closed_total", lbl); got != 0 {
		t.Errorf("sluice_connections_idle_closed_total{listener=http} = %v, want 0", got)
	}
	for i, b := range busy {
		b.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		if _, err := b.Read(make([]byte, 1)); !isTimeout(err) {
			t.Errorf("busy connection %d: read %v, want it still waiting for its answer", i, err)
		}
	}
}

// noProbePlaces leaves the servers a test starts without probe places.
func noProbePlaces(t *testing.T) {
	old := probePlaces
	probePlaces = 0
	t.Cleanup(func() { probePlaces = old })
}

// TestBusyConnectionsStillAnswerProbes: with every place under the cap
// held by a busy connection, /healthz and /readyz on fresh connections are
// still answered (a pod busy to its cap is alive: a refused liveness probe
// would have Kubernetes restart it), each connection then closed; any
// other request there is refused 503, so that the places stay free for
// probes, and nothing is counted as refused.
func TestBusyConnectionsStillAnswerProbes(t *testing.T) {
	const max = 10
	srv, hold, _ := holdingServer(t, Options{MaxConnections: max})
	for range max {
		hold(dialHTTP(t, srv))
	}
	client := &http.Client{Timeout: 2 * time.Second}
	for range 3 * probePlaces { // more than the places: each is given back
		for _, path := range []string{"/healthz", "/readyz"} {
			resp, err := client.Get("http://" + srv.HTTPAddr() + path)
			if err != nil {
				t.Fatalf("GET %s with every place busy: %v", path, err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || !resp.Close {
				t.Errorf("GET %s with every place busy: %s, close %v; want 200 and the connection closed", path, resp.Status, resp.Close)
			}
		}
	}
	resp, err := client.Post("http://"+srv.HTTPAddr()+"/v1/check", "application/json", strings.NewReader(`{"policy":"p","key":"k"}`))
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Content-Type") != "application/problem+json" || resp.Header.Get("Retry-After") == "" || !resp.Close {
		t.Errorf("check past the cap: %s %v %s; want 503 problem+json with Retry-After, connection closed", resp.Status, resp.Header, body)
	}
	if got := metricValue(t, srv.metrics.reg, "sluice_connections_refused_total", map[string]string{"listener": "http"}); got != 0 {
		t.Errorf("sluice_connections_refused_total{listener=http} = %v, want 0", got)
	}
	// Refused requests of known routes are counted by their endpoint, not
	// as "other".
	for _, path := range []string{"/v1/status", "/metrics"} {
		resp, err := client.Get("http://" + srv.HTTPAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 {
			t.Errorf("GET %s past the cap: %s, want 503", path, resp.Status)
		}
	}
	for _, endpoint := range []string{"POST /v1/check", "GET /v1/status", "GET /metrics"} {
		if got := metricValue(t, srv.metrics.reg, "sluice_api_requests_total", map[string]string{"api": "http", "endpoint": endpoint, "code": "503"}); got != 1 {
			t.Errorf("sluice_api_requests_total{endpoint=%q,code=503} = %v, want 1", endpoint, got)
		}
	}
	if got := metricValue(t, srv.metrics.reg, "sluice_api_requests_total", map[string]string{"api": "http", "endpoint": "other", "code": "503"}); got > 0 {
		t.Errorf(`sluice_api_requests_total{endpoint="other",code=503} = %v, want 0`, got)
	}
}

// TestGRPCIdleConnectionsMakeRoom: gRPC connections without calls in
// progress give their places to new ones at the cap (rather than holding
// them until the 5-minute idle GOAWAY); connections with a call in
// progress (a health Watch) do not, and a new one is refused.
func TestGRPCIdleConnectionsMakeRoom(t *testing.T) {
	const max = 5
	srv := runServer(t, Options{MaxConnections: max})
	reg := srv.metrics.reg
	lbl := map[string]string{"listener": "grpc"}
	check := func(cc *grpc.ClientConn) error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
		return err
	}
	var idle []*grpc.ClientConn
	for range max {
		cc := grpctest.Dial(t, srv.GRPCAddr())
		if err := check(cc); err != nil {
			t.Fatal(err)
		}
		idle = append(idle, cc)
	}
	fresh := grpctest.Dial(t, srv.GRPCAddr())
	if err := check(fresh); err != nil {
		t.Errorf("Check on a new connection with the listener at its cap of idle ones: %v", err)
	}
	idle = append(idle, fresh)
	if got := metricValue(t, reg, "sluice_connections_idle_closed_total", lbl); got != 1 {
		t.Errorf("sluice_connections_idle_closed_total{listener=grpc} = %v, want 1", got)
	}
	if got := metricValue(t, reg, "sluice_connections_refused_total", lbl); got != 0 {
		t.Errorf("sluice_connections_refused_total{listener=grpc} = %v, want 0", got)
	}
	for _, cc := range idle {
		cc.Close()
	}

	// Every place busy: a Watch in progress on each connection.
	waitFor(t, func() bool { return metricValue(t, reg, "sluice_connections_open", lbl) == 0 })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	for range max {
		w, err := healthpb.NewHealthClient(grpctest.Dial(t, srv.GRPCAddr())).Watch(ctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatal(err)
		}
	}
	if err := check(grpctest.Dial(t, srv.GRPCAddr())); status.Code(err) != codes.Unavailable {
		t.Errorf("Check with every connection busy: %v, want Unavailable (refused)", err)
	}
	if got := metricValue(t, reg, "sluice_connections_refused_total", lbl); got < 1 {
		t.Errorf("sluice_connections_refused_total{listener=grpc} = %v, want at least 1", got)
	}
	if got := metricValue(t, reg, "sluice_connections_idle_closed_total", lbl); got != 1 {
		t.Errorf("sluice_connections_idle_closed_total{listener=grpc} = %v, want still 1", got)
	}
}
