package dashboard

import (
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

func serve(t *testing.T, h http.Handler, method, path string, header http.Header) *http.Response {
	t.Helper()
	req := httptest.NewRequest(method, path, nil)
	for k, vs := range header {
		req.Header[k] = vs
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Result()
}

func TestHandlerRoutes(t *testing.T) {
	t.Parallel()
	h := Handler()
	tests := []struct {
		name, method, path string
		status             int
		contentType        string
		bodyHas            string
	}{
		{"root is the page", "GET", "/", 200, "text/html; charset=utf-8", `id="cards"`},
		{"index.html is the page", "GET", "/index.html", 200, "text/html; charset=utf-8", "<title>sluice dashboard</title>"},
		{"script", "GET", "/static/app.js", 200, "text/javascript; charset=utf-8", "/v1/check"},
		{"stylesheet", "GET", "/static/style.css", 200, "text/css; charset=utf-8", ".card"},
		{"head has no body", "HEAD", "/", 200, "text/html; charset=utf-8", ""},
		{"unknown path", "GET", "/nope", 404, "", "not found"},
		{"no directory listing", "GET", "/static/", 404, "", "not found"},
		{"api paths are not ours", "GET", "/v1/policies", 404, "", "not found"},
		{"post is refused", "POST", "/", 405, "", "method not allowed"},
		{"delete is refused", "DELETE", "/static/app.js", 405, "", "method not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			res := serve(t, h, tt.method, tt.path, nil)
			body, _ := io.ReadAll(res.Body)
			if got, want := res.StatusCode, tt.status; got != want {
				t.Fatalf("status = %d, want %d (body %q)", got, want, body)
			}
			if tt.contentType != "" {
				if got, want := res.Header.Get("Content-Type"), tt.contentType; got != want {
					t.Errorf("Content-Type = %q, want %q", got, want)
				}
			}
			if tt.method == "HEAD" && len(body) != 0 {
				t.Errorf("HEAD returned %d body bytes", len(body))
			}
			if !strings.Contains(string(body), tt.bodyHas) {
				t.Errorf("body does not contain %q", tt.bodyHas)
			}
			if tt.status == 405 {
				if got, want := res.Header.Get("Allow"), "GET, HEAD"; got != want {
					t.Errorf("Allow = %q, want %q", got, want)
				}
			}
			// Security headers go on every response, errors included.
			for k, v := range securityHeaders {
				if got := res.Header.Get(k); got != v {
					t.Errorf("%s = %q, want %q", k, got, v)
				}
			}
		})
	}
}

func TestHandlerRevalidates(t *testing.T) {
	t.Parallel()
	h := Handler()
	for _, path := range []string{"/", "/static/app.js", "/static/style.css"} {
		t.Run(path, func(t *testing.T) {
			t.Parallel()
			res := serve(t, h, "GET", path, nil)
			etag := res.Header.Get("ETag")
			if !regexp.MustCompile(`^"[0-9a-f]{16}"$`).MatchString(etag) {
				t.Fatalf("ETag = %q, want a quoted hash", etag)
			}
			if got, want := res.Header.Get("Cache-Control"), "no-cache"; got != want {
				t.Errorf("Cache-Control = %q, want %q", got, want)
			}
			tests := []struct {
				name        string
				ifNoneMatch string
				status      int
			}{
				{"same version", etag, http.StatusNotModified},
				{"other version", `"0000000000000000"`, http.StatusOK},
			}
			for _, tt := range tests {
				res := serve(t, h, "GET", path, http.Header{"If-None-Match": {tt.ifNoneMatch}})
				if got, want := res.StatusCode, tt.status; got != want {
					t.Errorf("%s: status = %d, want %d", tt.name, got, want)
				}
			}
		})
	}
}

// TestPageIsSelfContained checks what "works offline" needs: every script,
// stylesheet and link the page names is served by the handler, and no asset
// refers to another origin.
func TestPageIsSelfContained(t *testing.T) {
	t.Parallel()
	h := Handler()
	page := serve(t, h, "GET", "/", nil)
	body, _ := io.ReadAll(page.Body)
	refs := regexp.MustCompile(`(?:src|href)="([^"]*)"`).FindAllStringSubmatch(string(body), -1)
	if len(refs) < 2 {
		t.Fatalf("found %d references in the page, want the script and the stylesheet at least", len(refs))
	}
	for _, m := range refs {
		ref := m[1]
		if strings.HasPrefix(ref, "data:") {
			continue
		}
		// Relative, so that the page works mounted under any prefix.
		if !strings.HasPrefix(ref, "static/") {
			t.Errorf("page refers to %q, want a relative static/ path or data: URL", ref)
			continue
		}
		if res := serve(t, h, "GET", "/"+ref, nil); res.StatusCode != http.StatusOK {
			t.Errorf("page refers to %q, which serves %d", ref, res.StatusCode)
		}
	}

	external := regexp.MustCompile(`(?i)(https?:)?//[a-z0-9.-]+\.[a-z]{2,}|@import|url\(\s*['"]?(https?:|//)`)
	err := fs.WalkDir(assets, "assets", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(assets, name)
		if err != nil {
			return err
		}
		for _, m := range external.FindAllString(string(b), -1) {
			// The SVG namespace is an identifier, not something fetched.
			if strings.Contains(m, "www.w3.org") {
				continue
			}
			t.Errorf("%s refers to another origin: %q", name, m)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

func TestLoad(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"assets/index.html":   {Data: []byte("<!doctype html>")},
		"assets/app.js":       {Data: []byte("x")},
		"assets/img/logo.svg": {Data: []byte("<svg/>")},
		"assets/notes.bin":    {Data: []byte{0, 1, 2}},
	}
	files, err := load(fsys)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path, contentType string
	}{
		{"/", "text/html; charset=utf-8"},
		{"/index.html", "text/html; charset=utf-8"},
		{"/static/app.js", "text/javascript; charset=utf-8"},
		{"/static/img/logo.svg", "image/svg+xml"},
		{"/static/notes.bin", "application/octet-stream"},
	}
	for _, tt := range tests {
		a, ok := files[tt.path]
		if !ok {
			t.Errorf("%s not served", tt.path)
			continue
		}
		if got, want := a.contentType, tt.contentType; got != want {
			t.Errorf("%s: content type %q, want %q", tt.path, got, want)
		}
	}
	if got, want := len(files), len(tests); got != want {
		t.Errorf("%d paths served, want %d: %v", got, want, files)
	}
	if files["/static/app.js"].etag == files["/static/img/logo.svg"].etag {
		t.Error("different files share an ETag")
	}
}

func TestLoadError(t *testing.T) {
	t.Parallel()
	if _, err := load(fstest.MapFS{}); err == nil {
		t.Fatal("load of a file system without assets/ succeeded")
	}
}
