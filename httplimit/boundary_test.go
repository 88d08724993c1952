package httplimit

import (
	"context"
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

// TestClearHoldZeroTransport: a Transport not built by NewTransport is
// refused with the package's configuration error, not a nil store's panic.
func TestClearHoldZeroTransport(t *testing.T) {
	var zero Transport
	if err := zero.ClearHold(context.Background(), "api.example.com"); !errors.Is(err, ErrInvalidConfig) {
		t.Errorf("ClearHold on a zero Transport: %v, want ErrInvalidConfig", err)
	}
}
