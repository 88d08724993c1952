package redisstore_test

import (
	"context"
	"errors"
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
