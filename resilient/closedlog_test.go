package resilient

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/logpace"
)

// decisionSum is a slog.Handler that adds up the decisions attribute of
// the lines it gets.
type decisionSum struct{ lines, n atomic.Int64 }

func (d *decisionSum) Enabled(context.Context, slog.Level) bool { return true }
func (d *decisionSum) WithAttrs([]slog.Attr) slog.Handler       { return d }
func (d *decisionSum) WithGroup(string) slog.Handler            { return d }
func (d *decisionSum) Handle(_ context.Context, r slog.Record) error {
	d.lines.Add(1)
	r.Attrs(func(a slog.Attr) bool {
		if a.Key == "decisions" {
			d.n.Add(a.Value.Int64())
		}
		return true
	})
	return nil
}

// Answers noted from many goroutines are each counted in one line, the
// lines written as they fall due and by flush.
func TestClosedAnswersCountsEveryAnswer(t *testing.T) {
	t.Parallel()
	sum := &decisionSum{}
	c := &closedAnswers{log: slog.New(sum), store: "s", pace: logpace.Pacer{Gather: 5 * time.Millisecond}}
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range 200 {
				c.note(nil)
				if i%50 == 0 {
					time.Sleep(time.Millisecond) // let lines fall due meanwhile
				}
			}
		})
	}
	wg.Wait()
	c.flush()
	if got := sum.n.Load(); got != 1600 {
		t.Errorf("%d lines count %d answers, want 1600", sum.lines.Load(), got)
	}
}
