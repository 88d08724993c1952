package redisstore

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/storetest"
)

// TestGrantSentOnce: a grant or return whose reply is lost after Redis ran
// it fails, and ran exactly once: resent, a grant would strand units and a
// return would make them. Alone and batched.
func TestGrantSentOnce(t *testing.T) {
	ctx := context.Background()
	direct := redistest.Client(t)
	proxy := startCutProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { c.Close() })
	clock := storetest.NewClock(storetest.T0)
	l := sluice.PerMinute(10)
	for _, mode := range []struct {
		name string
		opts Options
	}{
		{"alone", Options{MaxBatch: 1}},
		{"batched", Options{}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			o := mode.opts
			o.Prefix, o.Clock = redistest.Prefix(t), clock.Now
			s := New(c, &o)
			peek := New(direct, &Options{Prefix: o.Prefix, Clock: clock.Now})
			left := func() int64 {
				t.Helper()
				d, err := peek.Peek(ctx, "k", l, 1)
				if err != nil {
					t.Fatal(err)
				}
				return d.Remaining
			}
			if _, err := s.Take(ctx, "k", l, 6); err != nil { // warm: scripts loaded, a connection pooled
				t.Fatal(err)
			}
			g, err := s.Grant(ctx, "k", l, 2)
			if err != nil || g.Granted != 2 {
				t.Fatalf("grant = %+v, %v", g, err)
			}
			proxy.armed.Store(true)
			if g, err := s.Grant(ctx, "k", l, 1); err == nil {
				t.Fatalf("grant whose reply was lost: %+v, want an error", g)
			}
			if got := left(); got != 1 {
				t.Fatalf("after a lost grant of 1: %d left, want 1 (granted once)", got)
			}
			proxy.armed.Store(true)
			if n, err := s.Return(ctx, "k", l, g, 2); err == nil {
				t.Fatalf("return whose reply was lost: %d, want an error", n)
			}
			if got := left(); got != 3 {
				t.Fatalf("after a lost return of 2: %d left, want 3 (returned once)", got)
			}
		})
	}
}
