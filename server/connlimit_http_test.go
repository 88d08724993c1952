package server

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/memory"
)

// holdingServer is capServer with a store that holds every decision until
// release is called, or the test ends. hold sends a whole /v1/check on c
// and returns once its decision is held: c is then busy, its request
// arrived whole and being answered.
func holdingServer(t *testing.T, opts Options) (srv *Server, hold func(c net.Conn) net.Conn, release func()) {
	t.Helper()
	store := &blockingStore{Store: memory.New(nil), entered: make(chan struct{}, 1024), release: make(chan struct{})}
	t.Cleanup(func() { store.Store.Close() })
	opts.Store = store
	srv = capServer(t, opts)
	var once sync.Once
	release = func() { once.Do(func() { close(store.release) }) }
	t.Cleanup(release) // before the server's shutdown
	return srv, func(c net.Conn) net.Conn {
		t.Helper()
		t.Cleanup(func() { c.Close() })
		body := `{"policy":"p","key":"k"}`
		fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		select {
		case <-store.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("a held request never reached the store")
		}
		return c
	}, release
}

// dialHTTP dials srv's HTTP listener.
func dialHTTP(t *testing.T, srv *Server) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", srv.HTTPAddr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// slowPost sends the headers of a POST of a bodyLen-byte body and the
// first bytes of it: the rest is still to come.
func slowPost(c net.Conn, path, hdr string, bodyLen int, first string) {
	fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", path, hdr, bodyLen, first)
}

// answer reads c's answer to its request (within d), and then how soon
// the server closes c: -1 if not within 3s.
func answer(t *testing.T, c net.Conn, d time.Duration) (resp *http.Response, closedAfter time.Duration) {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(d))
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer within %v: %v", d, err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	start := time.Now()
	c.SetReadDeadline(start.Add(3 * time.Second))
	if _, err := br.ReadByte(); isTimeout(err) {
		return resp, -1
	}
	return resp, time.Since(start)
}

