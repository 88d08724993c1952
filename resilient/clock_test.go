package resilient

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// The default fallback keeps time by Options.Clock, as the breaker and the
// deny cache do: with Redis refusing connections, a key the fallback
// denied for an hour is admitted again once the injected clock has moved
// an hour, while the real clock has not.
func TestDefaultFallbackUsesClock(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	clk := storetest.NewClock(t0)
	s, err := New(redisstore.New(c, nil), &Options{Clock: clk.Now, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	lim := sluice.PerHour(1)
	take := func(what string, want bool) {
		t.Helper()
		d, err := s.Take(context.Background(), "k", lim, 1)
		if err != nil || d.Allowed != want || d.Source != sluice.SourceFallback {
			t.Fatalf("%s: %+v, %v; want allowed=%v by the fallback", what, d, err, want)
		}
	}
	take("first take", true)
	take("second take", false)
	clk.Advance(time.Hour)
	take("an hour later by the injected clock", true)
}
