package redisstore_test

import (
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// The conformance suites (Store's and Granter's) with the caller's clock injected, on a standalone
// server and on a 3-master cluster, with concurrent calls batched into
// pipelines (the default; one pipeline in flight, so that the suite's
// concurrent steps do travel in batches) and with every call on its own.
func TestConformance(t *testing.T) {
	for _, c := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", func(t *testing.T) redis.UniversalClient { return redistest.Client(t) }},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.ClusterClient(t) }},
	} {
		for _, m := range []struct {
			name            string
			batch, inFlight int
		}{{"batched", 0, 1}, {"unbatched", 1, 0}} {
			t.Run(c.name+"/"+m.name, func(t *testing.T) {
				t.Parallel()
				client := c.client(t)
				newStore := func(t *testing.T, now func() time.Time) sluice.Store {
					return redisstore.New(client, &redisstore.Options{
						Prefix: redistest.Prefix(t), Clock: now, MaxBatch: m.batch, MaxInFlight: m.inFlight,
					})
				}
				storetest.Run(t, newStore)
				storetest.RunGrant(t, newStore)
			})
		}
	}
}
