package server

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// rawDo sends one request as written, path and all, over its own
// connection (no client cleans the path or follows a redirect), and
// returns the response and its body.
func rawDo(t *testing.T, addr, method, path, body string) (*http.Response, string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	req := fmt.Sprintf("%s %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n", method, path, addr)
	if body != "" {
		req += fmt.Sprintf("Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	if _, err := io.WriteString(c, req+"\r\n"+body); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), &http.Request{Method: method})
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

// An endpoint asked for on a path that is not its own (//v1/check,
// /v1/./reset, /v1) is a 404 problem naming the path to send, not
// ServeMux's 307 redirect as text/html: nothing is decided or reset
// through it, and the metrics do not count it under the endpoint. The
// dashboard's pages, /metrics and the API on their own paths still
// answer; an unclean dashboard path keeps its redirect, for browsers. A
// `sluice serve` process, asked by a client that sends paths as written
// and follows no redirect.
func TestUncleanPathsAreProblems(t *testing.T) {
	p := startSluice(t, nil, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
	check := `{"policy":"sliding_window_log","key":"unclean"}`
	remaining := func(what string, want int64) {
		t.Helper()
		resp, body := rawDo(t, p.http, "POST", "/v1/check", check)
		var got checkResponse
		if err := json.Unmarshal([]byte(body), &got); resp.StatusCode != 200 || err != nil || got.Remaining != want {
			t.Fatalf("%s: POST /v1/check: %d %q, want 200 with remaining %d", what, resp.StatusCode, body, want)
		}
	}
	remaining("first", 4)

	for _, tt := range []struct {
		method, path, body, want string
	}{
		{"POST", "//v1/check", check, "no such endpoint: //v1/check: a path is taken as sent, neither cleaned nor redirected: send /v1/check"},
		{"POST", "/v1/./check", check, "send /v1/check"},
		{"POST", "/v1//check", check, "send /v1/check"},
		{"POST", "/v1/x/../check", check, "send /v1/check"},
		{"POST", "/./v1/peek", check, "send /v1/peek"},
		{"POST", "//v1/reset", check, "send /v1/reset"},
		{"POST", "/v1/./reset", check, "send /v1/reset"},
		{"POST", "//json", `{"domain":"sluice","descriptors":[{"entries":[{"key":"policy","value":"sliding_window_log"},{"key":"key","value":"unclean"}]}]}`, "send /json"},
		{"GET", "/v1", "", "no such endpoint: /v1: a path is taken as sent, neither cleaned nor redirected: send /v1/"},
		{"POST", "/v1", check, "send /v1/"},
		{"HEAD", "/v1", "", ""},
		{"GET", "//v1/", "", "send /v1/"},
		{"GET", "/v1//status", "", "send /v1/status"},
		{"GET", "/v1/./openapi.json", "", "send /v1/openapi.json"},
		{"GET", "/v1/./nope", "", "no such endpoint: /v1/./nope: a path is taken as sent, neither cleaned nor redirected: GET /v1/ lists the endpoints"},
		{"GET", "/v1/../index.html", "", "GET /v1/ lists the endpoints"},
		{"GET", "//healthz", "", "send /healthz"},
		{"GET", "/./readyz", "", "send /readyz"},
		{"GET", "//metrics", "", "send /metrics"},
		{"GET", "//v1/" + strings.Repeat("x", 5000), "", "(5005 bytes)"},
	} {
		what := tt.method + " " + clip(tt.path, 30)
		resp, body := rawDo(t, p.http, tt.method, tt.path, tt.body)
		resp.Request = &http.Request{Method: tt.method}
		checkProblem(t, what, resp, body, http.StatusNotFound, tt.want)
		if loc := resp.Header.Get("Location"); loc != "" {
			t.Errorf("%s: Location %q: no endpoint is redirected", what, loc)
		}
	}
	// The checks sent on other paths took nothing, the resets reset
	// nothing.
	remaining("after the checks and resets on unclean paths", 3)

	// What is there still answers, on its own path.
	for _, tt := range []struct{ path, ctype, has string }{
		{"/", "text/html; charset=utf-8", "<html"},
		{"/index.html", "text/html; charset=utf-8", "<html"},
		{"/static/app.js", "text/javascript; charset=utf-8", ""},
		{"/metrics", "", "sluice_"},
		{"/healthz", "text/plain; charset=utf-8", "ok"},
		{"/v1/", "application/json", "openapi"},
	} {
		resp, body := rawDo(t, p.http, "GET", tt.path, "")
		if resp.StatusCode != 200 || (tt.ctype != "" && resp.Header.Get("Content-Type") != tt.ctype) || !strings.Contains(body, tt.has) {
			t.Errorf("GET %s: %d %s %.100q, want 200 %s with %q", tt.path, resp.StatusCode, resp.Header.Get("Content-Type"), body, tt.ctype, tt.has)
		}
	}
	// The dashboard's pages keep ServeMux's redirect, which browsers follow.
	for path, to := range map[string]string{"//index.html": "/index.html", "/static/./app.js": "/static/app.js"} {
		if resp, _ := rawDo(t, p.http, "GET", path, ""); resp.StatusCode != http.StatusTemporaryRedirect || resp.Header.Get("Location") != to {
			t.Errorf("GET %s: %d to %q, want the dashboard's redirect to %s", path, resp.StatusCode, resp.Header.Get("Location"), to)
		}
	}

	// No request on another path is counted under an endpoint.
	_, metrics := rawDo(t, p.http, "GET", "/metrics", "")
	for _, line := range strings.Split(metrics, "\n") {
		if strings.HasPrefix(line, "sluice_api_request") && (strings.Contains(line, `code="307"`) && !strings.Contains(line, `endpoint="/"`) ||
			strings.Contains(line, `code="404"`) && !strings.Contains(line, `endpoint="other"`)) {
			t.Errorf("metrics: %s", line)
		}
	}
}
