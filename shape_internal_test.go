package sluice

import (
	"testing"

	"github.com/sluicehq/sluice/internal/line"
)

// The waiting line knows the algorithms by their config names: a renamed
// one would be estimated as a bucket.
func TestShapeKinds(t *testing.T) {
	want := map[Algorithm]line.Kind{
		GCRA: line.Bucket, TokenBucket: line.Bucket, LeakyBucket: line.Bucket,
		FixedWindow: line.Fixed, SlidingWindowLog: line.Sliding, SlidingWindowCounter: line.Counter,
	}
	for _, a := range Algorithms() {
		k, ok := want[a]
		if !ok {
			t.Fatalf("%v: no expected kind", a)
		}
		l := PerSecond(10).WithAlgorithm(a)
		if s := l.shape(); s.Kind != k || s.Capacity != l.Capacity() || s.Interval != l.Interval() || s.Period != l.Period {
			t.Errorf("%v: shape %+v, want kind %v", a, s, k)
		}
	}
}
