package redisstore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
)

// testConns is a masterConns on a fake clock, recording what it tells.
type testConns struct {
	*masterConns
	log     bytes.Buffer
	mu      sync.Mutex
	reasons []string
	counts  map[string]int
	clock   time.Time
}

func newTestConns() *testConns {
	tc := &testConns{counts: map[string]int{}, clock: time.Now()}
	tc.masterConns = newMasterConns((&net.Dialer{Timeout: time.Second}).DialContext,
		slog.New(slog.NewTextHandler(&tc.log, nil)),
		func(r string) { tc.mu.Lock(); tc.reasons = append(tc.reasons, r); tc.mu.Unlock() },
		func(how string) { tc.mu.Lock(); tc.counts[how]++; tc.mu.Unlock() })
	tc.now = func() time.Time { tc.mu.Lock(); defer tc.mu.Unlock(); return tc.clock }
	return tc
}

func (tc *testConns) advance(d time.Duration) {
	tc.mu.Lock()
	tc.clock = tc.clock.Add(d)
	tc.mu.Unlock()
}

func (tc *testConns) lastReason() string {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if len(tc.reasons) == 0 {
		return "(none)"
	}
	return tc.reasons[len(tc.reasons)-1]
}

// TestMasterConnsSwitch: a switch closes the connections to the old master
// and no other; a dial to it then goes to the new one (one log line, one
// count) for sentinelReplacedFor at most: after that the Sentinel is
// followed.
func TestMasterConnsSwitch(t *testing.T) {
	old, other := redistest.StartServer(t).Addr, redistest.StartServer(t).Addr
	tc := newTestConns()
	ctx := context.Background()

	a, err := tc.Dial(ctx, "tcp", old)
	if err != nil {
		t.Fatal(err)
	}
	b, err := tc.Dial(ctx, "tcp", other)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	tc.switched(old, other)
	a.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("old master's connection after the switch: read %v, want closed", err)
	}
	a.Close() // as go-redis would; twice is harmless
	if _, err := b.Write([]byte("PING\r\n")); err != nil {
		t.Errorf("new master's connection after the switch: %v", err)
	}
	if tc.counts["closed"] != 1 || !strings.Contains(tc.lastReason(), "replaced by "+other) {
		t.Errorf("counts %v, reason %q; want one closing, told", tc.counts, tc.lastReason())
	}

	// The client's Sentinel still names the old master.
	tc.advance(time.Second)
	for range 3 {
		c, err := tc.Dial(ctx, "tcp", old)
		if err != nil {
			t.Fatalf("dial to the replaced master: %v", err)
		}
		if got := c.RemoteAddr().String(); got != other {
			t.Errorf("dial to the replaced master reached %s, want the new one, %s", got, other)
		}
		c.Close()
	}
	if tc.counts["redirected"] != 1 || strings.Count(tc.log.String(), redirectedMasterMsg) != 1 {
		t.Errorf("three dials to the old master: counts %v, log:\n%s\nwant one redirection counted and logged", tc.counts, tc.log.String())
	}
	if r := tc.lastReason(); r != "" || !strings.Contains(tc.log.String(), agreedMasterMsg) {
		t.Errorf("on the new master: reason %q, log:\n%s", r, tc.log.String())
	}

	// Long after, a Sentinel naming it means a switch back went unheard.
	tc.advance(sentinelReplacedFor)
	d, err := tc.Dial(ctx, "tcp", old)
	if err != nil {
		t.Fatalf("dial %v after the switch: %v, want the Sentinel followed", sentinelReplacedFor, err)
	}
	if got := d.RemoteAddr().String(); got != old {
		t.Errorf("dial %v after the switch reached %s, want the old master, %s", sentinelReplacedFor, got, old)
	}
	d.Close()
	if !strings.Contains(tc.log.String(), disagreeMasterMsg) || tc.lastReason() != "" {
		t.Errorf("reason %q, log:\n%s", tc.lastReason(), tc.log.String())
	}
}

// TestMasterConnsSwitchBack: a failover back to the old master, announced
// moments after the first, is followed: the connections to the master it
// replaces closed, dials to the old one no longer sent elsewhere.
func TestMasterConnsSwitchBack(t *testing.T) {
	old, other := redistest.StartServer(t).Addr, redistest.StartServer(t).Addr
	tc := newTestConns()
	ctx := context.Background()
	tc.switched(old, other)
	b, err := tc.Dial(ctx, "tcp", old) // the client's Sentinel not told yet: to other, tracked as other's
	if err != nil {
		t.Fatal(err)
	}
	tc.advance(time.Second)
	tc.switched(other, old)
	b.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := b.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("connection to the master replaced in turn: read %v, want closed", err)
	}
	c, err := tc.Dial(ctx, "tcp", old)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.RemoteAddr().String(); got != old {
		t.Errorf("dial after the switch back reached %s, want %s", got, old)
	}
}

// TestMasterConnsSwitchDuringDial: a switch announced while a dial to the
// old master is under way (its closing cannot see that connection) sends
// the dial to the new master.
func TestMasterConnsSwitchDuringDial(t *testing.T) {
	old, other := redistest.StartServer(t).Addr, redistest.StartServer(t).Addr
	tc := newTestConns()
	dial := tc.dial
	var once sync.Once
	tc.dial = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		once.Do(func() { tc.switched(old, other) }) // announced before the first dial returns
		return c, err
	}
	c, err := tc.Dial(context.Background(), "tcp", old)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := c.RemoteAddr().String(); got != other {
		t.Errorf("dial under way at the switch reached %s, want the new master, %s", got, other)
	}
}

// TestMasterConnsMidCall: a take under way on a connection the switch
// closes fails, and is not sent again on a new connection: the server,
// its writes paused, never ran it, and it counts nothing once they resume.
func TestMasterConnsMidCall(t *testing.T) {
	srv := redistest.StartServer(t)
	tc := newTestConns()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, Dialer: tc.Dial})
	defer rdb.Close()
	s := New(rdb, &Options{Prefix: redistest.Prefix(t)})
	ctx := context.Background()
	limit := sluice.PerHour(100)
	if _, err := s.Take(ctx, "k", limit, 1); err != nil {
		t.Fatal(err)
	}
	admin := srv.Client(t)
	if err := admin.Do(ctx, "client", "pause", "5000", "write").Err(); err != nil {
		t.Fatal(err)
	}
	defer admin.Do(ctx, "client", "unpause")
	done := make(chan error, 1)
	go func() {
		_, err := s.Take(ctx, "k", limit, 1)
		done <- err
	}()
	time.Sleep(200 * time.Millisecond) // the take waits on the paused server
	// Past the refusal: a retry could dial the same server again.
	tc.switched(srv.Addr, "127.0.0.1:1")
	tc.advance(sentinelReplacedFor)
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("the take on the closed connection succeeded")
		}
	case <-time.After(3 * time.Second):
		t.Fatal("the take on the closed connection still waits")
	}
	if err := admin.Do(ctx, "client", "unpause").Err(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	d, err := s.Peek(ctx, "k", limit, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got := limit.Rate - d.Remaining; got != 1 {
		t.Errorf("%d taken, want 1: the take on the closed connection ran", got)
	}
}
