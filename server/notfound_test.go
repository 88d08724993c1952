package server

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// A custom dashboard (Options.Dashboard, HandlerOptions.Dashboard) is an
// application of its own: every method on its paths is served to it and
// its answer stands, its own 404 and 405 included (a form's POST / runs
// once and is answered 201, not 405); it sees each request sent, once, and
// no other; its writer is an http.Flusher, so it can stream server-sent
// events. The API's paths stay the API's. Both through a Server and
// through Service.Handler, on real listeners.
func TestCustomDashboardOwnsItsPaths(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	var actions atomic.Int64
	sent := make(chan struct{})
	dash := http.NewServeMux()
	dash.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "<form method=post>") })
	dash.HandleFunc("POST /{$}", func(w http.ResponseWriter, r *http.Request) {
		actions.Add(1)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "saved")
	})
	dash.HandleFunc("GET /custom", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "custom page") })
	dash.HandleFunc("GET /events", func(w http.ResponseWriter, r *http.Request) {
		f, ok := w.(http.Flusher)
		if !ok {
			http.Error(w, "no http.Flusher", http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: 1\n\n")
		f.Flush()
		select { // the client must have read the first event before the handler ends
		case <-sent:
		case <-time.After(5 * time.Second):
			return
		}
		io.WriteString(w, "data: 2\n\n")
		if err := http.NewResponseController(w).Flush(); err != nil {
			t.Errorf("ResponseController.Flush: %v", err)
		}
	})
	logged := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		dash.ServeHTTP(w, r)
	})

	srv := runServer(t, Options{Dashboard: logged})
	hs := httptest.NewServer(newMemService(t, apiConfig, newFakeClock()).Handler(&HandlerOptions{Dashboard: logged}))
	t.Cleanup(hs.Close)
	for _, base := range []string{"http://" + srv.HTTPAddr(), hs.URL} {
		mu.Lock()
		seen = nil
		mu.Unlock()
		actions.Store(0)
		var sentReqs []string
		for _, tt := range []struct {
			method, path string
			code         int
			ctype, body  string
		}{
			{"GET", "/", 200, "", "<form method=post>"},
			{"POST", "/", 201, "", "saved"},
			{"HEAD", "/", 200, "", ""},
			{"GET", "/custom", 200, "", "custom page"},
			// Its own 405 and 404, as ServeMux writes them.
			{"PUT", "/custom", 405, "text/plain; charset=utf-8", "Method Not Allowed"},
			{"DELETE", "/", 405, "text/plain; charset=utf-8", "Method Not Allowed"},
			{"GET", "/other", 404, "text/plain; charset=utf-8", "404 page not found"},
			{"POST", "/static/none.js", 404, "text/plain; charset=utf-8", "404 page not found"},
		} {
			what := base + ": " + tt.method + " " + tt.path
			resp, body := httpDo(t, tt.method, base+tt.path, nil)
			sentReqs = append(sentReqs, tt.method+" "+tt.path)
			if resp.StatusCode != tt.code || (tt.ctype != "" && resp.Header.Get("Content-Type") != tt.ctype) || !strings.Contains(body, tt.body) {
				t.Errorf("%s: %d %s %q, want the dashboard's own %d %s %q", what, resp.StatusCode, resp.Header.Get("Content-Type"), body, tt.code, tt.ctype, tt.body)
			}
			if tt.code == 405 && !strings.Contains(resp.Header.Get("Allow"), "GET") {
				t.Errorf("%s: Allow %q, want the dashboard's", what, resp.Header.Get("Allow"))
			}
		}
		if n := actions.Load(); n != 1 {
			t.Errorf("%s: the POST / action ran %d times, want 1", base, n)
		}
		mu.Lock()
		if !slices.Equal(seen, sentReqs) {
			t.Errorf("%s: the dashboard was asked\n%q\nwant the requests sent, and only them:\n%q", base, seen, sentReqs)
		}
		mu.Unlock()

		// The API's paths are not the dashboard's.
		resp, body := httpDo(t, "GET", base+"/v1/nope", nil)
		checkProblem(t, base+": GET /v1/nope", resp, body, 404, "no such endpoint: /v1/nope")
		resp, body = httpDo(t, "POST", base+"/healthz", nil)
		checkProblem(t, base+": POST /healthz", resp, body, 405, "use GET for /healthz, not POST")

		// Server-sent events: the first arrives while the handler still runs.
		resp, err := http.Get(base + "/events")
		if err != nil {
			t.Fatal(err)
		}
		br := bufio.NewReader(resp.Body)
		line, err := br.ReadString('\n')
		if resp.StatusCode != 200 || line != "data: 1\n" {
			t.Errorf("%s: GET /events: %d, first line %q (%v), want 200 and data: 1 streamed", base, resp.StatusCode, line, err)
		}
		select {
		case sent <- struct{}{}:
		case <-time.After(time.Second): // the handler has given up
		}
		rest, _ := io.ReadAll(br)
		resp.Body.Close()
		if !strings.Contains(string(rest), "data: 2") {
			t.Errorf("%s: GET /events: rest %q, want data: 2", base, rest)
		}
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
