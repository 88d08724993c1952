package table

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"unsafe"
)

// TestTableMatchesMap replays a seeded random mix of adds, finds and
// removes on a table and on a Go map, with tags drawn from a small set so
// that probes collide and tombstones pile up, and checks they always agree.
func TestTableMatchesMap(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	var tab Table[int64]
	model := map[string]int64{}
	tagFor := func(key string) uint32 { return uint32(len(key)*31+int(key[len(key)-1])) % 64 } // few tags: long probes
	for step := range 50_000 {
		key := fmt.Sprintf("k%d", r.IntN(3000))
		tag := tagFor(key)
		switch v := tab.Find(tag, key); {
		case r.IntN(3) == 0:
			_, had := model[key]
			if got := tab.Remove(tag, key); got != had {
				t.Fatalf("step %d: Remove(%q) = %v, want %v", step, key, got, had)
			}
			delete(model, key)
		case v == nil:
			if _, ok := model[key]; ok {
				t.Fatalf("step %d: %q lost", step, key)
			}
			tab.Add(tag, key, int64(step))
			model[key] = int64(step)
		default:
			if want, ok := model[key]; !ok || *v != want {
				t.Fatalf("step %d: %q holds %d, want %d (present %v)", step, key, *v, want, ok)
			}
		}
		if step%5000 == 0 {
			checkWalk(t, &tab, model)
		}
	}
	checkWalk(t, &tab, model)
}

// checkWalk checks that a walk over tab's slots meets every key of model
// once, with its value, and that Len agrees.
func checkWalk(t *testing.T, tab *Table[int64], model map[string]int64) {
	t.Helper()
	seen := map[string]bool{}
	for i := range tab.Slots() {
		if !tab.Live(i) {
			continue
		}
		k := tab.Key(i)
		if want, ok := model[k]; !ok || *tab.At(i) != want || seen[k] {
			t.Fatalf("slot %d: %q holds %d, want %d (present %v, seen %v)", i, k, *tab.At(i), want, ok, seen[k])
		}
		seen[k] = true
	}
	if len(seen) != len(model) || tab.Len() != len(model) {
		t.Fatalf("walk met %d keys, Len %d, want %d", len(seen), tab.Len(), len(model))
	}
}

// TestBuryWhileWalking buries every other key during a walk over the
// slots, as the stores' sweeps do, and checks the rest are all still found.
func TestBuryWhileWalking(t *testing.T) {
	t.Parallel()
	var tab Table[int]
	for i := range 1000 {
		tab.Add(uint32(i%7), fmt.Sprint(i), i) // few tags: long probes through buried slots
	}
	for i := range tab.Slots() {
		if tab.Live(i) && *tab.At(i)%2 == 0 {
			tab.Bury(i)
		}
	}
	for i := range 1000 {
		v := tab.Find(uint32(i%7), fmt.Sprint(i))
		if (v != nil) != (i%2 == 1) || (v != nil && *v != i) {
			t.Fatalf("key %d after the walk: %v", i, v)
		}
	}
	if tab.Len() != 500 {
		t.Fatalf("Len %d, want 500", tab.Len())
	}
}

// TestSample returns live slots only, at most SampleSize of them.
func TestSample(t *testing.T) {
	t.Parallel()
	var tab Table[int]
	if _, n := tab.Sample(); n != 0 {
		t.Fatalf("empty table sampled %d", n)
	}
	for i := range 3 {
		tab.Add(uint32(i), fmt.Sprint(i), i)
	}
	idx, n := tab.Sample()
	if n != 3 {
		t.Fatalf("sampled %d of 3", n)
	}
	for _, i := range idx[:n] {
		if !tab.Live(i) {
			t.Fatalf("sampled slot %d is not live", i)
		}
	}
}

// TestSampleSpread: a sample's slots are spread over the table, not a run
// of neighbours (under linear probing, a key's neighbours are often the
// keys added last, which an eviction by age then never picks over it). Of
// 1,000 samples over 10,000 keys (16,384 slots), about 1 % hold a pair of
// slots within 8 of each other; every sample of adjacent slots did.
func TestSampleSpread(t *testing.T) {
	t.Parallel()
	var tab Table[int]
	for i := range 10_000 {
		tab.Add(uint32(i)*2654435761, fmt.Sprint(i), i)
	}
	near := 0
	for range 1000 {
		idx, n := tab.Sample()
		if n != SampleSize {
			t.Fatalf("sampled %d of 10,000", n)
		}
		close := false
		for a := range n {
			for b := range a {
				d := idx[a] - idx[b]
				if d < 0 {
					d = -d
				}
				close = close || d <= 8 || tab.Slots()-d <= 8
				if d == 0 {
					t.Fatalf("slot %d sampled twice", idx[a])
				}
			}
		}
		if close {
			near++
		}
	}
	if near > 100 {
		t.Errorf("%d of 1,000 samples hold slots within 8 of each other, want them spread", near)
	}
}

// TestPrefetchWhileGrowing calls Prefetch without the lock while another
// goroutine grows the table under it, as the stores do: the race detector
// finds no race and nothing faults.
func TestPrefetchWhileGrowing(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		tab Table[int]
	)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 20_000 {
			mu.Lock()
			tab.Add(uint32(i*2654435761), fmt.Sprint(i), i)
			mu.Unlock()
		}
	}()
	for i := uint32(0); ; i++ {
		select {
		case <-done:
			return
		default:
			tab.Prefetch(i * 40503)
		}
	}
}

