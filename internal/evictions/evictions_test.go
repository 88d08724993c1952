package evictions

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// An episode starts with the first growth, only once however long the
// growth goes on, and ends after Quiet without growth with its totals.
func TestEpisode(t *testing.T) {
	s := memory.New(&memory.Options{MaxKeys: 8, Shards: 1, SweepInterval: -1})
	defer s.Close()
	w := &Watch{Store: s, Quiet: time.Minute}
	at := time.Unix(0, 0)
	next := 0
	add := func(n int) {
		for range n {
			if _, err := s.Take(context.Background(), fmt.Sprint("k", next), sluice.PerMinute(5), 1); err != nil {
				t.Fatal(err)
			}
			next++
		}
	}
	add(8)
	if c := w.Read(at); c != (Change{}) {
		t.Fatalf("a full store that evicted nothing: %+v", c)
	}
	add(3)
	if c := w.Read(at.Add(time.Second)); !c.Started || c.Grown.Keys != 3 {
		t.Fatalf("3 evicted: %+v, want an episode started with 3", c)
	}
	add(2)
	if c := w.Read(at.Add(2 * time.Second)); c.Started || c.Grown.Keys != 2 {
		t.Fatalf("2 more: %+v, want growth in the same episode", c)
	}
	if _, since := w.State(); since != at.Add(time.Second) {
		t.Fatalf("episode since %v, want %v", since, at.Add(time.Second))
	}
	if c := w.Read(at.Add(time.Minute)); c.Ended {
		t.Fatalf("ended %v after the last growth, before Quiet: %+v", time.Minute-2*time.Second, c)
	}
	c := w.Read(at.Add(2*time.Second + time.Minute))
	if !c.Ended || c.Total.Keys != 5 || c.Lasted != time.Second {
		t.Fatalf("after Quiet: %+v, want ended with 5 evicted over 1s", c)
	}
	if _, since := w.State(); !since.IsZero() {
		t.Fatalf("episode still on after its end (since %v)", since)
	}
}
