package server

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testcert"
)

// shortGrace shortens silentGrace for a test that needs silent connections
// past it, and returns it.
func shortGrace(t *testing.T) time.Duration {
	old := silentGrace
	silentGrace = 100 * time.Millisecond
	t.Cleanup(func() { silentGrace = old })
	return silentGrace
}

// askHealthz sends GET /healthz on c and reads the answer, keeping c open.
func askHealthz(c net.Conn) error {
	if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		return err
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return nil
}

// TestNewConnectionsAreNotSilentOnes: every new connection is silent until
// its request arrives, a round trip at least; another connection coming in
// that window must not close it while idle keep-alive connections are
// open. With the cap held by idle connections, two clients 10ms apart are
// both answered, each taking an idle one's place, round after round.
func TestNewConnectionsAreNotSilentOnes(t *testing.T) {
	const max = 4
	srv := capServer(t, Options{MaxConnections: max})
	reg := srv.metrics.reg
	lbl := map[string]string{"listener": "http"}
	for range max {
		keepAlive(t, srv.HTTPAddr())
	}
	time.Sleep(idleMin)
	failed := 0
	const rounds = 20
	for range rounds {
		a := dialSilent(t, srv.HTTPAddr(), "")
		time.Sleep(10 * time.Millisecond) // a's request still on its way
		b := dialSilent(t, srv.HTTPAddr(), "")
		for _, c := range []net.Conn{a, b} {
			if err := askHealthz(c); err != nil {
				failed++
			}
		}
		// a and b now idle, the cap's places again.
		waitFor(t, func() bool { return metricValue(t, reg, "sluice_connections_open", lbl) == max })
		time.Sleep(idleMin) // and idle long enough to give way
	}
	if failed > 0 {
		t.Errorf("%d of %d new connections failed with idle keep-alive connections open, want none", failed, 2*rounds)
	}
	if got := metricValue(t, reg, "sluice_connections_idle_closed_total", lbl); got != 2*rounds {
		t.Errorf("sluice_connections_idle_closed_total{listener=http} = %v, want %d (an idle one per new connection)", got, 2*rounds)
	}

	// No idle connection and none silent past the grace: as with busy
	// ones, a probe takes a probe place and the young silent ones stay.
	srv = capServer(t, Options{MaxConnections: 2})
	young := []net.Conn{dialSilent(t, srv.HTTPAddr(), ""), dialSilent(t, srv.HTTPAddr(), "")}
	waitFor(t, func() bool { return metricValue(t, srv.metrics.reg, "sluice_connections_open", lbl) == 2 })
	getNow(t, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}, "http://"+srv.HTTPAddr()+"/healthz")
	for i, c := range young {
		if !stillOpen(c) {
			t.Errorf("silent connection %d, younger than %v, closed", i, silentGrace)
		}
	}
}

// h2PrefaceOnly opens a TLS connection negotiating h2 and sends the HTTP/2
// preface and an empty SETTINGS frame, then nothing: past the handshake,
// without a stream. It returns when the connection is closed, by the
// server or by stop.
func h2PrefaceOnly(addr string, roots *x509.CertPool, stop <-chan struct{}) {
	c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, NextProtos: []string{"h2"}})
	if err != nil {
		return
	}
	defer c.Close()
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-stop:
			c.Close()
		case <-done:
		}
	}()
	io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00")
	io.Copy(io.Discard, c) // the server's settings, then its close
}

