package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// A Membership of a Store whose Cluster client was closed fails at once
// with sluice.ErrStoreClosed once the Store knows it, as the decision
// calls do: go-redis's Cluster client takes 100–150 ms to fail a call on
// a closed client. The Store learns it from a decision call or from a
// Membership call, even one whose deadline is shorter than those 100 ms,
// and each tells the other.
func TestClosedClusterMembership(t *testing.T) {
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 2})
	l := sluice.PerSecond(1_000_000)
	calls := []struct {
		name string
		call func(context.Context, *redisstore.Membership) error
	}{
		{"heartbeat", func(ctx context.Context, m *redisstore.Membership) error {
			_, err := m.Heartbeat(ctx, "a", time.Minute)
			return err
		}},
		{"roster", func(ctx context.Context, m *redisstore.Membership) error {
			_, _, err := m.Roster(ctx, "a", time.Minute)
			return err
		}},
		{"leave", func(ctx context.Context, m *redisstore.Membership) error { return m.Leave(ctx, "a", time.Minute) }},
	}
	for _, first := range []string{"take", "heartbeat"} {
		t.Run("known from a "+first, func(t *testing.T) {
			own := cl.Client(t)
			store := redisstore.New(own, &redisstore.Options{Prefix: redistest.Prefix(t)})
			m := store.Membership()
			ctx := context.Background()
			if _, err := store.Take(ctx, "k", l, 1); err != nil {
				t.Fatal(err)
			}
			for _, c := range calls {
				if err := c.call(ctx, m); err != nil {
					t.Fatalf("%s before Close: %v", c.name, err)
				}
			}
			own.Close()
			short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			var err error
			if first == "take" {
				_, err = store.Take(short, "k", l, 1)
			} else {
				err = calls[0].call(short, m)
			}
			cancel()
			if !errors.Is(err, sluice.ErrStoreClosed) {
				t.Fatalf("first %s after Close, 50ms deadline: %v, want sluice.ErrStoreClosed", first, err)
			}
			var took []time.Duration
			for _, c := range calls {
				start := time.Now()
				err := c.call(ctx, m)
				took = append(took, time.Since(start))
				if !errors.Is(err, sluice.ErrStoreClosed) || !strings.HasPrefix(err.Error(), "redisstore: "+c.name+": ") {
					t.Errorf("%s after Close: %v, want sluice.ErrStoreClosed named %q", c.name, err, c.name)
				}
				if d := took[len(took)-1]; d > 10*time.Millisecond {
					t.Errorf("%s after Close took %v, want it to fail at once", c.name, d)
				}
			}
			start := time.Now()
			_, err = store.Take(ctx, "k", l, 1)
			took = append(took, time.Since(start))
			if !errors.Is(err, sluice.ErrStoreClosed) || took[len(took)-1] > 10*time.Millisecond {
				t.Errorf("Take after Close: %v after %v, want sluice.ErrStoreClosed at once", err, took[len(took)-1])
			}
			t.Logf("heartbeat, roster, leave, take after Close took %v", took)
		})
	}
}