// TestHTTPRefusalsDoNotReadTheBody: a request refused before its body was
// read (401, 403, 413, 415 and the like) is answered at once with
// Connection: close, the connection then closed, rather than answered once
// the whole body came at the client's pace (net/http reads it first), up
// to the read timeout: a refused client that sends slowly holds nothing.
// A request whose body was read keeps its connection.
func TestHTTPRefusalsDoNotReadTheBody(t *testing.T) {
	srv := capServer(t, Options{DecisionToken: "dec"})
	big := strings.Repeat(" ", MaxBodyBytes+1)
	for _, tt := range []struct {
		what string
		send func(c net.Conn)
		code int
	}{
		{"no token", func(c net.Conn) { slowPost(c, "/v1/check", "", 1000, "{") }, 401},
		{"a wrong token", func(c net.Conn) { slowPost(c, "/v1/check", "Authorization: Bearer nope\r\n", 1000, "{") }, 403},
		{"not JSON", func(c net.Conn) {
			fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer dec\r\nContent-Type: text/plain\r\nContent-Length: 1000\r\n\r\n{")
		}, 415},
		{"a body too large", func(c net.Conn) { slowPost(c, "/v1/check", "Authorization: Bearer dec\r\n", 2*MaxBodyBytes, big) }, 413},
		{"a wrong method", func(c net.Conn) {
			fmt.Fprintf(c, "PUT /v1/check HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
		}, 405},
	} {
		c := dialHTTP(t, srv)
		tt.send(c)
		// The read timeout is 20s: an answer within 10s was not waiting for
		// the body.
		resp, closed := answer(t, c, 10*time.Second)
		if resp.StatusCode != tt.code || !resp.Close || resp.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s, body still coming: %s %v; want %d problem+json, Connection: close", tt.what, resp.Status, resp.Header, tt.code)
		}
		if closed < 0 {
			t.Errorf("%s: the connection still open 3s after the refusal", tt.what)
		}
	}

	// A body read whole: the connection is kept, for the next request.
	c := dialHTTP(t, srv)
	for i := range 2 {
		fmt.Fprintf(c, "POST /v1/check HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Type: application/json\r\nContent-Length: 24\r\n\r\n{\"policy\":\"p\",\"key\":\"k\"}", []string{"dec", "nope"}[i])
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if want := []int{200, 403}[i]; resp.StatusCode != want || (i == 0 && resp.Close) {
			t.Errorf("whole request %d: %s, close %v; want %d, the first keeping its connection", i, resp.Status, resp.Close, want)
		}
	}
}

// TestProbePlacesTakeProbesAlone: on a probe place (every place under the
// cap busy), a request other than GET or HEAD /healthz or /readyz without
// a body is refused 503 at once, its body unread, and the connection
// closed then, not held until the body came or the place's 5s ran out; a
// probe is still answered.
func TestProbePlacesTakeProbesAlone(t *testing.T) {
	const max = 4
	srv, hold, _ := holdingServer(t, Options{MaxConnections: max})
	for range max {
		hold(dialHTTP(t, srv))
	}
	for _, tt := range []struct {
		what string
		send func(c net.Conn)
		code int
	}{
		{"a check, its body still coming", func(c net.Conn) { slowPost(c, "/v1/check", "", 1000, "{") }, 503},
		{"a POST to /healthz", func(c net.Conn) { slowPost(c, "/healthz", "", 1000, "{") }, 503},
		{"a GET of /healthz with a body", func(c net.Conn) {
			io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
		}, 503},
		{"a GET of /healthz", func(c net.Conn) { io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n") }, 200},
		{"a HEAD of /readyz", func(c net.Conn) { io.WriteString(c, "HEAD /readyz HTTP/1.1\r\nHost: x\r\n\r\n") }, 200},
	} {
		c := dialHTTP(t, srv)
		tt.send(c)
		resp, closed := answer(t, c, 10*time.Second)
		if resp.StatusCode != tt.code || !resp.Close {
			t.Errorf("%s on a probe place: %s, close %v; want %d, Connection: close", tt.what, resp.Status, resp.Close, tt.code)
		}
		if closed < 0 { // well before the place's 5s
			t.Errorf("%s on a probe place: the connection still open 3s after the answer; want it closed then", tt.what)
		}
	}
}

// TestSlowBodiesMakeRoom: at the cap, a connection whose request has not
// arrived whole (a body still coming) since the grace is as bad as a
// silent one: a new client takes its place, the oldest first, counted;
// one younger than the grace keeps its place.
func TestSlowBodiesMakeRoom(t *testing.T) {
	const max = 6
	grace := shortGrace(t)
	srv := capServer(t, Options{MaxConnections: max})
	reg := srv.metrics.reg
	lbl := map[string]string{"listener": "http"}
	var slow []net.Conn
	for range max {
		c := dialHTTP(t, srv)
		slowPost(c, "/v1/check", "", 1000, "{")
		slow = append(slow, c)
		time.Sleep(5 * time.Millisecond) // in order of age
	}
	waitFor(t, func() bool { return metricValue(t, reg, "sluice_connections_open", lbl) == max })
	time.Sleep(grace)
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 2 * time.Second}
	getNow(t, fresh, "http://"+srv.HTTPAddr()+"/v1/policies") // not a probe: under the cap
	if stillOpen(slow[0]) {
		t.Error("the oldest connection with a body still coming is still open")
	}
	for i := 1; i < max; i++ {
		if !stillOpen(slow[i]) {
			t.Errorf("slow connection %d of %d (oldest first) closed, want only the oldest", i, max)
		}
	}
	if got := metricValue(t, reg, "sluice_connections_idle_closed_total", lbl); got != 1 {
		t.Errorf("sluice_connections_idle_closed_total{listener=http} = %v, want 1", got)
	}
	// A younger one: the next new connection takes a probe place instead.
	young := dialHTTP(t, srv)
	slowPost(young, "/v1/check", "", 1000, "{")
	waitFor(t, func() bool { return metricValue(t, reg, "sluice_connections_open", lbl) == max })
	getNow(t, fresh, "http://"+srv.HTTPAddr()+"/healthz")
	if !stillOpen(young) {
		t.Error("a connection with its body coming for less than the grace was closed for a probe")
	}
}

// slowPosters keeps n connections to addr each sending a POST /v1/check's
// headers and then a body byte every interval, dialling again as soon as
// one is closed, until the test ends: the review's attack.
func slowPosters(t *testing.T, addr string, n int, interval time.Duration) {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			for {
				c, err := net.Dial("tcp", addr)
				if err == nil {
					slowPost(c, "/v1/check", "", 100000, "{")
					closed := make(chan struct{})
					go func() { io.Copy(io.Discard, c); close(closed) }()
				drip:
					for {
						select {
						case <-stop:
							c.Close()
							return
						case <-closed:
							break drip
						case <-time.After(interval):
							c.Write([]byte(" "))
						}
					}
					c.Close()
				}
				select {
				case <-stop:
					return
				case <-time.After(20 * time.Millisecond):
				}
			}
		})
	}
	t.Cleanup(func() { close(stop); wg.Wait() })
}

