package logpace

import (
	"sync"
	"testing"
	"time"
)

type line struct {
	kind, event string
	notLogged   int64
	at          time.Time
}

// Each kind's first event is written at once; the rest of its period's are
// written as one line when the period ends, which accounts for every
// event; another kind is paced on its own.
func TestPacer(t *testing.T) {
	t.Parallel()
	p := &Pacer{Every: 200 * time.Millisecond}
	var (
		mu    sync.Mutex
		lines []line
	)
	log := func(kind, event string) {
		p.Log(kind, func(n int64) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, line{kind, event, n, time.Now()})
		})
	}
	start := time.Now()
	for i := range 20 {
		log("a", string(rune('A'+i)))
	}
	log("b", "only")
	mu.Lock()
	if len(lines) != 2 || lines[0].event != "A" || lines[1].kind != "b" {
		t.Fatalf("lines at once %+v, want a's first and b's", lines)
	}
	mu.Unlock()
	// Wait for the held-back line (a loaded machine may fire the timer
	// late), then log at once, well within the period it starts.
	var n int
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		mu.Lock()
		n = len(lines)
		mu.Unlock()
		if n >= 3 {
			break
		}
	}
	log("a", "late")
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 3 {
		t.Fatalf("lines %+v, want 3: a's first, b's, and a's held back (\"late\" waits out the period)", lines)
	}
	l := lines[2]
	if l.kind != "a" || l.event != "T" || l.notLogged != 18 {
		t.Errorf("held-back line %+v, want a's latest event (T) and 18 others", l)
	}
	if d := l.at.Sub(start); d < 200*time.Millisecond {
		t.Errorf("held-back line written %v after the first, want when the period ends (200ms)", d)
	}
}

// With Gather, a period's first event is held back too: a burst is one
// line, written when Gather ends, that counts all of it; Flush writes a
// held-back line at once.
func TestPacerGatherAndFlush(t *testing.T) {
	t.Parallel()
	p := &Pacer{Every: time.Hour, Gather: 50 * time.Millisecond}
	var (
		mu    sync.Mutex
		lines []int64
	)
	log := func() {
		p.Log("k", func(n int64) {
			mu.Lock()
			defer mu.Unlock()
			lines = append(lines, n)
		})
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(lines)
	}
	for range 10 {
		log()
	}
	if n := count(); n != 0 {
		t.Fatalf("%d lines at once, want none before Gather ends", n)
	}
	for deadline := time.Now().Add(5 * time.Second); count() == 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
	log() // within the period: held back until it ends, or a Flush
	log()
	p.Flush()
	mu.Lock()
	defer mu.Unlock()
	if len(lines) != 2 || lines[0] != 9 || lines[1] != 1 {
		t.Errorf("lines %v, want [9 1]: the burst's 10 in one line, then the 2 held back, flushed", lines)
	}
}
