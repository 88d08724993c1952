// Package dashboard serves sluice's live dashboard: an overview of all
// traffic (decisions per second, denied share, per-policy latency, store
// health, configuration, top keys; the fleet's when instances share Redis)
// above a playground of one card per policy with Send Request, Burst 10 and
// Reset this key, each response shown as it arrives, and a chart of allowed
// vs denied decisions per policy.
//
// The page is plain HTML, CSS and JavaScript embedded in the binary: no CDN,
// no web fonts, no build step, so it works offline and behind strict
// networks. It talks only to the service's JSON API on the same origin:
//
//	GET  /v1/policies   the cards
//	POST /v1/check      Send Request and Burst 10 (cost 1)
//	POST /v1/peek       the "remaining now" line of each card
//	POST /v1/reset      Reset this key (admin: an optional bearer token,
//	                    sent with every request, as is a decision token)
//	GET  /v1/stats      the overview and the charts, polled every two
//	                    seconds; a new config_version reloads the cards
//	GET  /v1/status     the health banner (not ready, degraded), a
//	                    rejected reload's warning and whether Reset is
//	                    shown
//	GET  /v1/top        the top keys, after each poll (admin)
//
// Mount Handler at "/" beside the API; the API's more specific patterns win.
// The page names its assets and the API by relative URLs, so the pair also
// works under a path prefix (http.StripPrefix), opened at the prefix's
// trailing slash.
package dashboard

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"io/fs"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed assets
var assets embed.FS

// securityHeaders are sent with every response. The CSP allows only this
// origin, which also proves in the browser test that nothing is fetched from
// elsewhere: a CDN link would be blocked and break the page.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; " +
		"img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	"X-Content-Type-Options": "nosniff",
	"Referrer-Policy":        "no-referrer",
	"X-Frame-Options":        "DENY",
}

// contentTypes is fixed here rather than taken from the mime package, whose
// answers depend on the host's mime.types files.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".svg":  "image/svg+xml",
}

type asset struct {
	body        []byte
	contentType string
	etag        string
}

type handler struct {
	files map[string]asset // by URL path
}

// Handler returns the dashboard: "/" (and "/index.html") serve the page and
// "/static/..." its scripts and styles. Other paths get 404, methods other
// than GET and HEAD get 405. Responses carry a strong ETag and "no-cache",
// so browsers revalidate cheaply and never run a stale script after an
// upgrade.
func Handler() http.Handler {
	files, err := load(assets)
	if err != nil {
		// The assets are compiled in; a failure here is a build defect that
		// the package tests catch, so serve the error rather than panic.
		return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			http.Error(w, "dashboard: "+err.Error(), http.StatusInternalServerError)
		})
	}
	return &handler{files: files}
}

// IsBuiltin reports whether h is the dashboard Handler returns, whose
// paths and methods the server knows.
func IsBuiltin(h http.Handler) bool {
	_, ok := h.(*handler)
	return ok
}

// load reads every embedded file once and keys it by the URL it is served at.
func load(fsys fs.FS) (map[string]asset, error) {
	files := make(map[string]asset)
	err := fs.WalkDir(fsys, "assets", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		ct, ok := contentTypes[path.Ext(name)]
		if !ok {
			ct = http.DetectContentType(body)
		}
		a := asset{body: body, contentType: ct, etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		rel := strings.TrimPrefix(name, "assets/")
		if rel == "index.html" {
			files["/"] = a
			files["/index.html"] = a
		} else {
			files["/static/"+rel] = a
		}
		return nil
	})
	return files, err
}

func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	for k, v := range securityHeaders {
		w.Header().Set(k, v)
	}
	a, ok := h.files[r.URL.Path]
	if !ok {
		http.NotFound(w, r)
		return
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "dashboard: method not allowed", http.StatusMethodNotAllowed)
		return
	}
	w.Header().Set("Content-Type", a.contentType)
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("ETag", a.etag)
	// ServeContent answers If-None-Match with 304, HEAD and Range requests.
	http.ServeContent(w, r, "", time.Time{}, bytes.NewReader(a.body))
}
