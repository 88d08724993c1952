package enforce

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// resilient's Timeout bounds each store call, not a request, as the README
// says: with Redis stalled (SIGSTOP) a Reject rule's request waits one
// Timeout (its take), a Penalty rule's two (the block check, then the
// take), and the Penalty request that starts a block three (the block's
// take too). Over a real redis-server.
func TestFaultPenaltyTimeoutPerStoreCall(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	srv := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: srv.Addr, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	// A long Timeout, so that a busy machine cannot blur one call into
	// two; a breaker that stays closed, so that every call waits it out.
	const timeout = 200 * time.Millisecond
	store, err := resilient.NewMulti(redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)}), &resilient.Options{
		Timeout: timeout, MinCalls: 1 << 20, FailureThreshold: 1 << 20, DeadAfter: time.Hour,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	key := func(r string) (string, error) { return r, nil }
	rules := map[Strategy]*Rules[string]{}
	for _, s := range []Strategy{Reject, Penalty} {
		r := Rule{Name: s.String(), Limit: sluice.PerMinute(1), Strategy: s}
		if s == Penalty {
			r.Penalty = time.Minute
		}
		rs, err := NewRules(store, []Spec[string]{{Rule: r, Key: key}}, "p:", nil, nil, errors.New("no key"))
		if err != nil {
			t.Fatal(err)
		}
		rules[s] = rs
	}
	decide := func(s Strategy, req string) (bool, time.Duration) {
		t.Helper()
		checks, err := rules[s].Collect(req, nil)
		if err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		v, err := rules[s].Enforce(context.Background(), checks)
		if err != nil {
			t.Fatal(err)
		}
		return v.Allowed, time.Since(start)
	}
	// Load the scripts while Redis answers.
	decide(Reject, "warm")
	decide(Penalty, "warm")

	srv.Pause(t)
	t.Cleanup(func() { srv.Resume(t) })
	for _, tt := range []struct {
		what     string
		strategy Strategy
		allowed  bool
		calls    int
	}{
		{"reject, admitted", Reject, true, 1},
		{"penalty, admitted", Penalty, true, 2},
		{"penalty, denied: the block starts", Penalty, false, 3},
	} {
		// The fallback admits each key's first request and denies its
		// second: one key per strategy, taken in turn.
		allowed, took := decide(tt.strategy, "stalled")
		if allowed != tt.allowed {
			t.Fatalf("%s: allowed %v", tt.what, allowed)
		}
		lo, hi := time.Duration(tt.calls)*timeout, time.Duration(tt.calls+1)*timeout
		if took < lo || took >= hi {
			t.Errorf("%s: took %v, want %d Timeouts (%v to %v)", tt.what, took, tt.calls, lo, hi)
		}
	}
}
