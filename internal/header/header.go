// Package header holds the rate-limit header rules every front end follows
// (the HTTP middleware, the gRPC interceptor's metadata, the service's JSON
// API and Envoy responses): which fields, their values, and how a rule's
// fixed values are precomputed so that a response, allowed or denied,
// costs two allocations.
package header

import (
	"errors"
	"math"
	"math/bits"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enum"
)

// Field names.
const (
	RetryAfter = "Retry-After"
	Limit      = "X-RateLimit-Limit"
	Remaining  = "X-RateLimit-Remaining"
	Reset      = "X-RateLimit-Reset"
	RateLimit  = "RateLimit"
	Policy     = "RateLimit-Policy"
)

// Canonical forms of the field names, for direct map assignment: h.Set
// would canonicalize them again on every response.
var (
	canonRetryAfter = http.CanonicalHeaderKey(RetryAfter)
	canonLimit      = http.CanonicalHeaderKey(Limit)
	canonRemaining  = http.CanonicalHeaderKey(Remaining)
	canonReset      = http.CanonicalHeaderKey(Reset)
	canonRateLimit  = http.CanonicalHeaderKey(RateLimit)
	canonPolicy     = http.CanonicalHeaderKey(Policy)
)

// Selection selects the rate-limit fields of allowed responses. Denied
// responses always carry every field and Retry-After.
type Selection uint8

const (
	// Standard are RateLimit and RateLimit-Policy, the structured fields of
	// draft-ietf-httpapi-ratelimit-headers. Together they carry the limit,
	// the remaining quota and the seconds until reset: all that the
	// X-RateLimit fields say, in two fields instead of five. The default.
	Standard Selection = iota
	// All adds X-RateLimit-Limit, X-RateLimit-Remaining and
	// X-RateLimit-Reset, for clients that read only those.
	All
	// None leaves allowed responses untouched.
	None
)

var selectionNames = []string{"standard", "all", "none"}

// String returns the selection's name: "standard", "all" or "none".
func (s Selection) String() string { return enum.String(selectionNames, s, "HeaderSet") }

// ErrSelection: a selection name that is not one of String's.
var ErrSelection = errors.New("want standard, all or none")

// Parse parses a selection's name, as String returns it.
func Parse(name string) (Selection, error) {
	if s, ok := enum.Parse[Selection](selectionNames, name); ok {
		return s, nil
	}
	return 0, ErrSelection
}

// Set writes the rate-limit fields for decision d of the policy named
// policy, limited to the fields s selects when d is allowed (a denial gets
// every field whatever s). now is the current time; it only anchors
// X-RateLimit-Reset.
//
//	Retry-After: 12                        denied only: seconds, rounded up
//	X-RateLimit-Limit: 100                 d.Limit.Capacity()
//	X-RateLimit-Remaining: 0               d.Remaining
//	X-RateLimit-Reset: 1700000012          Unix seconds when the key is fresh, rounded up
//	RateLimit-Policy: "api";q=100;w=60     quota: the capacity per the seconds it takes to refill (rounded up)
//	RateLimit: "api";r=0;t=12              remaining; seconds until Retry-After when denied,
//	                                       until the key is fresh when allowed
//
// The last two are the structured fields of the IETF draft
// draft-ietf-httpapi-ratelimit-headers. Retry-After is rounded up so that a
// client waiting exactly that long is admitted, never told to come back too
// early. The policy name is written as a structured-field string (see
// Quote).
func (s Selection) Set(h http.Header, policy string, d sluice.Decision, now time.Time) {
	if d.Allowed && s == None {
		return
	}
	q := Quote(policy)
	Write(h, s, Fields{quoted: q, policy: policyField(q, d.Limit)}, d, func() time.Time { return now })
}

// OmitNever removes from h what a denial no wait admits (enforce.Never)
// must not say: Retry-After and RateLimit (whose t on a denial is a wait)
// and, when blind (the store did not give its figures), the
// X-RateLimit-Remaining and X-RateLimit-Reset only it knows.
func OmitNever(h http.Header, blind bool) {
	delete(h, canonRetryAfter)
	delete(h, canonRateLimit)
	if blind {
		delete(h, canonRemaining)
		delete(h, canonReset)
	}
}

// Fields are a rule's field values that do not change per request.
type Fields struct {
	quoted   string       // the policy name as a structured-field string
	policy   string       // RateLimit-Policy
	limit    sluice.Limit // the rule's limit, for which capacity holds
	capacity string       // X-RateLimit-Limit under limit; "" to compute
}

// NewFields precomputes the fixed values of the rule named name.
func NewFields(name string, l sluice.Limit) Fields {
	q := Quote(name)
	return Fields{quoted: q, policy: policyField(q, l), limit: l, capacity: strconv.FormatInt(l.Capacity(), 10)}
}

