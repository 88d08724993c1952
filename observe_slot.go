package sluice

// SlotObserver is an Observer that also receives the middleware's
// in-flight events. The middleware checks for it with a type assertion,
// so an Observer written before in-flight limits keeps compiling and
// simply sees none of them. Package promsluice implements it.
type SlotObserver interface {
	Observer
	// ObserveSlot is called once per in-flight rule per acquire, and once
	// per release of a slot acquired.
	ObserveSlot(SlotEvent)
}

// SlotOp is what happened to an in-flight slot.
type SlotOp uint8

const (
	// SlotAcquire: a request asked for a slot. Outcome is OutcomeAllowed,
	// OutcomeDenied or OutcomeError.
	SlotAcquire SlotOp = iota
	// SlotRelease: a request gave its slot back. Outcome is OutcomeAllowed
	// (freed) or OutcomeError (the release failed; the store frees the
	// slot at its hold timeout). Either way this process holds it no more.
	SlotRelease
)

var slotOpNames = [...]string{"acquire", "release"}

// String returns "acquire" or "release".
func (o SlotOp) String() string { return label(slotOpNames[:], int(o)) }

// SlotEvent reports one acquire or release of one in-flight rule.
type SlotEvent struct {
	// Policy is the rule's name.
	Policy string
	// Op is SlotAcquire or SlotRelease.
	Op SlotOp
	// Outcome is what the acquire or release did.
	Outcome Outcome
	// Priority is the request's priority: PriorityCritical when the
	// middleware has no priority function.
	Priority Priority
	// Weight is the slot's weight.
	Weight int64
	// Decision is the acquire's decision; zero for releases and errors.
	Decision SlotDecision
}