// TestIdleHTTP2LeavesProbePlaces: over TLS, HTTP/2 connections that send
// their preface and settings and then no request hold no probe place
// against a probe: with every place under the cap busy and the probe
// places held by such connections, re-dialling as soon as closed,
// /healthz over HTTP/2 is still answered, each time closing one.
func TestIdleHTTP2LeavesProbePlaces(t *testing.T) {
	const max = 4
	certs := testcert.New(t, "h2idle")
	srv, hold, _ := holdingServer(t, Options{HTTPTLS: TLSFiles{CertFile: certs.CertFile, KeyFile: certs.KeyFile}, MaxConnections: max})
	reg := srv.metrics.reg
	lbl := map[string]string{"listener": "http"}
	for range max { // busy: a decision pending
		c, err := tls.Dial("tcp", srv.HTTPAddr(), &tls.Config{RootCAs: certs.Pool, NextProtos: []string{"http/1.1"}})
		if err != nil {
			t.Fatal(err)
		}
		hold(c)
	}
	waitFor(t, func() bool { return metricValue(t, reg, "sluice_connections_open", lbl) == max })
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range probePlaces {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				h2PrefaceOnly(srv.HTTPAddr(), certs.Pool, stop)
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	defer func() {
		close(stop)
		wg.Wait()
	}()
	time.Sleep(300 * time.Millisecond) // the probe places held, idle past idleMin
	ok := 0
	const probes = 16
	for range probes {
		tr := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: certs.Pool}, ForceAttemptHTTP2: true}
		resp, err := (&http.Client{Transport: tr, Timeout: 2 * time.Second}).Get("https://" + srv.HTTPAddr() + "/healthz")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 && resp.ProtoMajor == 2 {
				ok++
			}
		}
		tr.CloseIdleConnections()
		time.Sleep(50 * time.Millisecond)
	}
	if ok != probes {
		t.Errorf("%d of %d /healthz over HTTP/2 answered with the probe places held by idle HTTP/2 connections, want all", ok, probes)
	}
}

// TestJustIdleConnectionsKept: at the cap, a connection idle for less than
// idleMin (likely about to send its next request, which closing it would
// lose) is not closed while a probe place can be had: a probe takes one
// and every keep-alive connection stays open. Past idleMin the longest
// idle goes; with no probe place free, a just-idle one goes rather than
// the new connection being refused.
func TestJustIdleConnectionsKept(t *testing.T) {
	const max = 4
	old := idleMin
	idleMin = time.Second // well past the keep-alive connections' setup
	t.Cleanup(func() { idleMin = old })
	srv := capServer(t, Options{MaxConnections: max})
	reg := srv.metrics.reg
	lbl := map[string]string{"listener": "http"}
	var idle []net.Conn
	for range max {
		idle = append(idle, idleKeepAlive(t, srv)) // in order of idleness
	}
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	getNow(t, fresh, "http://"+srv.HTTPAddr()+"/healthz")
	for i, c := range idle {
		if !stillOpen(c) {
			t.Errorf("keep-alive connection %d, idle for less than %v, closed while a probe place was free", i, idleMin)
		}
	}
	if got := metricValue(t, reg, "sluice_connections_idle_closed_total", lbl); got != 0 {
		t.Errorf("sluice_connections_idle_closed_total{listener=http} = %v, want 0", got)
	}
	time.Sleep(idleMin)
	getNow(t, fresh, "http://"+srv.HTTPAddr()+"/v1/policies") // not a probe: under the cap
	if stillOpen(idle[0]) || !stillOpen(idle[1]) {
		t.Error("past idleMin, the longest idle connection, and only it, was not closed")
	}

	// No probe place: a just-idle connection still gives way.
	noProbePlaces(t)
	srv = capServer(t, Options{MaxConnections: max})
	idle = idle[:0]
	for range max {
		idle = append(idle, idleKeepAlive(t, srv))
	}
	getNow(t, fresh, "http://"+srv.HTTPAddr()+"/v1/policies")
	if stillOpen(idle[0]) {
		t.Error("with no probe place, the longest idle connection, though idle for less than idleMin, was not closed")
	}
	if got := metricValue(t, srv.metrics.reg, "sluice_connections_refused_total", lbl); got != 0 {
		t.Errorf("sluice_connections_refused_total{listener=http} = %v, want 0", got)
	}
}
