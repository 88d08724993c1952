package sluice

import (
	"errors"
	"fmt"
	"math"
)

// Priority ranks a request for load shedding: when capacity runs short,
// the least important traffic is refused first. The zero value is
// PriorityCritical, so a caller that never sets one sheds nothing early.
type Priority uint8

// Priorities, most important first.
const (
	// PriorityCritical may use the whole capacity.
	PriorityCritical Priority = iota
	// PriorityNormal may use what is not reserved for critical requests.
	PriorityNormal
	// PrioritySheddable may use what is reserved for neither critical nor
	// normal requests; it is refused first.
	PrioritySheddable
)

// ErrInvalidPriority: a priority name is unknown, or a Reserve's shares are
// outside [0, 1] or add up to more than 1.
var ErrInvalidPriority = errors.New("sluice: invalid priority")

var priorityNames = [...]string{"critical", "normal", "sheddable"}

// String returns the priority's name: "critical", "normal" or "sheddable",
// the metric label and the value ParsePriority reads.
func (p Priority) String() string {
	if int(p) < len(priorityNames) {
		return priorityNames[p]
	}
	return fmt.Sprintf("Priority(%d)", uint8(p))
}

// ParsePriority reads a priority's name, as String writes it.
func ParsePriority(s string) (Priority, error) {
	for i, n := range priorityNames {
		if s == n {
			return Priority(i), nil
		}
	}
	return 0, fmt.Errorf("%w: %q (want critical, normal or sheddable)", ErrInvalidPriority, s)
}

// Reserve holds shares of an in-flight capacity back for the more
// important priorities. A request of priority p is admitted when the
// weight in use plus its own fits under Max × (1 − the shares reserved for
// priorities above p): with Critical 0.2 and Normal 0.3 over Max 100,
// sheddable requests fit under 50, normal ones under 80 and critical ones
// under 100. The zero Reserve reserves nothing: every priority may use all.
type Reserve struct {
	// Critical is the share only critical requests may use. Default 0.
	Critical float64
	// Normal is the share only normal and critical requests may use.
	// Default 0.
	Normal float64
}

// Validate reports whether r's shares are each in [0, 1] and add up to at
// most 1: a wrapped ErrInvalidPriority if not.
func (r Reserve) Validate() error {
	if !(r.Critical >= 0 && r.Critical <= 1) || !(r.Normal >= 0 && r.Normal <= 1) || r.Critical+r.Normal > 1 {
		return fmt.Errorf("%w: reserve critical %v, normal %v: shares must be in [0, 1] and add up to at most 1", ErrInvalidPriority, r.Critical, r.Normal)
	}
	return nil
}

// Threshold is the most weight in use, the request's own included, at
// which a request of priority p is still admitted under a capacity of max:
// ⌊max × (1 − shares reserved above p)⌋, computed so that 100 × (1 − 0.2)
// is 80, not 79. A priority beyond PrioritySheddable is treated as
// sheddable.
func (r Reserve) Threshold(max int64, p Priority) int64 {
	share := 0.0
	if p >= PriorityNormal {
		share += r.Critical
	}
	if p >= PrioritySheddable {
		share += r.Normal
	}
	// Round away float noise below a millionth of a slot before flooring.
	v := float64(max) * (1 - share)
	return int64(math.Floor(v + 1e-6))
}

// For returns the in-flight limit a request of priority p is acquired
// under: l with Max lowered to r's threshold for p. Acquiring against the
// key's shared holders with this lower Max is the threshold model, atomic
// in the store. A threshold of zero (everything reserved above p) gives a
// Max of zero, which Validate refuses: callers refuse the request instead
// (see Admits).
func (l InFlightLimit) For(p Priority, r Reserve) InFlightLimit {
	l.Max = r.Threshold(l.Max, p)
	return l
}

// Admits reports whether any request of priority p and weight can ever be
// admitted under l and r: false when the share left to p is smaller than
// the weight.
func (l InFlightLimit) Admits(p Priority, r Reserve, weight int64) bool {
	return weight >= 1 && weight <= r.Threshold(l.Max, p)
}
