package resilient

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// BenchmarkTakeRedis measures what the wrapper adds to a Redis Take (the
// bounded call, the breaker and a deny-cache lookup) on allowed requests
// over 1,000 keys, with the call in its own goroutine (the default) and in
// the caller's (TrustContext).
//
//	go test -run '^$' -bench TakeRedis -benchmem ./resilient/
func BenchmarkTakeRedis(b *testing.B) {
	client := redistest.Client(b)
	backend := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(b)})
	wrapped, err := New(backend, &Options{Timeout: time.Second})
	if err != nil {
		b.Fatal(err)
	}
	defer wrapped.Close()
	inline, err := New(backend, &Options{Timeout: time.Second, TrustContext: true})
	if err != nil {
		b.Fatal(err)
	}
	defer inline.Close()
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d", i)
	}
	lim := sluice.PerSecond(1_000_000)
	for _, s := range []struct {
		name  string
		store sluice.Store
	}{{"bare", backend}, {"resilient", wrapped}, {"resilient-trust-context", inline}} {
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				i := 0
				for pb.Next() {
					d, err := s.store.Take(context.Background(), keys[i%len(keys)], lim, 1)
					if err != nil || !d.Allowed {
						b.Errorf("Take: %+v, %v", d, err)
						return
					}
					i++
				}
			})
		})
	}
}
