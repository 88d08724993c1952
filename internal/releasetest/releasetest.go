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
	store := Unanswered(t)
	// Registered last, so run first: the releases end before the client
	// and the connections close.
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Until(until)+10*time.Second)
		defer cancel()
		sluice.WaitReleases(ctx)
	})
	for i := range sluice.MaxBackgroundReleases - sluice.PendingReleases() {
		if err := sluice.RetryRelease(store, "k", sluice.NewHolderID(), until, nil); err != nil {
			t.Fatalf("release %d: %v", i, err)
		}
	}
}

// Unanswered is a store on a server that accepts connections and never
// answers, through a client of one connection: the other calls wait for
// it, holding no socket. The client and the connections close at cleanup.
func Unanswered(t *testing.T) *redisstore.Store {
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
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	client := redis.NewClient(&redis.Options{Addr: ln.Addr().String(), MaxRetries: -1, PoolSize: 1, PoolTimeout: time.Minute})
	t.Cleanup(func() { client.Close() })
	return redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
}
