package problem

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
)

// The pre-encoded denial is byte for byte what encoding the Problem gives,
// whatever the policy name holds.
func TestDenialMatchesEncoding(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"api", `a"b\c`, "<script>&", "rl.path_/api/v1 é", "\x01"} {
		for _, retry := range []int64{1, 12, 86400} {
			w := httptest.NewRecorder()
			NewDenial(name).Write(w, retry)
			want, err := json.Marshal(Problem{
				Type: "about:blank", Title: "Too Many Requests", Status: http.StatusTooManyRequests,
				Detail: "rate limit " + strconv.Quote(name) + " exceeded; retry in " + strconv.FormatInt(retry, 10) + "s",
				Policy: name, RetryAfter: retry,
			})
			if err != nil {
				t.Fatal(err)
			}
			if got := w.Body.String(); got != string(want)+"\n" {
				t.Errorf("%q, %d:\n got %s\nwant %s", name, retry, got, want)
			}
			if w.Code != 429 || w.Header().Get("Content-Type") != "application/problem+json" || w.Header().Get("X-Content-Type-Options") != "nosniff" {
				t.Errorf("%q: %d %v", name, w.Code, w.Header())
			}
		}
	}
}

func TestWrite(t *testing.T) {
	t.Parallel()
	w := httptest.NewRecorder()
	Write(w, New(http.StatusNotFound, "no such policy"))
	var p Problem
	if err := json.Unmarshal(w.Body.Bytes(), &p); err != nil || p != New(404, "no such policy") || w.Code != 404 {
		t.Errorf("%d %s: %+v, %v", w.Code, w.Body, p, err)
	}
}
