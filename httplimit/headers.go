package httplimit

import (
	"fmt"
	"net/http"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/header"
)

// Header names written by SetHeaders.
const (
	HeaderRetryAfter      = header.RetryAfter
	HeaderLimit           = header.Limit
	HeaderRemaining       = header.Remaining
	HeaderReset           = header.Reset
	HeaderRateLimit       = header.RateLimit
	HeaderRateLimitPolicy = header.Policy
)

// SetHeaders writes the rate-limit header fields for decision d of the
// policy named policy, as the middleware does, so that other front ends (a
// JSON API, a proxy) answer the same way. now is the current time; it only
// anchors X-RateLimit-Reset.
//
//	Retry-After: 12                        denied only: seconds, rounded up
//	X-RateLimit-Limit: 100                 d.Limit.Capacity()
//	X-RateLimit-Remaining: 0               d.Remaining
//	X-RateLimit-Reset: 1700000012          Unix seconds when the key is fresh, rounded up
//	RateLimit-Policy: "api";q=100;w=60     quota: the capacity per the seconds it takes to refill (rounded up)
//	RateLimit: "api";r=0;t=12              remaining; seconds until Retry-After when denied,
//	                                       until the key is fresh when allowed
//
// HeaderSet.Set writes a selection of them.
func SetHeaders(h http.Header, policy string, d sluice.Decision, now time.Time) {
	AllHeaders.Set(h, policy, d, now)
}

// HeaderSet selects the rate-limit header fields of allowed responses.
// Denied responses always carry every field and Retry-After. Its Set
// method is SetHeaders limited to the fields it selects when d is allowed:
// what the middleware writes under Options.AllowedHeaders.
type HeaderSet = header.Selection

const (
	// StandardHeaders are RateLimit and RateLimit-Policy, the structured
	// fields of draft-ietf-httpapi-ratelimit-headers. The default.
	StandardHeaders = header.Standard
	// AllHeaders adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset, for clients that read only those.
	AllHeaders = header.All
	// NoHeaders leaves allowed responses untouched.
	NoHeaders = header.None
)

// ParseHeaderSet parses a set's name, as String returns it: "standard",
// "all" or "none".
func ParseHeaderSet(name string) (HeaderSet, error) {
	s, err := header.Parse(name)
	if err != nil {
		return 0, fmt.Errorf("%w: header set %q (%w)", ErrInvalidConfig, name, err)
	}
	return s, nil
}
