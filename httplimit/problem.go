package httplimit

import (
	"errors"
	"net/http"

	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/header"
	"github.com/sluicehq/sluice/internal/problem"
)

// Problem is the application/problem+json body (RFC 9457) of the default
// handlers.
type Problem = problem.Problem

// DefaultDenyHandler answers 429 Too Many Requests with a Problem body
// naming the violated policy:
//
//	{"type":"about:blank","title":"Too Many Requests","status":429,
//	 "detail":"rate limit \"api\" exceeded; retry in 12s","policy":"api","retry_after":12}
//
// A request that can never be admitted (Denial.Never: its cost exceeds the
// rule's capacity) gets a body of its own, without retry_after:
//
//	{"type":"https://pkg.go.dev/github.com/sluicehq/sluice/httplimit#hdr-Requests_that_can_never_be_admitted",
//	 "title":"Request cost exceeds the rate limit's capacity","status":429,
//	 "detail":"the request costs 15 units of rate limit \"api\", which never admits more than 10 at once: it can never be allowed, however long the client waits",
//	 "policy":"api","cost":15,"capacity":10}
//
// It is the default: left unset, Options.DenyHandler writes the same body
// encoded once per rule.
func DefaultDenyHandler(w http.ResponseWriter, _ *http.Request, d Denial) {
	if d.Never() {
		problem.Write(w, problem.Never(d.Policy, d.Cost, d.Capacity))
		return
	}
	problem.NewDenial(d.Policy).Write(w, max(header.CeilSeconds(d.Decision.RetryAfter), 1))
}

// DefaultErrorHandler answers 503 Service Unavailable with Retry-After: 1
// when the store failed (ErrStore) and 500 Internal Server Error
// otherwise, with a Problem body that does not reveal the error. When the
// store refused what a rule asks of it, the 500's detail names the rules
// and the cause without the store's detail, which may hold a key:
//
//	"rate limiter misconfigured: the store refuses rule \"log\" (sluice: algorithm cannot grant)"
func DefaultErrorHandler(w http.ResponseWriter, _ *http.Request, err error) {
	status, detail := http.StatusInternalServerError, "rate limiter misconfigured"
	var cfg *enforce.ConfigError
	switch {
	case errors.As(err, &cfg): // never a 503: no wait mends it
		detail += ": " + cfg.Cause()
	case errors.Is(err, ErrStore):
		status, detail = http.StatusServiceUnavailable, "rate limiter unavailable"
		w.Header().Set("Retry-After", "1")
	}
	problem.Write(w, problem.New(status, detail))
}
