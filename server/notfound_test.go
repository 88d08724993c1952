package server

import (
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
)

// httpDo sends one request to base+path and returns the response and its
// body.
func httpDo(t *testing.T, method, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
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

// checkProblem fails unless the response is a problem+json of status
// code whose detail contains want.
func checkProblem(t *testing.T, what string, resp *http.Response, body string, code int, want string) {
	t.Helper()
	if resp.StatusCode != code || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Errorf("%s: %d %s %.300q, want %d application/problem+json", what, resp.StatusCode, resp.Header.Get("Content-Type"), body, code)
		return
	}
	if resp.Request.Method == http.MethodHead {
		return
	}
	var p struct {
		Status int    `json:"status"`
		Title  string `json:"title"`
		Detail string `json:"detail"`
	}
	if err := json.Unmarshal([]byte(body), &p); err != nil || p.Status != code || p.Title != http.StatusText(code) || !strings.Contains(p.Detail, want) {
		t.Errorf("%s: body %.300q, want a problem of status %d whose detail has %q", what, body, code, want)
	}
	if len(p.Detail) > 200 {
		t.Errorf("%s: detail of %d bytes: it must not grow with the path", what, len(p.Detail))
	}
}

// TestUnknownPathsAreProblems: a `sluice serve` process answers every 404
// and 405 as a problem+json, outside /v1/ too (/nope, /json/, a file the
// dashboard lacks), where they were the dashboard's text/plain; the
// dashboard's files, /healthz, /readyz, /metrics and the API still
// answer as before.
func TestUnknownPathsAreProblems(t *testing.T) {
	p := startSluice(t, nil, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
	base := "http://" + p.http
	long := "/" + strings.Repeat("x", 5000)
	for _, tt := range []struct {
		method, path string
		code         int
		want         string
	}{
		{"GET", "/nope", 404, "no such page or endpoint: /nope"},
		{"POST", "/nope", 404, "/nope"},
		{"HEAD", "/nope", 404, ""},
		{"GET", "/json/", 404, "/json/"},
		{"GET", "/healthz/", 404, "/healthz/"},
		{"GET", "/metrics/x", 404, "/metrics/x"},
		{"GET", "/static/nope.js", 404, "/static/nope.js"},
		{"GET", "/index.htm", 404, "/index.htm"},
		{"GET", long, 404, "(5001 bytes)"},
		{"GET", "/v1/nothing", 404, "no such endpoint: /v1/nothing"},
		{"GET", "/v1" + long, 404, "(5004 bytes)"},
		{"PUT", "/static/app.js", 405, "use GET for /static/app.js, not PUT"},
		{"DELETE", "/index.html", 405, "use GET"},
		{"POST", "/", 405, "use GET"},
		{"GET", "/json", 405, "use POST"},
		{"POST", "/healthz", 405, "use GET"},
		{"POST", "/metrics", 405, "use GET"},
	} {
		resp, body := httpDo(t, tt.method, base+tt.path, nil)
		checkProblem(t, tt.method+" "+clip(tt.path, 20), resp, body, tt.code, tt.want)
	}
	// What is there still answers.
	for _, tt := range []struct{ path, ctype, has string }{
		{"/", "text/html; charset=utf-8", "<html"},
		{"/index.html", "text/html; charset=utf-8", "<html"},
		{"/static/app.js", "text/javascript; charset=utf-8", ""},
		{"/static/style.css", "text/css; charset=utf-8", ""},
		{"/healthz", "text/plain; charset=utf-8", "ok"},
		{"/readyz", "", ""},
		{"/metrics", "", "sluice_"},
		{"/v1/", "application/json", "openapi"},
		{"/v1/openapi.json", "", "openapi"},
	} {
		resp, body := httpDo(t, "GET", base+tt.path, nil)
		if resp.StatusCode != 200 || (tt.ctype != "" && resp.Header.Get("Content-Type") != tt.ctype) || !strings.Contains(body, tt.has) {
			t.Errorf("GET %s: %d %s %.100q, want 200 %s with %q", tt.path, resp.StatusCode, resp.Header.Get("Content-Type"), body, tt.ctype, tt.has)
		}
		if etag := resp.Header.Get("ETag"); etag != "" {
			if again, _ := httpDo(t, "GET", base+tt.path, map[string]string{"If-None-Match": etag}); again.StatusCode != http.StatusNotModified {
				t.Errorf("GET %s with its ETag: %d, want 304", tt.path, again.StatusCode)
			}
		}
	}
}

// A dashboard of the embedder's own (Options.Dashboard) keeps its pages,
// and its 404 and 405 become problems too, its Allow kept.
func TestCustomDashboardErrorsAreProblems(t *testing.T) {
	dash := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/custom" && r.Method == http.MethodGet:
			io.WriteString(w, "custom page")
		case r.URL.Path == "/custom":
			w.Header().Set("Allow", "GET")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		case r.URL.Path == "/bare":
			w.WriteHeader(http.StatusMethodNotAllowed)
		default:
			http.NotFound(w, r)
		}
	})
	srv := runServer(t, Options{Dashboard: dash})
	base := "http://" + srv.HTTPAddr()
	if resp, body := httpDo(t, "GET", base+"/custom", nil); resp.StatusCode != 200 || body != "custom page" {
		t.Errorf("GET /custom: %d %q", resp.StatusCode, body)
	}
	resp, body := httpDo(t, "PUT", base+"/custom", nil)
	checkProblem(t, "PUT /custom", resp, body, 405, "use GET for /custom, not PUT")
	if resp.Header.Get("Allow") != "GET" {
		t.Errorf("PUT /custom: Allow %q, want the dashboard's GET", resp.Header.Get("Allow"))
	}
	resp, body = httpDo(t, "PUT", base+"/bare", nil)
	checkProblem(t, "PUT /bare", resp, body, 405, "PUT is not allowed for /bare")
	resp, body = httpDo(t, "GET", base+"/other", nil)
	checkProblem(t, "GET /other", resp, body, 404, "/other")
	// A page path it has nothing at is 404 for any method.
	resp, body = httpDo(t, "POST", base+"/static/none.js", nil)
	checkProblem(t, "POST /static/none.js", resp, body, 404, "no such page or endpoint: /static/none.js")
}

