package resilient

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// A backend whose client was closed is no outage: its error
// (sluice.ErrStoreClosed) is returned, the breaker stays closed, and no
// policy answers, so that a release sent again in the background stops
// on it rather than meeting an open breaker until its hold ends.
func TestClosedBackendIsReturned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	s, err := New(redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)}), &Options{Policy: FallbackLocal, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	c.Close()
	l := sluice.Concurrent(2, time.Minute)
	for i := range 20 {
		if _, err := s.Release(ctx, "k", "h"); !errors.Is(err, sluice.ErrStoreClosed) {
			t.Fatalf("Release #%d on a closed backend = %v, want ErrStoreClosed", i+1, err)
		}
	}
	if d, err := s.Acquire(ctx, "k", l, 1, "h"); !errors.Is(err, sluice.ErrStoreClosed) {
		t.Errorf("Acquire on a closed backend = %+v, %v; want ErrStoreClosed, no policy", d, err)
	}
	if st := s.State(); st != sluice.BreakerClosed {
		t.Errorf("breaker %v after calls on a closed backend, want closed", st)
	}
}
