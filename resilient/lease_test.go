package resilient_test

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/lease"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// leaseOver returns a resilient store falling back locally around a lease
// store over Redis.
func leaseOver(t *testing.T, o *lease.Options) *resilient.MultiStore {
	t.Helper()
	rs := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	ls, err := lease.New(rs, o)
	if err != nil {
		t.Fatal(err)
	}
	s, err := resilient.NewMulti(ls, &resilient.Options{Policy: resilient.FallbackLocal, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// takeBackend takes one unit of key under limit and wants the backend's
// answer, not the failure policy's.
func takeBackend(t *testing.T, s sluice.Store, key string, limit sluice.Limit) {
	t.Helper()
	d, err := s.Take(context.Background(), key, limit, 1)
	if err != nil {
		t.Fatalf("valid limit %v: %v", limit, err)
	}
	if d.Source == sluice.SourceFallback || !d.Allowed {
		t.Fatalf("valid limit %v: %+v, want allowed by the backend (lease or store)", limit, d)
	}
}

// A limit the lease store refuses for every key is refused when a Limiter
// is built on the resilient store around it; one that gets past (a Store
// call made directly) is the caller's error, and never opens the breaker
// for the limits that are valid.
func TestRedisLeaseRefusedLimit(t *testing.T) {
	t.Parallel()
	s := leaseOver(t, &lease.Options{MaxStaleness: time.Second})
	fast := sluice.Limit{Rate: 5, Period: 500 * time.Millisecond}
	if _, err := sluice.NewLimiter(s, fast, nil); !errors.Is(err, lease.ErrInvalidStaleness) {
		t.Fatalf("NewLimiter(%v) err = %v, want lease.ErrInvalidStaleness", fast, err)
	}
	if _, err := sluice.NewLimiter(s, sluice.PerMinute(100), nil); err != nil {
		t.Fatalf("NewLimiter(100/min): %v", err)
	}
	for i := range 40 {
		d, err := s.Take(context.Background(), "fast", fast, 1)
		if !errors.Is(err, lease.ErrInvalidStaleness) {
			t.Fatalf("take %d under %v: %+v, %v; want lease.ErrInvalidStaleness", i+1, fast, d, err)
		}
	}
	if st := s.State(); st != sluice.BreakerClosed {
		t.Fatalf("after 40 refused limits the breaker is %v, want closed", st)
	}
	takeBackend(t, s, "slow", sluice.PerMinute(100))
}

// A lease Options.For asks for of a sliding window log is refused with
// sluice.ErrGrantUnsupported: the caller's error, not the backend's.
func TestRedisLeaseGrantUnsupportedNotAFailure(t *testing.T) {
	t.Parallel()
	s := leaseOver(t, &lease.Options{For: func(string, sluice.Limit) time.Duration { return time.Second }})
	logLimit := sluice.PerMinute(10).WithAlgorithm(sluice.SlidingWindowLog)
	for i := range 40 {
		d, err := s.Take(context.Background(), "log", logLimit, 1)
		if !errors.Is(err, sluice.ErrGrantUnsupported) {
			t.Fatalf("take %d under %v: %+v, %v; want sluice.ErrGrantUnsupported", i+1, logLimit, d, err)
		}
	}
	if st := s.State(); st != sluice.BreakerClosed {
		t.Fatalf("after 40 refused limits the breaker is %v, want closed", st)
	}
	takeBackend(t, s, "api", sluice.PerMinute(100))
}
