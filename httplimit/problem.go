package httplimit

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// Problem is the application/problem+json body (RFC 9457) of the default
// handlers.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// Policy names the violated rule (denials only).
	Policy string `json:"policy,omitempty"`
	// RetryAfter repeats the Retry-After header in seconds (denials only).
	RetryAfter int64 `json:"retry_after,omitempty"`
}

// DefaultDenyHandler answers 429 Too Many Requests with a Problem body
// naming the violated policy:
//
//	{"type":"about:blank","title":"Too Many Requests","status":429,
//	 "detail":"rate limit \"api\" exceeded; retry in 12s","policy":"api","retry_after":12}
func DefaultDenyHandler(w http.ResponseWriter, _ *http.Request, d Denial) {
	retry := max(ceilSeconds(d.Decision.RetryAfter), 1)
	writeProblem(w, Problem{
		Type:       "about:blank",
		Title:      http.StatusText(http.StatusTooManyRequests),
		Status:     http.StatusTooManyRequests,
		Detail:     "rate limit " + strconv.Quote(d.Policy) + " exceeded; retry in " + strconv.FormatInt(retry, 10) + "s",
		Policy:     d.Policy,
		RetryAfter: retry,
	})
}

// DefaultErrorHandler answers 503 Service Unavailable when the store
// failed (ErrStore) and 500 Internal Server Error otherwise, with a Problem
// body that does not reveal the error.
func DefaultErrorHandler(w http.ResponseWriter, _ *http.Request, err error) {
	status, detail := http.StatusInternalServerError, "rate limiter misconfigured"
	if errors.Is(err, ErrStore) {
		status, detail = http.StatusServiceUnavailable, "rate limiter unavailable"
	}
	writeProblem(w, Problem{Type: "about:blank", Title: http.StatusText(status), Status: status, Detail: detail})
}

func writeProblem(w http.ResponseWriter, p Problem) {
	body, err := json.Marshal(p)
	if err != nil { // cannot happen: every field is a plain value
		body = []byte(`{"status":` + strconv.Itoa(p.Status) + `}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)+1))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(p.Status)
	w.Write(append(body, '\n'))
}
