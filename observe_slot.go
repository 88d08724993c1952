package sluice

// SlotObserver is an Observer that also receives in-flight events: the
// middleware's and the service's. The middleware checks for it with a type
// assertion, so an Observer written before in-flight limits keeps
// compiling and simply sees none of them. Package promsluice implements it.
type SlotObserver interface {
	Observer
	// ObserveSlot is called once per in-flight rule per acquire, and once
	// per extend, release or expiry of a slot.
	ObserveSlot(SlotEvent)
}

// SlotOp is what happened to an in-flight slot.
type SlotOp uint8

const (
	// SlotAcquire: a request asked for a slot. Outcome is OutcomeAllowed,
	// OutcomeDenied (the key's slots are full), OutcomeShed (the
	// priority's share is full) or OutcomeError.
	SlotAcquire SlotOp = iota
	// SlotRelease: a holder gave its slot back. Outcome is OutcomeAllowed
	// (freed, or freed before when Again), OutcomeDenied (not held:
	// expired or never acquired; nothing freed) or OutcomeError (the
	// release failed: the middleware sends it again in the background,
	// RetryRelease, and reports the answer as one more SlotRelease:
	// Again when nothing was held though the hold could not have passed
	// yet (the failed try ran, its answer lost), else not held with a
	// SlotExpire; failing that, or with
	// NotRetried when too many were being sent again, the store frees the
	// slot at its hold timeout).
	SlotRelease
	// SlotExtend: a holder moved its hold timeout (the middleware extends
	// a running request's slots about every third of their hold). Outcome
	// is OutcomeAllowed (extended), OutcomeDenied (not held: the slot is
	// lost, and the middleware also reports a SlotExpire) or OutcomeError.
	SlotExtend
	// SlotExpire: a slot this process acquired is held no more, with no
	// release through this process: it passed its hold timeout (its
	// holder stopped), or another process of the fleet released it and
	// said so. Outcome is OutcomeAllowed. The service and, with an
	// observer, the middleware report it; a release after it then reports
	// Weight 0.
	SlotExpire
)

var slotOpNames = [...]string{"acquire", "release", "extend", "expire"}

// String returns "acquire", "release", "extend" or "expire".
func (o SlotOp) String() string { return label(slotOpNames[:], int(o)) }

// SlotEvent reports one acquire, extend, release or expiry of one
// in-flight slot.
type SlotEvent struct {
	// Policy is the rule's name.
	Policy string
	// Op is what happened.
	Op SlotOp
	// Outcome is what the call did (see SlotOp).
	Outcome Outcome
	// Priority is the request's priority: PriorityCritical when the
	// front end has no priority.
	Priority Priority
	// Weight is, for an acquire, the weight asked for; for an extend, the
	// slot's; for a release or an expiry, the weight this process holds
	// no more (0 when it held none of it: a slot acquired through another
	// process).
	Weight int64
	// Again, on a SlotRelease with OutcomeAllowed, reports a repeated
	// release of a slot an earlier release freed: nothing freed now.
	Again bool
	// NotRetried, on a SlotRelease with OutcomeError, reports a failed
	// release that is not sent again in the background: MaxBackgroundReleases
	// were at work already (ErrRetriesFull), so the slot stays held to its
	// hold timeout. The middleware and the service report so, with Weight
	// 0, the release of an abandoned acquire that was not sent
	// (SlotDecision.ReleaseDropped): the store may hold its slot.
	NotRetried bool
	// Decision is the acquire's decision; zero for the other ops and for
	// errors.
	Decision SlotDecision
}
