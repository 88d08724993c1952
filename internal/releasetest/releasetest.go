// Package releasetest helps tests of in-flight releases sent again in the
// background (sluice.RetryRelease).
package releasetest

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// Fill fills the bound of sluice.MaxBackgroundReleases releases at work in
// the background, against a server that never answers, until until; they
// are waited for at cleanup.
func Fill(t *testing.T, until time.Time) {
	t.Helper()
	ln := redistest.Listen(t)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	// One connection: the other tries wait for it, holding no socket.
	client := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, PoolSize: 1, PoolTimeout: time.Minute})
	store := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Until(until)+10*time.Second)
		defer cancel()
		sluice.WaitReleases(ctx)
		client.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range sluice.MaxBackgroundReleases - sluice.PendingReleases() {
		if err := sluice.RetryRelease(store, "k", sluice.NewHolderID(), until, nil); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
}