// TestFaultSlowBodiesLeaveProbesRoom: `sluice serve --max-connections 10`
// held by more connections than that, each sending a POST's headers and
// then a byte of its body now and then, dialling again whenever closed,
// with and without --decision-token. Health probes (a new connection
// each, as a kubelet's) are answered, all but a few at once; and a
// refused request with its body still coming is answered at once, not
// when the read timeout ends it.
func TestFaultSlowBodiesLeaveProbesRoom(t *testing.T) {
	race.SkipTiming(t)
	file := writeConfig(t, "policies:\n  - name: p\n    limit: 1000000/s\n")
	for _, token := range []string{"", "dec"} {
		t.Run(fmt.Sprintf("token=%q", token), func(t *testing.T) {
			p := startCapped(t, file, token)
			// More than the cap and the probe places.
			slowPosters(t, p.http, 24, 200*time.Millisecond)
			time.Sleep(time.Second) // every place taken, again and again
			var took []time.Duration
			failed := 0
			for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
				start := time.Now()
				tr := &http.Transport{DisableKeepAlives: true}
				resp, err := (&http.Client{Transport: tr, Timeout: time.Second}).Get("http://" + p.http + "/healthz")
				if err != nil || resp.StatusCode != 200 {
					failed++
				} else {
					took = append(took, time.Since(start))
				}
				if err == nil {
					resp.Body.Close()
				}
			}
			slices.Sort(took)
			n := len(took) + failed
			p90 := time.Hour
			if len(took) > 0 {
				p90 = took[len(took)*9/10]
			}
			t.Logf("/healthz: %d of %d answered, 90th percentile %v", len(took), n, p90)
			if failed > n/20 || p90 > 100*time.Millisecond {
				t.Errorf("/healthz with the listener held by slow bodies: %d of %d failed, 90th percentile of those answered %v; want 95%% answered, the 90th within 100ms",
					failed, n, p90)
			}
			if token == "" {
				return
			}
			var answered []time.Duration
			for range 20 {
				c, err := net.Dial("tcp", p.http)
				if err != nil {
					t.Fatal(err)
				}
				start := time.Now()
				slowPost(c, "/v1/check", "", 1000, "{")
				c.SetReadDeadline(time.Now().Add(5 * time.Second))
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				c.Close()
				// 503 on a probe place, past the cap.
				if err != nil || (resp.StatusCode != 401 && resp.StatusCode != 503) {
					t.Errorf("a check without the token, its body still coming: %v %v; want 401 (503 past the cap)", resp, err)
					continue
				}
				answered = append(answered, time.Since(start))
			}
			slices.Sort(answered)
			if len(answered) == 0 {
				return
			}
			if p90, max := answered[len(answered)*9/10], answered[len(answered)-1]; p90 > 100*time.Millisecond || max > 2*time.Second {
				t.Errorf("a check without the token, its body still coming, refused after: 90th percentile %v, slowest %v; want within 100ms, none past 2s", p90, max)
			}
		})
	}
}

// startCapped runs `sluice serve` on file at --max-connections 10, with
// --decision-token when token is not empty.
func startCapped(t *testing.T, file, token string) *proc {
	t.Helper()
	args := []string{"--config", file, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0", "--max-connections", "10"}
	if token != "" {
		args = append(args, "--decision-token", token)
	}
	return startSluice(t, nil, args...)
}
