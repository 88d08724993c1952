package server

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

// TestBudgetStoreBoundsLeaseCalls: a lease's grant, return and regrant
// through the service's Redis store end at its bound when Redis does not
// answer (a listener that reads and never replies), not at the client's
// read timeout.
func TestBudgetStoreBoundsLeaseCalls(t *testing.T) {
	l := redistest.Listen(t)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // held open, never answered
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	client := redis.NewClient(&redis.Options{Addr: l.Addr().String(), ReadTimeout: time.Minute, WriteTimeout: time.Minute, MaxRetries: -1})
	t.Cleanup(func() { client.Close() })
	s := budgetStore{redisstore.New(client, nil), 50 * time.Millisecond}
	ctx := context.Background()
	limit := sluice.PerSecond(10)
	g := sluice.Grant{Granted: 2, Limit: limit}
	for name, call := range map[string]func() error{
		"grant":   func() error { _, err := s.Grant(ctx, "k", limit, 1); return err },
		"return":  func() error { _, err := s.Return(ctx, "k", limit, g, 1); return err },
		"regrant": func() error { _, _, err := s.Regrant(ctx, "k", limit, g, 1, 1); return err },
	} {
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- call() }()
		select {
		case err := <-done:
			if err == nil {
				t.Errorf("%s: no error from a Redis that never answers", name)
			}
			if took := time.Since(start); took > 2*time.Second {
				t.Errorf("%s: ended after %v; want about the 50ms bound", name, took)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s: still waiting after 5s; want it ended at the 50ms bound", name)
		}
	}
}
