package httplimit

import (
	"bufio"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// A request that outlives its hold keeps its slot, the middleware
// extending it while the handler runs, and so does a hijacked connection
// until it is closed. Two servers, each on its own resilient store over
// one Redis: A's request (or hijacked connection) holds the one slot for
// 2.5 holds, and B is refused all along; once it ends, B is admitted.
func TestInFlightExtendedPastHold(t *testing.T) {
	t.Parallel()
	const hold = 600 * time.Millisecond
	for _, hijack := range []bool{false, true} {
		name := map[bool]string{false: "slow handler", true: "hijacked connection"}[hijack]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			prefix := redistest.Prefix(t)
			rules := []InFlightRule{{Name: "one", Limit: sluice.Concurrent(1, hold), Key: Global()}}
			serveOn := func(h http.Handler) *env {
				store, err := resilient.New(redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: prefix}), nil)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { store.Close() })
				return slotEnv(t, store, nil, &Options{InFlight: rules}, h)
			}
			entered, leave, ended := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
			var once sync.Once
			letGo := func() { once.Do(func() { close(leave) }) }
			a := serveOn(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path != "/hold" {
					return
				}
				if !hijack {
					entered <- struct{}{}
					<-leave
					close(ended)
					return
				}
				c, rw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Error(err)
					return
				}
				rw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: test\r\nConnection: Upgrade\r\n\r\n")
				rw.Flush()
				entered <- struct{}{}
				go func() { // the connection outlives the handler
					<-leave
					c.Close()
					close(ended)
				}()
			}))
			b := serveOn(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
			conn, err := net.Dial("tcp", a.srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			defer letGo() // also on a failure: the servers' cleanups wait for the handler
			conn.Write([]byte("GET /hold HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: test\r\n\r\n"))
			<-entered
			for end := time.Now().Add(hold * 5 / 2); time.Now().Before(end); time.Sleep(hold / 4) {
				if r := b.get("/"); r.status != http.StatusTooManyRequests {
					t.Fatalf("B while A holds: %d, want 429 (A's slot lost)", r.status)
				}
			}
			letGo()
			<-ended
			if hijack {
				bufio.NewReader(conn).ReadString('\n')
			}
			var status int
			for range 100 { // the release runs after the handler returns
				if status = b.get("/").status; status == http.StatusOK {
					break
				}
				time.Sleep(10 * time.Millisecond)
			}
			if status != http.StatusOK {
				t.Errorf("B after A ended: %d, want 200", status)
			}
		})
	}
}
