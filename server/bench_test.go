package server

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluicehq/sluice/memory"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkShouldRateLimit measures the service's own cost per Envoy
// decision (lookup, keys, statistics, headers) over the memory store, with
// no network: what sluice adds on top of its store.
func BenchmarkShouldRateLimit(b *testing.B) {
	store := memory.New(nil)
	defer store.Close()
	svc := NewService(store, mustConfig(b, "domain: bench\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 1000000}\n"), &ServiceOptions{Metrics: NewMetrics()})
	reqs := make([]*rlsv3.RateLimitRequest, 10_000)
	for i := range reqs {
		reqs[i] = rlsRequest("bench", desc("user=u"+strconv.Itoa(i)))
	}
	ctx := context.Background()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if _, err := (rlsServer{svc: svc}).ShouldRateLimit(ctx, reqs[i%len(reqs)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
	})
}
