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
