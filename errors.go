package sluice

import "errors"

// Errors for bad input. Every store returns them (wrapped with detail) before
// touching its backend, so a rejected call never changes state. Test with
// errors.Is.
var (
	// ErrInvalidLimit: a Limit failed Validate or could not be parsed.
	ErrInvalidLimit = errors.New("sluice: invalid limit")
	// ErrInvalidKey: the key is empty or longer than MaxKeyLen bytes.
	ErrInvalidKey = errors.New("sluice: invalid key")
	// ErrInvalidCost: the cost is zero or negative.
	ErrInvalidCost = errors.New("sluice: invalid cost")
	// ErrCostExceedsBurst: the cost is larger than the limit's capacity, so
	// the request could never be admitted, however long the caller waited.
	ErrCostExceedsBurst = errors.New("sluice: cost exceeds burst")
)

// ErrStoreNotBuilt: the store is a zero value or was built without what it
// needs (a nil client), so no call to it can ever succeed. A store package's
// own sentinel for that wraps it (redisstore.ErrNoClient), so that wrappers
// such as a resilient.Store return it to the caller instead of counting it
// as an outage and answering by their failure policy forever.
var ErrStoreNotBuilt = errors.New("sluice: store not built")

// ErrStoreClosed: the store, or the client it talks through, was closed by
// its owner, so no call to it can succeed again. A store package's error
// for it matches it with errors.Is (redisstore's, for a closed go-redis
// client), so that the releases sent in the background (RetryRelease,
// ReleaseAbandoned) stop at once rather than trying until their hold ends,
// and resilient returns it rather than answering by its failure policy.
var ErrStoreClosed = errors.New("sluice: store closed")
