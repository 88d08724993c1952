package redisstore_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// Members count each other under one prefix only, and drop out when they
// stop renewing; on a Cluster too (the registry is one key).
func TestMembershipHeartbeat(t *testing.T) {
	t.Parallel()
	t.Run("standalone", func(t *testing.T) {
		t.Parallel()
		testHeartbeat(t, redistest.Client(t))
	})
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		testHeartbeat(t, redistest.ClusterClient(t))
	})
}

func testHeartbeat(t *testing.T, client redis.UniversalClient) {
	prefix := redistest.Prefix(t)
	a := redisstore.New(client, &redisstore.Options{Prefix: prefix}).Membership()
	b := redisstore.New(client, &redisstore.Options{Prefix: prefix}).Membership()
	other := redisstore.New(client, &redisstore.Options{Prefix: prefix + "other:"}).Membership()
	ctx := context.Background()
	beat := func(m *redisstore.Membership, member string, ttl time.Duration) int {
		t.Helper()
		n, err := m.Heartbeat(ctx, member, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got, want := beat(a, "a", time.Minute), 1; got != want {
		t.Errorf("first member counts %d, want %d", got, want)
	}
	if got, want := beat(b, "b", 200*time.Millisecond), 2; got != want {
		t.Errorf("second member counts %d, want %d", got, want)
	}
	if got, want := beat(a, "a", time.Minute), 2; got != want {
		t.Errorf("renewal counts %d, want %d", got, want)
	}
	if got, want := beat(other, "c", time.Minute), 1; got != want {
		t.Errorf("another prefix counts %d, want %d", got, want)
	}
	time.Sleep(300 * time.Millisecond)
	if got, want := beat(a, "a", time.Minute), 1; got != want {
		t.Errorf("after b's registration expired: %d, want %d", got, want)
	}
	ttl, err := client.PTTL(ctx, a.Key()).Result()
	if err != nil || ttl <= 0 || ttl > time.Minute {
		t.Errorf("registry TTL %v, %v; want (0, 1m]", ttl, err)
	}
	if _, err := a.Heartbeat(ctx, "", time.Second); !errors.Is(err, redisstore.ErrInvalidHeartbeat) {
		t.Errorf("empty member: %v, want ErrInvalidHeartbeat", err)
	}
	if _, err := (&redisstore.Store{}).Membership().Heartbeat(ctx, "a", time.Second); !errors.Is(err, redisstore.ErrNoClient) {
		t.Errorf("zero Store: %v, want ErrNoClient", err)
	}
}

// Roster names the members alive and those that left; a member that
// leaves is out of the count at once and listed as withdrawn for the time
// it gave, or until it registers again under its name; on a Cluster too
// (both keys share a hash slot).
func TestMembershipLeave(t *testing.T) {
	t.Parallel()
	for name, client := range map[string]func(*testing.T) redis.UniversalClient{
		"standalone": func(t *testing.T) redis.UniversalClient { return redistest.Client(t) },
		"cluster":    func(t *testing.T) redis.UniversalClient { return redistest.ClusterClient(t) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			m := redisstore.New(client(t), &redisstore.Options{Prefix: redistest.Prefix(t)}).Membership()
			ctx := context.Background()
			roster := func(member string) (alive, left []string) {
				t.Helper()
				alive, left, err := m.Roster(ctx, member, time.Minute)
				if err != nil {
					t.Fatal(err)
				}
				return alive, left
			}
			roster("a")
			if alive, left := roster("b"); len(alive) != 2 || len(left) != 0 {
				t.Fatalf("alive %q, left %q; want a and b, none", alive, left)
			}
			if err := m.Leave(ctx, "b", 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			if alive, left := roster("a"); len(alive) != 1 || alive[0] != "a" || len(left) != 1 || left[0] != "b" {
				t.Errorf("after b left: alive %q, left %q; want a, b", alive, left)
			}
			if n, err := m.Heartbeat(ctx, "a", time.Minute); err != nil || n != 1 {
				t.Errorf("Heartbeat counts %d, %v; want 1", n, err)
			}
			// b restarts under its name: alive, and no longer withdrawn.
			if alive, left := roster("b"); len(alive) != 2 || len(left) != 0 {
				t.Errorf("b back: alive %q, left %q; want a and b, none", alive, left)
			}
			if err := m.Leave(ctx, "b", 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			time.Sleep(300 * time.Millisecond)
			if _, left := roster("a"); len(left) != 0 {
				t.Errorf("left %q after its listing expired, want none", left)
			}
			if err := m.Leave(ctx, "", time.Second); !errors.Is(err, redisstore.ErrInvalidHeartbeat) {
				t.Errorf("Leave without a member: %v", err)
			}
		})
	}
}

// Each Membership call's error names that call, whatever failed: no
// client, bad input, or Redis down. The errors stay typed.
func TestMembershipErrorsNameTheCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	down := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialTimeout: time.Second})
	t.Cleanup(func() { down.Close() })
	calls := []struct {
		name string
		call func(m *redisstore.Membership, member string) error
	}{
		{"heartbeat", func(m *redisstore.Membership, member string) error {
			_, err := m.Heartbeat(ctx, member, time.Second)
			return err
		}},
		{"roster", func(m *redisstore.Membership, member string) error {
			_, _, err := m.Roster(ctx, member, time.Second)
			return err
		}},
		{"leave", func(m *redisstore.Membership, member string) error { return m.Leave(ctx, member, time.Second) }},
	}
	for _, c := range calls {
		for _, tc := range []struct {
			what   string
			m      *redisstore.Membership
			member string
			want   error // nil: any error
		}{
			{"no client", (&redisstore.Store{}).Membership(), "a", redisstore.ErrNoClient},
			{"empty member", redisstore.New(down, nil).Membership(), "", redisstore.ErrInvalidHeartbeat},
			{"Redis down", redisstore.New(down, nil).Membership(), "a", nil},
		} {
			err := c.call(tc.m, tc.member)
			if err == nil || tc.want != nil && !errors.Is(err, tc.want) {
				t.Errorf("%s, %s: %v, want %v", c.name, tc.what, err, tc.want)
				continue
			}
			if prefix := "redisstore: " + c.name + ": "; !strings.HasPrefix(err.Error(), prefix) {
				t.Errorf("%s, %s: %q, want it to begin %q", c.name, tc.what, err, prefix)
			}
		}
	}
}