// Write is Selection.Set with the rule's fixed values precomputed, writing
// only the standard fields when set says so (denials get all). now is
// called only for X-RateLimit-Reset.
//
// It allocates twice whatever the decision: one backing array for the
// values and one string holding every per-request number. Each value is a
// full slice (cap 1), so an append by a later handler copies rather than
// overwriting its neighbour.
func Write(h http.Header, set Selection, f Fields, d sluice.Decision, now func() time.Time) {
	var t int64
	if d.Allowed {
		t = CeilSeconds(d.ResetAfter)
	} else {
		t = max(CeilSeconds(d.RetryAfter), 1) // a denial always means "wait"
	}
	// One string: `"name";r=REMAINING;t=T` (the RateLimit field), then the
	// reset time and, if it is not the rule's, the capacity. Remaining and
	// Retry-After are substrings of the RateLimit field.
	var b [160]byte
	buf := append(b[:0], f.quoted...)
	buf = append(buf, ";r="...)
	r0 := len(buf)
	buf = strconv.AppendInt(buf, d.Remaining, 10)
	r1 := len(buf)
	buf = append(buf, ";t="...)
	t0 := len(buf)
	buf = strconv.AppendInt(buf, t, 10)
	t1 := len(buf)
	policy := f.policy
	if d.Limit != f.limit && d.Limit.Rate > 0 {
		// A fallback reports its share: every field states that one
		// limit, the policy too.
		policy = policyField(f.quoted, d.Limit)
	}
	if d.Allowed && set == Standard {
		vals := make([]string, 2)
		vals[0], vals[1] = policy, string(buf)
		h[canonPolicy] = vals[0:1:1]
		h[canonRateLimit] = vals[1:2:2]
		return
	}
	vals := make([]string, 6)
	buf = strconv.AppendInt(buf, resetUnix(now(), d.ResetAfter), 10)
	reset := len(buf)
	vals[0] = f.capacity
	if f.capacity == "" || d.Limit != f.limit { // a fallback may report another limit
		buf = strconv.AppendInt(buf, d.Limit.Capacity(), 10)
	}
	s := string(buf)
	if len(s) > reset {
		vals[0] = s[reset:]
	}
	vals[1] = s[r0:r1]
	vals[2] = s[t1:reset]
	vals[3] = policy
	vals[4] = s[:t1]
	h[canonLimit] = vals[0:1:1]
	h[canonRemaining] = vals[1:2:2]
	h[canonReset] = vals[2:3:3]
	h[canonPolicy] = vals[3:4:4]
	h[canonRateLimit] = vals[4:5:5]
	if !d.Allowed {
		vals[5] = s[t0:t1]
		h[canonRetryAfter] = vals[5:6:6]
	}
}

// policyField is the RateLimit-Policy value: `"name";q=QUOTA;w=SECONDS`,
// the capacity per the time it takes to come back whole (a window's
// Period; Burst units' Intervals for the buckets and GCRA), so that q is
// never below a RateLimit's r and q per w is the rate. A span under a
// second is stated per second, the units one second brings.
func policyField(quoted string, l sluice.Limit) string {
	q, span := l.Capacity(), l.Period
	iv := l.Interval()
	if !windowed(l.Algorithm) {
		span = refill(q, l)
	}
	w := CeilSeconds(span)
	if span < time.Second && span > 0 {
		w = 1
		if windowed(l.Algorithm) {
			// At most MaxRate × 1s/MinPeriod: no overflow.
			q = q * int64(time.Second) / int64(l.Period)
		} else if iv > 0 { // 0 only for a limit that is not valid
			q = int64(time.Second / iv)
		}
	}
	return quoted + ";q=" + strconv.FormatInt(q, 10) + ";w=" + strconv.FormatInt(max(w, 1), 10)
}

// refill is how long q units take to come back at l's rate, q × Period /
// Rate rounded up to the nanosecond: exact, not q Intervals, which are each
// rounded up (3/s would come back in 1.000000002 s, stated as w=2).
func refill(q int64, l sluice.Limit) time.Duration {
	if l.Rate <= 0 || q <= 0 || l.Period <= 0 {
		return time.Duration(q) * l.Interval()
	}
	hi, lo := bits.Mul64(uint64(q), uint64(l.Period))
	if hi >= uint64(l.Rate) { // beyond any Duration
		return time.Duration(math.MaxInt64)
	}
	quo, rem := bits.Div64(hi, lo, uint64(l.Rate))
	if rem > 0 {
		quo++
	}
	return time.Duration(min(quo, math.MaxInt64))
}

// windowed reports whether a's whole capacity comes back at once over a
// Period (the window algorithms) rather than a unit per Interval.
func windowed(a sluice.Algorithm) bool {
	return a == sluice.FixedWindow || a == sluice.SlidingWindowLog || a == sluice.SlidingWindowCounter
}

// CeilSeconds rounds d up to whole seconds; negative durations give 0.
func CeilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	s := int64(d / time.Second)
	if d%time.Second != 0 { // not d+1s-1: that wraps for the longest waits
		s++
	}
	return s
}

// resetUnix is now+after in Unix seconds, rounded up.
func resetUnix(now time.Time, after time.Duration) int64 {
	t := now.Add(max(after, 0))
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return s
}

// Quote formats s as a structured-field string (RFC 8941 §3.3.3), which
// holds printable ASCII only: other bytes, and '%', are percent-encoded
// ("café" is "caf%C3%A9"), so distinct names stay distinct and a client
// can decode them.
func Quote(s string) string {
	const hex = "0123456789ABCDEF"
	var b strings.Builder
	b.Grow(len(s) + 2)
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b.WriteByte('\\')
			b.WriteByte(c)
		case c < 0x20 || c > 0x7e || c == '%':
			b.WriteByte('%')
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&15])
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
