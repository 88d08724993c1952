package sluice_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func TestInFlightLimitValidate(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		limit sluice.InFlightLimit
		want  error
	}{
		{sluice.Concurrent(1, time.Microsecond), nil},
		{sluice.Concurrent(sluice.MaxInFlight, sluice.MaxHold), nil},
		{sluice.InFlightLimit{}, sluice.ErrInvalidLimit},
		{sluice.Concurrent(0, time.Second), sluice.ErrInvalidLimit},
		{sluice.Concurrent(-5, time.Second), sluice.ErrInvalidLimit},
		{sluice.Concurrent(sluice.MaxInFlight+1, time.Second), sluice.ErrInvalidLimit},
		{sluice.Concurrent(1, 0), sluice.ErrInvalidLimit},
		{sluice.Concurrent(1, -time.Second), sluice.ErrInvalidLimit},
		{sluice.Concurrent(1, time.Microsecond-1), sluice.ErrInvalidLimit},
		{sluice.Concurrent(1, sluice.MaxHold+time.Microsecond), sluice.ErrInvalidLimit},
	} {
		if err := c.limit.Validate(); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%v: Validate = %v, want %v", c.limit, err, c.want)
		}
	}
	if got, want := sluice.Concurrent(20, 30*time.Second).String(), "20 in flight (hold 30s)"; got != want {
		t.Errorf("String = %q, want %q", got, want)
	}
}

func TestValidateSlot(t *testing.T) {
	t.Parallel()
	l := sluice.Concurrent(5, time.Second)
	long := string(make([]byte, sluice.MaxHolderLen+1))
	for _, c := range []struct {
		key    string
		weight int64
		holder string
		want   error
	}{
		{"k", 1, "h", nil},
		{"k", 5, string(make([]byte, sluice.MaxHolderLen)), nil},
		{"", 1, "h", sluice.ErrInvalidKey},
		{"k", 0, "h", sluice.ErrInvalidWeight},
		{"k", 6, "h", sluice.ErrInvalidWeight},
		{"k", 1, "", sluice.ErrInvalidHolder},
		{"k", 1, long, sluice.ErrInvalidHolder},
	} {
		if err := sluice.ValidateSlot(c.key, l, c.weight, c.holder); !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("ValidateSlot(%q, %d, %d-byte holder) = %v, want %v", c.key, c.weight, len(c.holder), err, c.want)
		}
	}
	if a, b := sluice.NewHolderID(), sluice.NewHolderID(); a == b || len(a) != 32 {
		t.Errorf("NewHolderID gave %q and %q, want two different 32-digit ids", a, b)
	}
}

// AcquireSlot without a store is an error, not a panic.
// TestNilSlot: the nil *Slot a denial returns can be released (so a
// deferred Release may precede the check) and reports nothing.
func TestNilSlot(t *testing.T) {
	var s *sluice.Slot
	if err := s.Release(context.Background()); err != nil {
		t.Errorf("Release = %v, want nil", err)
	}
	if err := s.Extend(context.Background()); !errors.Is(err, sluice.ErrSlotLost) {
		t.Errorf("Extend = %v, want ErrSlotLost", err)
	}
	if s.Key() != "" || s.Holder() != "" || s.Weight() != 0 || s.Limit() != (sluice.InFlightLimit{}) {
		t.Errorf("a nil Slot reports %q %q %d %v", s.Key(), s.Holder(), s.Weight(), s.Limit())
	}
}

func TestAcquireSlotNilStore(t *testing.T) {
	s, _, err := sluice.AcquireSlot(context.Background(), nil, "k", sluice.Concurrent(1, time.Second), 1)
	if s != nil || !errors.Is(err, sluice.ErrInvalidLimit) || !errors.Is(err, sluice.ErrStoreNotBuilt) {
		t.Errorf("AcquireSlot(nil store) = %v, %v; want ErrInvalidLimit and ErrStoreNotBuilt", s, err)
	}
}
