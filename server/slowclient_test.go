package server

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/connectivity"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice/internal/grpctest"
)

// shortTimeouts shortens the servers' timeouts for one test.
func shortTimeouts(t *testing.T) {
	t.Helper()
	h, r, hs, idle := httpReadHeaderTimeout, httpReadTimeout, grpcHandshake, grpcMaxIdle
	httpReadHeaderTimeout, httpReadTimeout, grpcHandshake, grpcMaxIdle = time.Second, 2*time.Second, time.Second, time.Second
	t.Cleanup(func() { httpReadHeaderTimeout, httpReadTimeout, grpcHandshake, grpcMaxIdle = h, r, hs, idle })
}

func slowClientServer(t *testing.T, maxConns int) *Server {
	t.Helper()
	shortTimeouts(t)
	return capServer(t, Options{MaxConnections: maxConns})
}

// capServer serves policy p and the RLS domain d (descriptor k) with opts
// (a connection cap, TLS).
func capServer(t *testing.T, opts Options) *Server {
	t.Helper()
	file := writeConfig(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n---\npolicies:\n  - name: p\n    limit: 1000000/s\n")
	opts.ConfigFile, opts.WatchInterval = file, -1
	srv := startServer(t, opts)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
	})
	return srv
}

// promptly asserts that /healthz and a gRPC ShouldRateLimit both answer
// within a second.
func promptly(t *testing.T, srv *Server) {
	t.Helper()
	hc := &http.Client{Timeout: time.Second}
	resp, err := hc.Get("http://" + srv.HTTPAddr() + "/healthz")
	if err != nil {
		t.Errorf("/healthz: %v", err)
	} else {
		resp.Body.Close()
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := dialRLS(t, srv.GRPCAddr()).ShouldRateLimit(ctx, rlsRequest("d", desc("k=v"))); err != nil {
		t.Errorf("ShouldRateLimit: %v", err)
	}
}

// TestSlowBodiesCut: clients that send their headers, then a body byte
// every 300ms, are cut off at the read timeout (2s here) with a 408, while
// /healthz and gRPC keep answering.
func TestSlowBodiesCut(t *testing.T) {
	srv := slowClientServer(t, 400)
	const drippers = 300
	type cut struct {
		after  time.Duration
		status string
	}
	cuts := make(chan cut, drippers)
	var wg sync.WaitGroup
	for range drippers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", srv.HTTPAddr())
			if err != nil {
				cuts <- cut{status: "dial: " + err.Error()}
				return
			}
			defer c.Close()
			start := time.Now()
			io.WriteString(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 60000\r\n\r\n{")
			done := make(chan cut, 1)
			go func() {
				c.SetReadDeadline(time.Now().Add(15 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				io.Copy(io.Discard, c)
				done <- cut{time.Since(start), strings.TrimSpace(line)}
			}()
			tick := time.NewTicker(300 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case r := <-done:
					cuts <- r
					return
				case <-tick.C:
					c.Write([]byte(" "))
				}
			}
		}()
	}
	time.Sleep(500 * time.Millisecond)
	for range 3 { // while every dripper holds its connection
		promptly(t, srv)
		time.Sleep(300 * time.Millisecond)
	}
	wg.Wait()
	close(cuts)
	var late int
	for c := range cuts {
		if c.after > 4*time.Second || !strings.HasPrefix(c.status, "HTTP/1.1 408") {
			late++
			if late <= 3 {
				t.Errorf("dripper cut after %v with %q; want a 408 within the 2s read timeout (plus slack)", c.after, c.status)
			}
		}
	}
	if late > 0 {
		t.Errorf("%d of %d drippers not cut in time", late, drippers)
	}
	promptly(t, srv)
}

// TestConnectionCap: past --max-connections of busy ones (and, on HTTP,
// the probe places: none here) a listener closes new connections as soon
// as it accepts them, counted; the other listener still answers, and the
// cap frees as the busy requests are answered.
func TestConnectionCap(t *testing.T) {
	const max = 50
	noProbePlaces(t)
	srv, hold, release := holdingServer(t, Options{MaxConnections: max})
	for range max {
		hold(dialHTTP(t, srv))
	}
	closedAtOnce(t, srv.HTTPAddr(), "connection past the cap")
	if got := metricValue(t, srv.metrics.reg, "sluice_connections_refused_total", map[string]string{"listener": "http"}); got < 1 {
		t.Errorf("sluice_connections_refused_total{listener=http} = %v, want at least 1", got)
	}
	if got := metricValue(t, srv.metrics.reg, "sluice_connections_open", map[string]string{"listener": "http"}); got != max {
		t.Errorf("sluice_connections_open{listener=http} = %v, want %d", got, max)
	}
	// gRPC has its own cap (a health check: the store holds decisions).
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(grpctest.Dial(t, srv.GRPCAddr())).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("gRPC health check with HTTP at its cap: %v", err)
	}
	// The answers sent, the connections are idle: they give way.
	release()
	waitFor(t, func() bool {
		resp, err := (&http.Client{Timeout: time.Second}).Get("http://" + srv.HTTPAddr() + "/healthz")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil
	})
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// TestGRPCIdleConnectionsReclaimed: a connection that never finishes the
// HTTP/2 handshake is closed after the handshake timeout, and one without
// calls is sent away after the idle time (1s each here).
func TestGRPCIdleConnectionsReclaimed(t *testing.T) {
	srv := slowClientServer(t, 0)
	raw, err := net.Dial("tcp", srv.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	start := time.Now()
	raw.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.Copy(io.Discard, raw)
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("silent connection closed after %v, want about 1s", d)
	}

	cc := grpctest.Dial(t, srv.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, rlsRequest("d", desc("k=v"))); err != nil {
		t.Fatal(err)
	}
	// GOAWAY for idleness turns the client's connection idle.
	for s := cc.GetState(); s != connectivity.Idle; s = cc.GetState() {
		if !cc.WaitForStateChange(ctx, s) {
			t.Fatalf("client connection still %v after 5s; want idle after the server's 1s idle limit", s)
		}
	}
}

// closedAtOnce dials addr and fails t unless the connection is closed
// within a second, without a byte.
func closedAtOnce(t *testing.T, addr, what string) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil || isTimeout(err) {
		t.Errorf("%s: read %v, want it closed at once", what, err)
	}
}
