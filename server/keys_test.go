package server

import (
	"net/http"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// TestKeyEscapesAsRendered: a JSON API key spelling a value with an
// escape its rendering never writes (%41 for "A") is no second counter of
// the value's but a 400 naming the key to send, on every endpoint that
// takes a rendered key; /v1/acquire takes the client's own text, which
// the service escapes, so "%41" is a key apart from "A" there.
func TestKeyEscapesAsRendered(t *testing.T) {
	srv := startServerConfig(t, `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
policies:
  - name: one
    limit: 1/min
    key: "{user}"
  - name: two
    limit: 1/min
    key: "{user}:{ip}"
  - name: jobs
    key: "{user}"
    in_flight: {max: 1, hold: 30s}
`)
	base := "http://" + srv.HTTPAddr()

	// Envoy spends user A's one request; the JSON API's "A" is that counter.
	code, out := postJSON(t, srv, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "A"}}},
	}})
	if code != http.StatusOK || out.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("/json user A: %d %v", code, out.GetOverallCode())
	}
	if code, _, _ := post(t, base, "/v1/check", `{"policy":"one","key":"A"}`); code != http.StatusTooManyRequests {
		t.Errorf(`check "A" after Envoy spent it: %d, want 429`, code)
	}

	for _, tt := range []struct{ path, body, detail string }{
		{"/v1/check", `{"policy":"one","key":"%41"}`, `"%41" is not an escape here: a value escapes only '%', '{' and '}' (%25, %7B, %7D); send "A"`},
		{"/v1/peek", `{"policy":"one","key":"%41"}`, `send "A"`},
		{"/v1/reset", `{"policy":"one","key":"%41"}`, `send "A"`},
		{"/v1/check", `{"policy":"one","key":"50%2525%2f"}`, `escape "%2f" must be written in upper case, "%2F"`},
		{"/v1/check", `{"policy":"one","key":"x%7b"}`, `escape "%7b" must be written in upper case, "%7B"`},
		{"/v1/check", `{"policy":"one","key":"a%3Ab"}`, `send "a:b"`},
		// Before the last variable the text between variables is escaped
		// too (a%3Ab:c is user a:b), after it not.
		{"/v1/check", `{"policy":"two","key":"a:b%3Ac"}`, `"%3A" is not an escape here: a value escapes only '%', '{' and '}' (%25, %7B, %7D), and one before the template's last variable the text between its variables too; send "a:b:c"`},
		{"/v1/peek", `{"policy":"two","key":"a%41:c"}`, `send "aA:c"`},
		{"/v1/check", `{"policy":"d.k","key":"k=%41"}`, `"%41" is not an escape here: an entry's key and value escape only '%', ',', '=', '|', '{' and '}' (%25, %2C, %3D, %7C, %7B, %7D); send "k=A"`},
		{"/v1/reset", `{"policy":"d.k","key":"k=a=b%25"}`, `a '=' is written %3D here: an entry's key and value escape only`},
	} {
		code, body, h := post(t, base, tt.path, tt.body)
		detail, _ := body["detail"].(string)
		if code != http.StatusBadRequest || h.Get("Content-Type") != "application/problem+json" || !strings.Contains(detail, tt.detail) {
			t.Errorf("%s %s: %d %s %q; want 400 problem+json saying %q", tt.path, tt.body, code, h.Get("Content-Type"), detail, tt.detail)
		}
	}

	// The rendered forms are taken: escapes the rendering writes, and the
	// text between variables escaped before the last one.
	for _, tt := range []struct{ path, body string }{
		{"/v1/check", `{"policy":"one","key":"50%25%7Bx%7D"}`},
		{"/v1/check", `{"policy":"two","key":"a%3Ab:c"}`},
		{"/v1/peek", `{"policy":"two","key":"a:b:c"}`},
		{"/v1/check", `{"policy":"d.k","key":"k=a%3Db%2C%7C"}`},
	} {
		if code, body, _ := post(t, base, tt.path, tt.body); code != http.StatusOK {
			t.Errorf("%s %s: %d %v, want 200", tt.path, tt.body, code, body)
		}
	}
	if code, _, _ := post(t, base, "/v1/reset", `{"policy":"one","key":"A"}`); code != http.StatusNoContent {
		t.Errorf(`reset "A": %d, want 204`, code)
	}

	// An in-flight key is the client's text: "%41" and "A" hold a slot each.
	for _, key := range []string{"%41", "A", "{x}"} {
		if code, body, _ := post(t, base, "/v1/acquire", `{"policy":"jobs","key":"`+key+`"}`); code != http.StatusOK {
			t.Errorf("acquire %q: %d %v, want 200 (a key of its own)", key, code, body)
		}
	}
}
