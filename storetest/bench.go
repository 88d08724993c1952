package storetest

import (
	"context"
	"testing"

	"github.com/sluicehq/sluice"
)

// BenchSerial calls take over keys in turn, one call per iteration, and
// reports the share of calls allowed ("allowed/op"), so that figures for
// mostly-denied and mostly-allowed runs are not mistaken for each other.
func BenchSerial(b *testing.B, ctx context.Context, keys []string, take func(ctx context.Context, key string) (sluice.Decision, error)) {
	b.ReportAllocs()
	allowed, n, i := 0, 0, 0
	for b.Loop() {
		d, err := take(ctx, keys[i])
		if err != nil {
			b.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
		n++
		if i++; i == len(keys) {
			i = 0
		}
	}
	b.ReportMetric(float64(allowed)/float64(n), "allowed/op")
}
