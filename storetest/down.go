package storetest

import (
	"context"
	"errors"

	"github.com/sluicehq/sluice"
)

// ErrDown is what Down's Take returns.
var ErrDown = errors.New("storetest: dial tcp 10.0.0.7:6379: connection refused")

// Down is a Store whose backend is down, as a dead Redis would be: Take
// fails with ErrDown; the other methods are the embedded Store's (nil
// panics, so embed one where a test calls them).
type Down struct{ sluice.Store }

// Take fails with ErrDown.
func (Down) Take(context.Context, string, sluice.Limit, int64) (sluice.Decision, error) {
	return sluice.Decision{}, ErrDown
}
