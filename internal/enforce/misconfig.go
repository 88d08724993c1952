package enforce

import (
	"errors"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
)

// badInput are package sluice's bad-input errors, the most specific first
// (a lease store's refusal of a log wraps ErrGrantUnsupported and
// ErrInvalidLimit).
var badInput = []error{
	sluice.ErrGrantUnsupported, sluice.ErrInvalidLimit, sluice.ErrCostExceedsBurst, sluice.ErrInvalidCost,
	sluice.ErrInvalidKey, sluice.ErrInvalidWeight, sluice.ErrInvalidHolder, sluice.ErrInvalidReturn,
	sluice.ErrStoreNotBuilt,
}

// Misconfigured reports whether err, a store's, is bad input: the store
// refuses what a rule asks of it (a limit it cannot serve for the key, a
// cost, a key, a weight) and would refuse it again whatever its health. It
// is the list package resilient keeps out of its breaker.
func Misconfigured(err error) bool { return cause(err) != nil }

func cause(err error) error {
	if err == nil {
		return nil
	}
	for _, b := range badInput {
		if errors.Is(err, b) {
			return b
		}
	}
	return nil
}

// ConfigError is a store's refusal, while deciding a request, of what its
// rules ask (see Misconfigured): a misconfiguration that no retry mends,
// which front ends answer as such (500, gRPC Internal) and which is not
// observed as a store failure.
type ConfigError struct {
	// Policies names the rules of the refused call: one, or several asked
	// at once (layered limits).
	Policies []string
	Err      error
}

func (e *ConfigError) Error() string { return "store refuses " + e.rules() + ": " + e.Err.Error() }

func (e *ConfigError) Unwrap() error { return e.Err }

// Cause describes the refusal for a client: the rules and the sentinel
// saying why, without the store's own detail, which may hold a key.
func (e *ConfigError) Cause() string {
	why := "bad input"
	if b := cause(e.Err); b != nil {
		why = b.Error()
	}
	return "the store refuses " + e.rules() + " (" + why + ")"
}

func (e *ConfigError) rules() string {
	q := make([]string, len(e.Policies))
	for i, p := range e.Policies {
		q[i] = strconv.Quote(p)
	}
	if len(q) == 1 {
		return "rule " + q[0]
	}
	return "rules " + strings.Join(q, ", ")
}
