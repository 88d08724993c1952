package redisstore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/ctxutil"
)

// Warm readies the Store to serve before its first calls: on the server
// (every master of a Cluster's slot map) it dials the connections the first
// calls take, loads every script the Store runs, and measures the round
// trip, outside any caller's deadline. A Store works without it, but
// against a distant Redis its first calls pay what Warm does: a new
// connection's handshake (about four round trips) and each script's first
// NOSCRIPT and EVAL, over a 50 ms decision timeout with Redis 25 ms away or
// more, and a circuit breaker counts them. Call it once after New, before
// serving; it returns ctx's error if ctx ends first, and the first error
// of a server otherwise (the Store still works: calls dial and load as
// they go).
func (s *Store) Warm(ctx context.Context) error {
	ctx = ctxutil.OrBackground(ctx)
	if s == nil || s.client == nil {
		return s.unbuilt()
	}
	if err := s.reload.awaitMap(ctx); err != nil {
		return fmt.Errorf("redisstore: warm: %w", closedErr(err))
	}
	type node struct {
		client redis.Cmdable
		lanes  []*lane
	}
	var nodes []node
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		masters, err := Masters(ctx, cc)
		if err != nil {
			return fmt.Errorf("redisstore: warm: %w", closedErr(err))
		}
		for _, m := range masters {
			n := node{client: m}
			if s.batch != nil {
				n.lanes = append(n.lanes, s.batch.addLane(m))
			}
			nodes = append(nodes, n)
		}
	} else {
		// Only the lane the calls will use: with batching the solo lane
		// sends nothing, and a round trip seeded there stayed for good.
		n := node{client: s.client, lanes: []*lane{&s.solo}}
		if s.batch != nil {
			n.lanes = []*lane{&s.batch.lane}
		}
		nodes = append(nodes, n)
	}
	conns, most := 2, max(poolSize(s.client), 2)
	if s.batch != nil {
		conns, most = s.batch.inFlight+1, s.batch.most()
	}
	err := boundedErr(ctx, func() error {
		errs := make([]error, len(nodes))
		var wg sync.WaitGroup
		for i, n := range nodes {
			wg.Go(func() { errs[i] = warmNode(ctx, n.client, n.lanes, conns, most) })
		}
		wg.Wait()
		return errors.Join(errs...)
	})
	if err != nil {
		return fmt.Errorf("redisstore: warm: %w", closedErr(err))
	}
	return nil
}

// warmNode dials conns connections to a server at once (each a PING),
// loads every script there in one round trip, and adds one PING on a
// ready connection to lanes' round trips: their first calls then know
// whether to wait for a batch. A server warmDistant away or more gets up
// to warmMost connections (most at most): its calls will not wait for
// batches (see hurried), each takes a connection, and each new one's
// handshake would cost its call's deadline.
func warmNode(ctx context.Context, c redis.Cmdable, lanes []*lane, conns, most int) error {
	dial := func(n int) error {
		errs := make([]error, n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() { errs[i] = c.Ping(ctx).Err() })
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	if err := dial(conns); err != nil {
		return err
	}
	start := time.Now()
	err := c.Ping(ctx).Err()
	rtt := time.Since(start)
	for _, l := range lanes {
		l.observe(rtt, err)
	}
	if err != nil {
		return err
	}
	if n := min(most, warmMost); rtt >= warmDistant && n > conns {
		if err := dial(n); err != nil {
			return err
		}
	}
	pipe := c.Pipeline()
	for _, sc := range allScripts() {
		pipe.ScriptLoad(ctx, sc.src)
	}
	_, err = pipe.Exec(ctx)
	return err
}

// See warmNode.
const (
	warmDistant = 5 * time.Millisecond
	warmMost    = 16
)

// allScripts lists every script the Store runs.
func allScripts() []*script {
	list := []*script{takeAllScript, takeEachScript, resetScript, acquireScript, extendScript, releaseScript,
		releaseOnceScript, fleetScript, rosterScript, leaveScript}
	for a := range algorithms {
		list = append(list, algorithms[a].script)
		if grantScripts[a] != nil {
			list = append(list, grantScripts[a])
		}
	}
	return list
}
