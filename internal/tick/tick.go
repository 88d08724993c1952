// Package tick runs the background loops of the stores and the service
// (sweeping, heartbeats, health probes, config watching), so that each
// stops the same way.
package tick

import "time"

// Every calls f every interval until stop is closed. f runs on the
// caller's goroutine, so a slow f delays the next call rather than
// overlapping it.
func Every(stop <-chan struct{}, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			// A tick that came while f ran is ready beside a stop that came
			// then too, and select picks either: without this a stop could
			// wait for f once more, each time with even odds.
			select {
			case <-stop:
				return
			default:
			}
			f()
		}
	}
}
