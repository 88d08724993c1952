package timercount

import (
	"context"
	"testing"
	"time"
)

func TestOf(t *testing.T) {
	var keep []*time.Timer
	n := Of(func() {
		for range 3 {
			keep = append(keep, time.AfterFunc(time.Hour, func() {}))
		}
		_, cancel := context.WithTimeout(context.Background(), time.Hour)
		cancel()
	})
	for _, tm := range keep {
		tm.Stop()
	}
	if n != 4 {
		t.Errorf("%d timers counted, want 4", n)
	}
	if n := Of(func() { _ = make([]byte, 100) }); n != 0 {
		t.Errorf("%d timers counted for none", n)
	}
}
