package redistest

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// A port taken between being picked and being bound costs one quick retry,
// not a 10s wait.
func TestStartServerRetriesTakenPort(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	pick := freePort
	t.Cleanup(func() { freePort = pick })
	calls := 0
	freePort = func(t testing.TB) int {
		calls++
		if calls == 1 {
			return taken.Addr().(*net.TCPAddr).Port
		}
		return pick(t)
	}
	begin := time.Now()
	s := StartServer(t)
	elapsed := time.Since(begin)
	if calls != 2 {
		t.Fatalf("picked %d ports, want 2 (the taken one, then a free one)", calls)
	}
	if s.Addr == taken.Addr().String() {
		t.Fatalf("server claims the taken address %s", s.Addr)
	}
	// Generous: a bind failure ends redis-server within milliseconds.
	if elapsed > 5*time.Second {
		t.Errorf("start with one taken port took %v", elapsed)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}

func TestServerRestart(t *testing.T) {
	s := StartServer(t)
	s.Stop()
	s.Stop() // a stopped server: nothing to do
	s.Start(t)
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
}