// TestCustomDashboardSeesOnlyRealRequests: telling a page the dashboard
// lacks (404) from one it has (405 for a method other than GET or HEAD)
// sends it no request of the server's own: it sees each request sent, once,
// as sent. Its answer to another method on a page path, even 200 or none,
// becomes the 405.
func TestCustomDashboardSeesOnlyRealRequests(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	dash := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		switch r.URL.Path {
		case "/", "/static/app.js", "/custom":
			io.WriteString(w, "page") // whatever the method, as http.FileServer does
		case "/static/empty.js":
		default:
			http.NotFound(w, r)
		}
	})
	srv := runServer(t, Options{Dashboard: dash})
	base := "http://" + srv.HTTPAddr()
	var sent []string
	for _, tt := range []struct {
		method, path string
		code         int
		want         string
	}{
		{"GET", "/", 200, ""},
		{"HEAD", "/", 200, ""},
		{"POST", "/", 405, "use GET for /, not POST"},
		{"OPTIONS", "/static/app.js", 405, "use GET for /static/app.js, not OPTIONS"},
		{"DELETE", "/static/empty.js", 405, "use GET for /static/empty.js, not DELETE"},
		{"POST", "/static/none.js", 404, "no such page or endpoint: /static/none.js"},
		{"PUT", "/static/", 404, "no such page or endpoint: /static/"},
		{"HEAD", "/index.html", 404, ""},
		{"PUT", "/custom", 200, ""}, // not a page path: its answer stands
		{"GET", "/other", 404, "no such page or endpoint: /other"},
	} {
		resp, body := httpDo(t, tt.method, base+tt.path, nil)
		sent = append(sent, tt.method+" "+tt.path)
		what := tt.method + " " + tt.path
		if tt.code != 200 {
			checkProblem(t, what, resp, body, tt.code, tt.want)
		} else if resp.StatusCode != 200 {
			t.Errorf("%s: %d %q, want the dashboard's 200", what, resp.StatusCode, body)
		}
		if allow := resp.Header.Get("Allow"); tt.code == 405 && allow != "GET, HEAD" {
			t.Errorf("%s: Allow %q, want GET, HEAD", what, allow)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(seen, sent) {
		t.Errorf("the dashboard was asked\n%q\nwant the requests sent, and only them:\n%q", seen, sent)
	}
}

// A path that does not exist is 404 whatever the method (the dashboard's
// paths included: a wrong method is 405 only on a page or file it has),
// and a 404 names the path as requested, escaped: /v1%2fcheck is not
// /v1/check, which exists. A `sluice serve` process.
func TestNotFoundWhateverTheMethod(t *testing.T) {
	p := startSluice(t, nil, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
	base := "http://" + p.http
	for _, m := range []string{"OPTIONS", "POST", "PUT", "DELETE", "PATCH", "GET", "HEAD"} {
		for _, path := range []string{"/static/nope.js", "/static/", "/static/app.js/x", "/nope"} {
			resp, body := httpDo(t, m, base+path, nil)
			checkProblem(t, m+" "+path, resp, body, 404, "no such page or endpoint: "+path)
			if allow := resp.Header.Get("Allow"); allow != "" {
				t.Errorf("%s %s: Allow %q on a 404", m, path, allow)
			}
		}
	}
	// What is there still gets 405, its Allow naming GET and HEAD.
	for _, tt := range []struct{ method, path string }{{"OPTIONS", "/static/app.js"}, {"POST", "/"}, {"DELETE", "/index.html"}, {"PUT", "/static/style.css"}} {
		resp, body := httpDo(t, tt.method, base+tt.path, nil)
		checkProblem(t, tt.method+" "+tt.path, resp, body, 405, "use GET for "+tt.path+", not "+tt.method)
		if allow := resp.Header.Get("Allow"); allow != "GET, HEAD" {
			t.Errorf("%s %s: Allow %q, want GET, HEAD", tt.method, tt.path, allow)
		}
	}
	// The path as requested, escaped, and clipped when long.
	long := "/v1%2f" + strings.Repeat("x", 5000)
	for _, tt := range []struct{ method, path, want string }{
		{"GET", "/v1%2fcheck", "no such page or endpoint: /v1%2fcheck: "},
		{"POST", "/v1%2fcheck", "no such page or endpoint: /v1%2fcheck: "},
		{"GET", "/static%2fapp.jsx", "no such page or endpoint: /static%2fapp.jsx: "},
		{"GET", "/v1/no%2fsuch", "no such endpoint: /v1/no%2fsuch: "},
		{"GET", "/%C3%BCber", "no such page or endpoint: /%C3%BCber: "},
		{"GET", long, "no such page or endpoint: /v1%2fxxx"},
		{"GET", long, "(5006 bytes)"},
		{"POST", "/healthz%2f", "/healthz%2f"},
	} {
		resp, body := httpDo(t, tt.method, base+tt.path, nil)
		checkProblem(t, tt.method+" "+clip(tt.path, 20), resp, body, 404, tt.want)
	}
}
