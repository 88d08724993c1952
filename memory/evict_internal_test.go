package memory

import (
	"hash/maphash"
	"testing"
	"time"
	"unsafe"

	"github.com/sluicehq/sluice"
)

// A state stays 48 bytes, so that a table slot is one cache line (see
// internal/table), and a GCRA key's 16, so that its slot is half a line.
func TestStateSize(t *testing.T) {
	if n := unsafe.Sizeof(state{}); n != 48 {
		t.Errorf("state is %d bytes, want 48", n)
	}
	if n := unsafe.Sizeof(gcraState{}); n != 16 {
		t.Errorf("gcraState is %d bytes, want 16", n)
	}
}

// fillOf orders keys by the share of their limit taken, whatever the limit,
// with a key that has taken all of it above every other.
func TestFillOf(t *testing.T) {
	fill := func(l sluice.Limit, taken int64) uint32 {
		p := newParams(l)
		return fillOf(&result{remaining: p.capacity - taken}, &p)
	}
	five, big := sluice.PerMinute(5), sluice.PerMinute(sluice.MaxRate)
	if got := fill(five, 0); got != 0 {
		t.Errorf("nothing taken: fill %d, want 0", got)
	}
	if got, want := fill(five, 1), uint32(1<<30/5); got != want {
		t.Errorf("1 of 5: fill %d, want %d", got, want)
	}
	if fill(five, 4) >= fillFull || fill(big, sluice.MaxRate-1) >= fillFull {
		t.Error("a key with a unit left counts as full")
	}
	if fill(five, 5) < fillFull || fill(big, sluice.MaxRate) < fillFull || fill(five, 7) != fill(five, 5) {
		t.Error("a key with its limit taken is not full")
	}
	if one := (sluice.Limit{Rate: 1, Period: 24 * time.Hour}); !(fill(one, 1) < fill(five, 5) && fill(five, 5) < fill(big, sluice.MaxRate)) {
		t.Error("full keys do not follow their capacity: the smallest must go first")
	}
	if !(fill(big, 1) < fill(five, 1) && fill(five, 1) < fill(five, 2) && fill(five, 2) < fill(big, sluice.MaxRate/2)) {
		t.Error("fills do not follow the share taken")
	}
}

// evict, on a shard of exactly SampleSize keys (so the sample is all of
// them), removes the expired key first, then the least filled, then the
// soonest to expire, and never one of keep's keys.
func TestEvictOrder(t *testing.T) {
	const now = int64(1_000_000)
	type key struct {
		name    string
		fill    uint32
		expires int64
	}
	for _, c := range []struct {
		name string
		keys []key
		keep string
		want string
	}{
		{"expired first", []key{{"a", 0, now + 5}, {"b", fillFull, now}, {"c", 1, now + 1}, {"d", 2, now + 2}, {"e", 3, now + 3}}, "", "b"},
		{"least filled", []key{{"a", fillFull, now + 1}, {"b", 9, now + 2}, {"c", 3, now + 9}, {"d", fillFull, now + 3}, {"e", 7, now + 4}}, "", "c"},
		{"soonest among equals", []key{{"a", 3, now + 9}, {"b", 3, now + 4}, {"c", 3, now + 7}, {"d", fillFull, now + 1}, {"e", 5, now + 2}}, "", "b"},
		{"all full: soonest", []key{{"a", fillFull, now + 9}, {"b", fillFull, now + 4}, {"c", fillFull, now + 2}, {"d", fillFull, now + 7}, {"e", fillFull, now + 5}}, "", "c"},
		{"all full: smallest capacity", []key{{"a", fillFull | 5, now + 1}, {"b", fillFull | 1, now + 9}, {"c", fillFull | 5, now + 2}, {"d", fillFull | 1, now + 8}, {"e", fillFull | 5, now + 3}}, "", "d"},
		{"keep", []key{{"a", 1, now + 1}, {"b", 2, now + 2}, {"c", 3, now + 3}, {"d", 4, now + 4}, {"e", 5, now + 5}}, "a", "b"},
	} {
		t.Run(c.name, func(t *testing.T) {
			seed := maphash.MakeSeed()
			sh := &shard{maxKeys: len(c.keys)}
			for _, k := range c.keys {
				sh.insert(tagOf(maphash.String(seed, k.name), sluice.TokenBucket), k.name, sluice.TokenBucket, &state{fill: k.fill, expires: k.expires}, now)
			}
			var keep []sluice.Request
			if c.keep != "" {
				keep = []sluice.Request{{Key: c.keep, Limit: sluice.PerSecond(1), Cost: 1}}
			}
			sh.evict(now, keep)
			if sh.n != len(c.keys)-1 {
				t.Fatalf("%d keys left, want %d", sh.n, len(c.keys)-1)
			}
			for _, k := range c.keys {
				tag := tagOf(maphash.String(seed, k.name), sluice.TokenBucket)
				if gone := sh.tab.Find(tag, k.name) == nil; gone != (k.name == c.want) {
					t.Errorf("%s gone=%v; want %s evicted", k.name, gone, c.want)
				}
			}
		})
	}
}

// Eviction samples GCRA's keys and every other algorithm's alike, though
// they live in tables of their own: in proportion to the keys each holds.
func TestEvictSamplesBothTables(t *testing.T) {
	const now = int64(1_000_000)
	seed := maphash.MakeSeed()
	gone := map[bool]int{}
	for range 400 {
		sh := &shard{maxKeys: 40}
		for i := range 40 {
			a := sluice.TokenBucket
			if i%4 == 0 { // a quarter of the keys are GCRA's
				a = sluice.GCRA
			}
			key := string(rune('a'+i%26)) + string(rune('0'+i/26))
			sh.insert(tagOf(maphash.String(seed, key), a), key, a, &state{a: now + 1, expires: now + 1, fill: 7}, now)
		}
		g := sh.gcra.Len()
		sh.evict(now, nil)
		gone[sh.gcra.Len() < g]++
	}
	if gone[true] < 60 || gone[true] > 140 {
		t.Errorf("a GCRA key evicted %d times in 400, want about 100 (a quarter)", gone[true])
	}
}
