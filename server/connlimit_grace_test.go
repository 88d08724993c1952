package server

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
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
