package redisstore_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestWatchDials: a dial reaches Redis when its TCP connect succeeds, even
// if the TLS handshake then times out (a stopped Redis behind TLS: the
// kernel accepts, nothing answers); a refused dial and a connect that
// times out (no SYN answered: the address's accept queue is full, see
// redistest.DropAddr) do not. Real dials, through the client's own
// dialer.
func TestWatchDials(t *testing.T) {
	t.Parallel()
	silent := redistest.Listen(t) // accepts (the kernel does) and never speaks
	for _, tc := range []struct {
		name    string
		addr    string
		tls     bool
		reached bool
	}{
		{"answers", redistest.Addr(t), false, true},
		{"refused", redistest.DeadAddr(t), false, false},
		{"connect timed out", redistest.DropAddr(t), false, false},
		{"connect timed out TLS", redistest.DropAddr(t), true, false},
		{"handshake timed out", silent.Addr().String(), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := &redis.Options{Addr: tc.addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1, DialerRetries: 1}
			if tc.tls {
				o.TLSConfig = &tls.Config{ServerName: "localhost"}
			}
			c := redis.NewClient(o)
			t.Cleanup(func() { c.Close() })
			reached := redisstore.WatchDials(c).Reached
			if !reached(tc.addr) || !reached("") {
				t.Fatal("an address not dialled yet reads as not reached")
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			err := c.Ping(ctx).Err()
			if got := reached(tc.addr); got != tc.reached {
				t.Errorf("reached(%s) = %v after a ping that returned %v, want %v", tc.addr, got, err, tc.reached)
			}
			if got := reached(""); got != tc.reached {
				t.Errorf(`reached("") = %v, want %v`, got, tc.reached)
			}
			var ne net.Error
			if !tc.reached || tc.tls {
				if err == nil {
					t.Fatal("the ping succeeded")
				}
			}
			if tc.name == "connect timed out" && !(errors.As(err, &ne) && ne.Timeout()) {
				t.Errorf("the ping's error %v is no timeout: the address did not drop the SYN", err)
			}
		})
	}
}
