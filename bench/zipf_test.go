package bench

import (
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestZipfKeySet checks that the skewed key set is what BENCHMARKS.md
// says: every key drawn, the hottest about 18 % of the calls, the coldest
// rarely, and each stream the same in every run.
func TestZipfKeySet(t *testing.T) {
	keys, err := Keys(ZipfKeys)
	if err != nil {
		t.Fatal(err)
	}
	set := NewZipfKeySet(keys, ZipfS, Goroutines)
	counts := make([]int, len(keys))
	total := 0
	for range Goroutines {
		w := set.Walk()
		for range zipfDraws {
			counts[keyIndex(t, w.Key())]++
			total++
		}
		w.Done()
	}
	if got, want := set.Distinct(), len(keys); got != want {
		t.Errorf("%d distinct keys drawn, want %d", got, want)
	}
	// P(k) = k^-s / H, k from 1, H the generalized harmonic number.
	h := 0.0
	for k := 1; k <= len(keys); k++ {
		h += math.Pow(float64(k), -ZipfS)
	}
	for _, k := range []int{0, 1, 9, 99} {
		want := math.Pow(float64(k+1), -ZipfS) / h
		if got := float64(counts[k]) / float64(total); math.Abs(got-want) > 0.1*want {
			t.Errorf("key %d drawn %.4f of the time, want %.4f", k, got, want)
		}
	}
	if share := float64(counts[0]) / float64(total); share < 0.17 || share > 0.19 {
		t.Errorf("hottest key drawn %.3f of the time, want about 0.18", share)
	}
	again := NewZipfKeySet(keys, ZipfS, Goroutines)
	if !slices.Equal(set.draws[3], again.draws[3]) {
		t.Error("the same seed drew different keys")
	}
}

func keyIndex(t *testing.T, key string) int {
	t.Helper()
	i, err := strconv.Atoi(strings.TrimPrefix(key, "user:"))
	if err != nil {
		t.Fatalf("key %q: %v", key, err)
	}
	return i
}
