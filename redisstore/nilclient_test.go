package redisstore_test

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

// TestTypedNilClient: a nil *redis.Client or *redis.ClusterClient in a
// non-nil interface (a client variable never assigned) is no client:
// CheckBuilt refuses it and every call fails with ErrNoClient, where the
// first command panicked (and a Cluster's background reload ended the
// process).
func TestTypedNilClient(t *testing.T) {
	ctx := context.Background()
	l := sluice.PerSecond(10)
	for _, c := range []redis.UniversalClient{(*redis.Client)(nil), (*redis.ClusterClient)(nil)} {
		s := redisstore.New(c, nil)
		if err := s.CheckBuilt(); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%T: CheckBuilt: %v, want ErrNoClient", c, err)
		}
		if _, err := s.Take(ctx, "k", l, 1); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%T: Take: %v, want ErrNoClient", c, err)
		}
		if _, err := s.Acquire(ctx, "k", sluice.Concurrent(1, time.Second), 1, "h"); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%T: Acquire: %v, want ErrNoClient", c, err)
		}
		if err := s.Warm(ctx); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%T: Warm: %v, want ErrNoClient", c, err)
		}
		if _, err := redisstore.Check(ctx, c); !errors.Is(err, redisstore.ErrNoClient) {
			t.Errorf("%T: Check: %v, want ErrNoClient", c, err)
		}
		redisstore.DetectRefusals(c)
	}
	if _, err := redisstore.Masters(ctx, nil); !errors.Is(err, redisstore.ErrNoClient) {
		t.Errorf("Masters(nil): %v, want ErrNoClient", err)
	}
}

// TestMastersNilContext: Masters takes a nil context as Background (here
// refused: the server is no Cluster).
func TestMastersNilContext(t *testing.T) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{redistest.Addr(t)}})
	defer cc.Close()
	//lint:ignore SA1012 a nil context is what is tested
	if _, err := redisstore.Masters(nil, cc); !errors.Is(err, redisstore.ErrTopology) {
		t.Errorf("Masters(nil, standalone): %v, want ErrTopology", err)
	}
}

// TestNilMembership: a nil *Membership refuses as one without a client.
func TestNilMembership(t *testing.T) {
	var m *redisstore.Membership
	ctx := context.Background()
	if _, err := m.Heartbeat(ctx, "a", time.Second); !errors.Is(err, redisstore.ErrNoClient) {
		t.Errorf("Heartbeat: %v, want ErrNoClient", err)
	}
	if _, _, err := m.Roster(ctx, "a", time.Second); !errors.Is(err, redisstore.ErrNoClient) {
		t.Errorf("Roster: %v, want ErrNoClient", err)
	}
	if err := m.Leave(ctx, "a", time.Second); !errors.Is(err, redisstore.ErrNoClient) {
		t.Errorf("Leave: %v, want ErrNoClient", err)
	}
	if k := m.Key(); k != "" {
		t.Errorf("Key: %q", k)
	}
}

// TestNilErrorTypes: a typed nil *CheckError or *PartialError (an
// errors.As target never matched, returned as an error) goes through
// errors.Is, Classify and Error without a panic.
func TestNilErrorTypes(t *testing.T) {
	for _, err := range []error{(*redisstore.CheckError)(nil), (*redisstore.PartialError)(nil), &redisstore.CheckError{}} {
		_ = err.Error()
		_ = errors.Is(err, redisstore.ErrUnreachable)
		_ = redisstore.Classify(err)
		_ = redisstore.Stalled(err)
	}
	if a := (*redisstore.PartialError)(nil).Addrs(); a != nil {
		t.Errorf("Addrs: %v", a)
	}
}