// TestFitShrinksAfterBurying: burying most keys, as a sweep does, and then
// Fit gives the slots back; the keys left are all still found.
func TestFitShrinksAfterBurying(t *testing.T) {
	t.Parallel()
	var tab Table[int]
	for i := range 100_000 {
		tab.Add(uint32(i*2654435761), fmt.Sprint(i), i)
	}
	grown := tab.Slots()
	for i := range tab.Slots() {
		if tab.Live(i) && *tab.At(i)%100 != 0 {
			tab.Bury(i)
		}
	}
	tab.Fit()
	if tab.Slots() > grown/16 {
		t.Fatalf("%d slots for %d keys after Fit (%d before)", tab.Slots(), tab.Len(), grown)
	}
	for i := 0; i < 100_000; i += 100 {
		if v := tab.Find(uint32(i*2654435761), fmt.Sprint(i)); v == nil || *v != i {
			t.Fatalf("key %d lost by Fit", i)
		}
	}
	n := tab.Slots()
	tab.Fit() // a fitted table stays as it is
	if tab.Slots() != n {
		t.Fatalf("a second Fit went from %d to %d slots", n, tab.Slots())
	}
}

// TestCursor walks a table a chunk at a time while keys come and go
// between chunks, growing and shrinking it: every key present throughout
// is visited, whatever the rehashes moved, and no chunk is longer than
// asked.
func TestCursor(t *testing.T) {
	t.Parallel()
	var tab Table[int]
	for i := range 1000 {
		tab.Add(uint32(i)*2654435761, fmt.Sprint(i), i)
	}
	var c Cursor
	seen := map[int]bool{}
	added, restarts := 1000, 0
	for chunk := 0; ; chunk++ {
		from, to, restarted, ok := tab.Chunk(&c, 7)
		if restarted {
			restarts++
		}
		if !ok {
			break
		}
		if to-from > 7 || to > tab.Slots() {
			t.Fatalf("chunk [%d, %d) of %d slots", from, to, tab.Slots())
		}
		for i := from; i < to; i++ {
			if tab.Live(i) {
				seen[*tab.At(i)] = true
			}
		}
		switch chunk {
		case 10: // grow it: the keys move
			for range 8000 {
				tab.Add(uint32(added)*2654435761, fmt.Sprint(added), added)
				added++
			}
		case 20: // shrink it
			for i := 1000; i < added; i++ {
				tab.Remove(uint32(i)*2654435761, fmt.Sprint(i))
			}
			tab.Fit()
		}
	}
	if restarts != 2 {
		t.Errorf("%d restarts, want 2", restarts)
	}
	for i := range 1000 {
		if !seen[i] {
			t.Fatalf("key %d, present throughout, not visited", i)
		}
	}
}

// A slot is 16 bytes and its value: a 16-byte value (the memory store's
// GCRA state) makes half a cache line, a 48-byte one a whole line.
func TestSlotSize(t *testing.T) {
	if n := unsafe.Sizeof(slot[[2]int64]{}); n != 32 {
		t.Errorf("a slot of a 16-byte value is %d bytes, want 32", n)
	}
	if n := unsafe.Sizeof(slot[[6]int64]{}); n != 64 {
		t.Errorf("a slot of a 48-byte value is %d bytes, want 64", n)
	}
}

// Keys are told apart by their bytes and length, not by where the bytes
// lie: substrings of one buffer, the same bytes at two addresses, and a
// key of MaxKeyLen bytes; a longer key is a caller's bug and panics.
func TestKeysByBytes(t *testing.T) {
	var tab Table[int64]
	buf := strings.Repeat("ab", MaxKeyLen)
	keys := []string{buf[0:3], buf[1:4], buf[0:4], buf[:MaxKeyLen]}
	for i, k := range keys {
		tab.Add(7, k, int64(i)) // one tag: every key probes past the others
	}
	for i, k := range keys {
		copied := string([]byte(k)) // the same bytes elsewhere
		if v := tab.Find(7, copied); v == nil || *v != int64(i) {
			t.Fatalf("key %d (%d bytes) not found by its bytes", i, len(k))
		}
	}
	if v := tab.Find(7, "aba"+"b"); v == nil || *v != 2 {
		t.Error(`"abab" not found`)
	}
	if tab.Find(7, "bab") == nil || tab.Find(7, "ba") != nil {
		t.Error("a key found by a prefix of it, or lost")
	}
	defer func() {
		if recover() == nil {
			t.Error("a key longer than MaxKeyLen was added")
		}
	}()
	tab.Add(7, buf[:MaxKeyLen+1], 9)
}

// A key longer than MaxKeyLen is never found, and Find, FindKind and
// Remove read no key's bytes past its end for it. Its length overflows
// the meta word's 10 bits into the tag: looked up under tag 2, a key of
// 1029 bytes had the meta of a 5-byte key under tag 3, and was found as
// that key when the bytes after it matched (here, where the 5 bytes lie
// in a longer string; elsewhere, bytes past the key's end). The lease
// store's local path looks keys up before it validates them.
func TestLongKeyNotFound(t *testing.T) {
	var tab Table[int64]
	long := "abcde" + strings.Repeat("x", MaxKeyLen+1)
	if len(long) != 1029 || metaOf(2, 1, long) != metaOf(3, 1, long[:5]) {
		t.Fatal("the metas do not alias: the test would prove nothing")
	}
	tab.Add(2, "z", 1)        // in tag 2's first slot: the probe goes on to 3's
	tab.Add(3, long[:5], 2)   // its bytes followed by long's
	tab.AddKind(3, 9, "q", 3) // another kind, unrelated
	if v := tab.Find(2, long); v != nil {
		t.Errorf("a key of %d bytes found as %q's (value %d)", len(long), long[:5], *v)
	}
	if tab.Remove(2, long) {
		t.Errorf("a key of %d bytes removed %q", len(long), long[:5])
	}
	if v := tab.Find(3, long[:5]); v == nil || *v != 2 {
		t.Errorf("%q lost", long[:5])
	}
}
