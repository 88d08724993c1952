package lease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// Close with Redis stopped and no deadline returns in about one return's
// time, not one per lease (it gave units back one lease at a time, each
// waiting out the client's timeouts: 7 s a lease with go-redis's
// defaults), and says how many units it could not give back, over a
// failure policy too (which held every return back, and Close said
// nothing).
func TestFaultCloseRedisStopped(t *testing.T) {
	race.SkipTiming(t)
	for _, over := range []string{"redisstore", "resilient"} {
		t.Run(over, func(t *testing.T) {
			srv := redistest.StartServer(t)
			client := redis.NewClient(&redis.Options{Addr: srv.Addr, ReadTimeout: 500 * time.Millisecond, WriteTimeout: 500 * time.Millisecond})
			t.Cleanup(func() { client.Close() })
			var granter sluice.Granter = redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
			if over == "resilient" {
				rs, err := resilient.NewMulti(granter.(*redisstore.Store), &resilient.Options{Logger: slog.New(slog.DiscardHandler)})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { rs.Close() })
				granter = rs
			}
			s, err := lease.New(granter, &lease.Options{MaxStaleness: time.Minute, Size: 100})
			if err != nil {
				t.Fatal(err)
			}
			l := sluice.PerMinute(600_000)
			const leases = 8
			for i := range leases {
				if d := take(t, s, fmt.Sprint("k", i), l, 1); d.Source != sluice.SourceBackend {
					t.Fatalf("take %d = %+v, want a grant", i, d)
				}
			}
			srv.Pause(t)
			defer srv.Resume(t)
			start := time.Now()
			err = s.Close(context.Background())
			took := time.Since(start)
			t.Logf("Close of %d leases with Redis stopped: %v: %v", leases, took, err)
			if !errors.Is(err, lease.ErrNotReturned) {
				t.Errorf("Close = %v, want lease.ErrNotReturned", err)
			} else if want := fmt.Sprintf("%d units of %d leases", leases*99, leases); !strings.Contains(err.Error(), want) {
				t.Errorf("Close = %v, want it to say %q", err, want)
			}
			if took > 2*time.Second { // 8 × 0.5 s one at a time
				t.Errorf("Close with Redis stopped took %v, want about one return's time", took)
			}
		})
	}
}
