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
