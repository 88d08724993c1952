package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"sluice"
	"sluice/internal/redistest"
	"sluice/redisstore"
	"sluice/storetest"
)

// The conformance suite with the caller's clock injected, on a standalone
// server and on a 3-master cluster.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", func(t *testing.T) redis.UniversalClient { return redistest.Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.ClusterClient(t) }},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			client := c.client(t)
			storetest.Run(t, func(t *testing.T, now func() time.Time) sluice.Store {
				return redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: now})
			})
		})
	}
}
