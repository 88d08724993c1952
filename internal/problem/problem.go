// Package problem writes application/problem+json bodies (RFC 9457), for
// the HTTP middleware and the service alike, and keeps a rule's 429 body
// pre-encoded so that a denial costs no encoding.
package problem

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync"
)

// Problem is an application/problem+json body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Policy names the violated rule (denials only).
	Policy string `json:"policy,omitempty"`
	// RetryAfter repeats the Retry-After header in seconds (denials only).
	RetryAfter int64 `json:"retry_after,omitempty"`
	// Cost and Capacity are set on a request whose cost exceeds what its
	// rule can ever admit (type NeverType).
	Cost     int64 `json:"cost,omitempty"`
	Capacity int64 `json:"capacity,omitempty"`
}

// The fixed header values, shared: each is a full slice (cap 1), so an
// append by a later handler copies rather than writing into it.
var (
	contentType = []string{"application/problem+json"}
	noSniff     = []string{"nosniff"}
)

func setHeaders(w http.ResponseWriter) {
	h := w.Header()
	h["Content-Type"] = contentType[:1:1]
	h["X-Content-Type-Options"] = noSniff[:1:1]
}

// Write answers with p: its status and its body.
func Write(w http.ResponseWriter, p Problem) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: every field is a plain value
		body = []byte(`{"status":` + strconv.Itoa(p.Status) + `}`)
	}
	setHeaders(w)
	w.WriteHeader(p.Status)
	w.Write(append(body, '\n'))
}

// New is the Problem of status with detail, of type about:blank.
func New(status int, detail string) Problem {
	return Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail}
}

// NeverType is the problem type of a request whose cost exceeds its rule's
// capacity: no wait would admit it. It points at the documentation.
const NeverType = "https://pkg.go.dev/github.com/sluicehq/sluice/httplimit#hdr-Requests_that_can_never_be_admitted"

// NeverTitle is NeverType's title.
const NeverTitle = "Request cost exceeds the rate limit's capacity"

// NeverDetail says why a request of cost can never be admitted under the
// rule named policy, whose capacity is capacity.
func NeverDetail(policy string, cost, capacity int64) string {
	return "the request costs " + strconv.FormatInt(cost, 10) + " units of rate limit " + strconv.Quote(policy) +
		", which never admits more than " + strconv.FormatInt(capacity, 10) + " at once: it can never be allowed, however long the client waits"
}

// Never is the 429 body of a request of cost under the rule named policy
// of capacity capacity: no Retry-After, since waiting will not help.
func Never(policy string, cost, capacity int64) Problem {
	return Problem{
		Type: NeverType, Title: NeverTitle, Status: http.StatusTooManyRequests,
		Detail: NeverDetail(policy, cost, capacity), Policy: policy, Cost: cost, Capacity: capacity,
	}
}

// Denial is a rule's 429 body, encoded once:
//
//	{"type":"about:blank","title":"Too Many Requests","status":429,
//	 "detail":"rate limit \"api\" exceeded; retry in 12s","policy":"api","retry_after":12}
//
// Only the two numbers are written per request, into a pooled buffer.
type Denial struct {
	head, mid []byte // before the first number, between the two
}

// NewDenial encodes the 429 body of the rule named policy.
func NewDenial(policy string) *Denial {
	detail, _ := json.Marshal("rate limit " + strconv.Quote(policy) + " exceeded; retry in ")
	name, _ := json.Marshal(policy)
	head := append([]byte(`{"type":"about:blank","title":"Too Many Requests","status":429,"detail":`), detail[:len(detail)-1]...)
	mid := append(append([]byte(`s","policy":`), name...), `,"retry_after":`...)
	return &Denial{head: head, mid: mid}
}

var buffers = sync.Pool{New: func() any { b := make([]byte, 0, 256); return &b }}

// Write answers 429 with the body, retry seconds (at least 1) in both
// places.
func (d *Denial) Write(w http.ResponseWriter, retry int64) {
	bp := buffers.Get().(*[]byte)
	b := append((*bp)[:0], d.head...)
	b = strconv.AppendInt(b, retry, 10)
	b = append(b, d.mid...)
	b = strconv.AppendInt(b, retry, 10)
	b = append(b, "}\n"...)
	setHeaders(w)
	w.WriteHeader(http.StatusTooManyRequests)
	w.Write(b) // a Writer must not keep b
	*bp = b
	buffers.Put(bp)
}
