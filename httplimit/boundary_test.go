package httplimit

import (
	"errors"
	"testing"
)

// TestPriorityFromNilKey: a nil KeyFunc is a configuration error callers
// can test for, as every other of the package's.
func TestPriorityFromNilKey(t *testing.T) {
	if _, err := PriorityFrom(nil, ""); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("PriorityFrom(nil): %v, want ErrInvalidConfig", err)
	}
}
