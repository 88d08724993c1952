package sluice_test

import (
	"errors"
	"testing"

	"github.com/sluicehq/sluice"
)

func TestReserveThreshold(t *testing.T) {
	r := sluice.Reserve{Critical: 0.2, Normal: 0.3}
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		p    sluice.Priority
		want int64
	}{{sluice.PriorityCritical, 100}, {sluice.PriorityNormal, 80}, {sluice.PrioritySheddable, 50}} {
		if got := r.Threshold(100, c.p); got != c.want {
			t.Errorf("Threshold(100, %v) = %d, want %d", c.p, got, c.want)
		}
		if got := sluice.Concurrent(100, 1).For(c.p, r).Max; got != c.want {
			t.Errorf("For(%v).Max = %d, want %d", c.p, got, c.want)
		}
	}
	if got := (sluice.Reserve{}).Threshold(7, sluice.PrioritySheddable); got != 7 {
		t.Errorf("zero Reserve: %d, want 7", got)
	}
	if got := (sluice.Reserve{Critical: 0.1}).Threshold(10, sluice.PriorityNormal); got != 9 {
		t.Errorf("10 × 0.9 = %d, want 9", got)
	}
	l := sluice.Concurrent(10, 1)
	full := sluice.Reserve{Critical: 0.5, Normal: 0.5}
	if l.Admits(sluice.PrioritySheddable, full, 1) || !l.Admits(sluice.PriorityNormal, full, 5) || l.Admits(sluice.PriorityNormal, full, 6) {
		t.Error("Admits disagrees with Threshold")
	}
}

func TestReserveInvalid(t *testing.T) {
	for _, r := range []sluice.Reserve{{Critical: -0.1}, {Normal: 1.1}, {Critical: 0.6, Normal: 0.5}} {
		if err := r.Validate(); !errors.Is(err, sluice.ErrInvalidPriority) {
			t.Errorf("%+v: %v, want ErrInvalidPriority", r, err)
		}
	}
}

func TestParsePriority(t *testing.T) {
	for _, p := range []sluice.Priority{sluice.PriorityCritical, sluice.PriorityNormal, sluice.PrioritySheddable} {
		if got, err := sluice.ParsePriority(p.String()); err != nil || got != p {
			t.Errorf("ParsePriority(%q) = %v, %v", p, got, err)
		}
	}
	if _, err := sluice.ParsePriority("urgent"); !errors.Is(err, sluice.ErrInvalidPriority) {
		t.Errorf("urgent: %v, want ErrInvalidPriority", err)
	}
}
