package tick

import (
	"testing"
	"time"
)

// Every calls f until stop closes, and returns then.
func TestEvery(t *testing.T) {
	t.Parallel()
	stop := make(chan struct{})
	calls := make(chan struct{}, 3)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(stop, time.Millisecond, func() {
			select {
			case calls <- struct{}{}:
			default:
			}
		})
	}()
	for range 3 {
		<-calls
	}
	close(stop)
	<-done
}

// A stop that comes while f runs longer than interval ends the loop when f
// returns: the tick then ready beside it does not call f again. Before,
// select chose between the two with even odds, and a stop waited a
// geometric number of calls more (a Redis not answering made each as long
// as the interval).
func TestEveryStopBeatsTickReadyWithIt(t *testing.T) {
	t.Parallel()
	for i := range 40 {
		stop := make(chan struct{})
		calls := 0
		done := make(chan struct{})
		go func() {
			defer close(done)
			Every(stop, time.Millisecond, func() {
				calls++
				if calls == 1 {
					close(stop)
					time.Sleep(3 * time.Millisecond) // a tick is ready by now
				}
			})
		}()
		<-done
		if calls != 1 {
			t.Fatalf("trial %d: f called %d times; once after stop was closed", i, calls-1)
		}
	}
}
