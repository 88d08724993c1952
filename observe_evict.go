package sluice

// EvictionObserver is an Observer that also hears of a failure policy's
// local store evicting keys to stay within its bound: each evicted key
// starts its limit afresh, so the fallback admits more than its share.
// Package resilient checks for it with a type assertion, as the
// middleware does for SlotObserver. Package promsluice implements it.
type EvictionObserver interface {
	Observer
	// ObserveEvictions is called when the store's evictions have grown,
	// at most about once a second, with the keys evicted since the last
	// call.
	ObserveEvictions(EvictionEvent)
}

// EvictionEvent reports keys a wrapped store's local fallback evicted.
type EvictionEvent struct {
	// Store names the wrapped store (resilient's Options.Name).
	Store string
	// Keys is how many keys were evicted since the last event; Exhausted
	// how many of them had taken their whole limit (denying, or a Penalty
	// block), each of which may admit its whole limit again.
	Keys, Exhausted uint64
}
