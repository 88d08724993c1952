package server

import (
	"context"
	"time"
)

// After a Sentinel switch, pings for about 2 s, then the breaker's own
// probes.
const (
	sentinelPingTries   = 40
	sentinelPingGap     = 50 * time.Millisecond
	sentinelPingTimeout = 250 * time.Millisecond
)

// probeAfterSwitch is the service's redisstore.FollowOptions.OnSwitch
// past the count: it calls probe once ping (the service's client) reaches
// the new master, so that the breaker probes at once instead of after its
// probe interval, as on a Cluster (redisstore.Store.OnFailover). Until
// the client has a connection to the new master, a probe could fail and
// reopen the breaker (go-redis's pool, having failed to dial, dials again
// only once a second). A ping, which the breaker does not see, waits for
// that connection. It returns when ctx (the follower's) ends.
func probeAfterSwitch(ctx context.Context, ping, probe func(context.Context) error) {
	for range sentinelPingTries {
		pctx, cancel := context.WithTimeout(ctx, sentinelPingTimeout)
		err := ping(pctx)
		cancel()
		if err == nil {
			probe(ctx)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(sentinelPingGap):
		}
	}
}
