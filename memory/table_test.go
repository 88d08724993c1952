package memory

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestTableMatchesMap replays a seeded random mix of adds, finds and
// removes on a table and on a Go map, with tags drawn from a small set so
// that probes collide and tombstones pile up, and checks they always agree.
func TestTableMatchesMap(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	var tab table
	model := map[string]int64{}
	tagFor := func(key string) uint32 { return uint32(len(key)*31+int(key[len(key)-1])) % 64 } // few tags: long probes
	for step := range 50_000 {
		key := fmt.Sprintf("k%d", r.IntN(3000))
		tag := tagFor(key)
		switch st := tab.find(tag, key); {
		case r.IntN(3) == 0:
			_, had := model[key]
			if got := tab.remove(tag, key); got != had {
				t.Fatalf("step %d: remove(%q) = %v, want %v", step, key, got, had)
			}
			delete(model, key)
		case st == nil:
			if _, ok := model[key]; ok {
				t.Fatalf("step %d: %q lost", step, key)
			}
			tab.add(tag, key, state{a: int64(step)})
			model[key] = int64(step)
		default:
			if want, ok := model[key]; !ok || st.a != want {
				t.Fatalf("step %d: %q holds %d, want %d (present %v)", step, key, st.a, want, ok)
			}
		}
	}
	n := 0
	for i, slot := range tab.index {
		if live(slot) {
			n++
			e := tab.ents[uint32(slot)-1]
			if want, ok := model[e.key]; !ok || tab.state(i).a != want {
				t.Fatalf("slot %d: %q holds %d, want %d (present %v)", i, e.key, tab.state(i).a, want, ok)
			}
		}
	}
	if got, want := n, len(model); got != want {
		t.Fatalf("%d live keys, want %d", got, want)
	}
	if got, want := len(tab.ents)-len(tab.free), len(model); got != want {
		t.Fatalf("%d entries held, want %d", got, want)
	}
}
