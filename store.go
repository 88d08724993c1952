package sluice

import "context"

// Store keeps rate-limit state and makes decisions atomically. The memory
// store (package sluice/memory) is exact within one process; the Redis store
// (package sluice/redisstore) shares state across a fleet. Every store passes the
// conformance suite in package sluice/storetest.
//
// Contract:
//   - Keys are opaque and compared byte for byte. A key's state is kept per
//     algorithm, so one key under two algorithms is two independent states.
//     Use one key per policy (Limiter's Prefix does this).
//   - Bad input (ValidateRequest fails) returns the wrapped sentinel error
//     and changes nothing.
//   - Errors are backend failures only. A denial is a Decision with Allowed
//     false, never an error.
//   - Every key the store writes expires once its state is back to fresh.
//   - A key's Limit may change between calls (a reloaded policy keeps its
//     keys): state written under another Limit is read under the new one,
//     and no decision on it fails, or has a wait that is negative or past
//     the new limit's horizon (GCRA's may be MaxClockSkew past it).
//   - Implementations are safe for concurrent use.
//
// Rate-limit keys often carry client identities; consider hashing raw IPs
// or API keys before they reach a shared store.
type Store interface {
	// Take takes cost units for key under limit if they are available and
	// reports the decision.
	Take(ctx context.Context, key string, limit Limit, cost int64) (Decision, error)

	// Peek reports what Take would decide for cost units now, without
	// taking anything. Remaining is the units available now.
	Peek(ctx context.Context, key string, limit Limit, cost int64) (Decision, error)

	// Reset returns key to its fresh state under limit.
	Reset(ctx context.Context, key string, limit Limit) error
}

// Request is one limit to check in Store.TakeAll.
type Request struct {
	Key   string
	Limit Limit
	Cost  int64
}

// LimitChecker is implemented by stores that can tell, before any request,
// that every request under a limit would fail whatever its key and cost: a
// lease store whose staleness is longer than the limit's period, say.
// NewLimiter and the middleware call it once per limit when built, so that
// such a configuration is refused then rather than on every request. A nil
// error promises nothing: the limit may still fail for some keys.
type LimitChecker interface {
	CheckLimit(limit Limit) error
}

// MultiStore is implemented by stores that can check several limits for one
// request all-or-nothing: either every request's units are taken, or none
// are. The Redis store does it in
// one script when the keys share a hash slot, and otherwise takes in turn
// and gives back what it took when a later limit denies.
type MultiStore interface {
	Store
	// TakeAll returns one Decision per request, in order: each is that
	// limit's own verdict. Units are taken only when every verdict is
	// Allowed; otherwise nothing is taken, and the allowing verdicts report
	// Remaining as Peek would (nothing was taken from them).
	TakeAll(ctx context.Context, reqs []Request) ([]Decision, error)
}
