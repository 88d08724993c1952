package httplimit

import (
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// A release that fails (Redis down as the handler returns) is sent again
// in the background: once Redis is back, the slot frees within seconds,
// not at its 30s hold.
func TestInFlightFailedReleaseRetried(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always") // the slot survives a restart
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	obs := &slotRecorder{}
	entered, leave := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	letGo := func() { once.Do(func() { close(leave) }) }
	defer letGo()
	e := slotEnv(t, store, nil, &Options{Observer: obs,
		InFlight: []InFlightRule{{Name: "one", Limit: sluice.Concurrent(1, 30*time.Second), Key: Global()}}},
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/hold" {
				entered <- struct{}{}
				<-leave
			}
		}))
	conn, err := net.Dial("tcp", e.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.Write([]byte("GET /hold HTTP/1.1\r\nHost: x\r\n\r\n"))
	<-entered
	srv.Stop()
	letGo() // its release fails: Redis is down
	for end := time.Now().Add(5 * time.Second); obs.count("one/release/error") == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("no failed release")
		}
	}
	time.Sleep(500 * time.Millisecond) // tries fail meanwhile
	srv.Start(t)
	back := time.Now()
	status := 0
	for time.Since(back) < 10*time.Second {
		if status = e.get("/").status; status == http.StatusOK {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if status != http.StatusOK {
		t.Fatalf("10s after Redis came back: %d, want 200 (the failed release sent again)", status)
	}
	t.Logf("slot free %v after Redis came back", time.Since(back).Round(10*time.Millisecond))
	if n := obs.count("one/release/allowed"); n != 2 {
		t.Errorf("%d releases reported freed, want 2 (the one sent again, the second request's)", n)
	}
}

func (r *slotRecorder) count(k string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[k]
}
