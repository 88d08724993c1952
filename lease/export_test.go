package lease

// SetMaxLimits sets maxLimits for a test, returning a function that puts
// it back.
func SetMaxLimits(n int) func() {
	old := maxLimits
	maxLimits = n
	return func() { maxLimits = old }
}
