// Package httplimit puts net/http handlers behind sluice rate limits.
//
// A Middleware holds Rules. Each Rule names a policy, a sluice.Limit, a
// KeyFunc that says whom the request is counted against (client IP behind
// trusted proxies, API key, user, route, or a composition), a cost, and a
// strategy for requests over the limit: reject, delay, shadow or penalty.
// All the enforcing rules that match a request are checked all-or-nothing:
// a request denied by one consumes nothing from the others.
//
// Denied responses carry Retry-After, X-RateLimit-* and the IETF draft's
// RateLimit and RateLimit-Policy fields (see SetHeaders), and are 429 with
// an application/problem+json body naming the violated policy. Allowed
// responses carry the two IETF fields, which say the same in two fields
// instead of five; Options.AllowedHeaders chooses all five, or none.
//
// # Requests that can never be admitted
//
// A request whose Cost exceeds its rule's capacity (Limit.Capacity(), the
// burst) could not be admitted however long its client waited. It is
// denied at once with 429 and no Retry-After (nor RateLimit, whose t on a
// denial is a wait), takes nothing from any rule and starts no Penalty
// block; a Delay rule does not hold it. The default body says so, with
// the cost and the capacity (see DefaultDenyHandler); a DenyHandler tells
// it by Denial.Never. The observer records a denial, as for any request
// over its limit. A Shadow rule records such a request as a shadow denial
// and lets it through. The answer does not depend on the store: when the
// store fails (and no failure policy answers), the request is denied so
// all the same, without the X-RateLimit-Remaining and X-RateLimit-Reset
// that only the store knows.
//
// In-flight rules (Options.InFlight) bound the requests of one key in
// progress at once, and shedding rules (Options.Shed) keep a capacity,
// fleet-wide or this process's, with shares reserved for critical and
// normal requests (Options.Priority says which a request is). A request
// acquires their slots before its rate rules take units and holds them
// until its handler returns; refusals are 429 (per key) or 503 (shed).
//
// Transport is the outbound side: an http.RoundTripper that waits for quota
// before calling a rate-limited third-party API, and holds a key's requests
// for as long as the API's 429 or 503 Retry-After asks.
//
// For a shared limit across a fleet, pass a Redis store, wrapped by package
// resilient to choose what happens when Redis fails.
package httplimit
