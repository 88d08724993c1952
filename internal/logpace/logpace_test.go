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
