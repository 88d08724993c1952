package lease

// SetMaxLimits sets maxLimits for a test, returning a function that puts
// it back.
func SetMaxLimits(n int) func() {
	old := maxLimits
	maxLimits = n
	return func() { maxLimits = old }
}

// Slots is the number of slots in s's tables, live or not: what their
// memory is sized by.
func Slots(s *Store) int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.leases.Slots()
		sh.mu.Unlock()
	}
	return n
}

// WaitSweep waits until no sweep is under way in s.
func WaitSweep(s *Store) {
	s.sw.mu.Lock()
	done := s.sw.done
	s.sw.mu.Unlock()
	if done != nil {
		<-done
	}
}

// PauseSweeps makes the goroutine of each sweep s starts from now on call
// pause before each chunk it walks.
func PauseSweeps(s *Store, pause func()) {
	s.sw.mu.Lock()
	s.sw.pause = pause
	s.sw.mu.Unlock()
}

// Sweeping reports whether a sweep is under way in s, and how many slots
// it has walked.
func Sweeping(s *Store) (on bool, visited int) {
	s.sw.mu.Lock()
	defer s.sw.mu.Unlock()
	return s.sw.on, s.sw.visited
}

// SweepChunk is sweepChunk.
const SweepChunk = sweepChunk

// PauseStats makes s's Stats call pause between the chunks it walks, its
// shard's lock released, with how many slots the chunk walked.
func PauseStats(s *Store, pause func(walked int)) { s.statsPaused = pause }
