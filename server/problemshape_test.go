package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestProblemShapes: answers to hostile or mistaken requests, over a real
// listener, are problem+json, bounded, and name what was wrong.
func TestProblemShapes(t *testing.T) {
	file := writeConfig(t, "domain: d\ndescriptors:\n  - key: remote_address\n    rate_limit: {unit: second, requests_per_unit: 100}\n---\npolicies:\n  - name: p\n    limit: 10/s\n")
	srv := startServer(t, Options{ConfigFile: file, WatchInterval: -1})
	t.Cleanup(func() { srv.Shutdown(t.Context()) })
	base := "http://" + srv.HTTPAddr()
	for _, tt := range []struct {
		name, method, path, body string
		code                     int
		detail                   string
	}{
		{"long unknown policy", "POST", "/v1/check", `{"policy":"` + strings.Repeat("n", 60000) + `","key":"k"}`, 404, `there is no policy "` + strings.Repeat("n", 64) + `"…(60000 bytes):`},
		{"64-byte unknown policy", "POST", "/v1/check", `{"policy":"` + strings.Repeat("n", 64) + `","key":"k"}`, 404, `there is no policy "` + strings.Repeat("n", 64) + `": GET`},
		{"65-byte unknown policy", "POST", "/v1/check", `{"policy":"` + strings.Repeat("n", 65) + `","key":"k"}`, 404, `there is no policy "` + strings.Repeat("n", 64) + `"…(65 bytes): GET`},
		{"reset without a policy", "POST", "/v1/reset", `{"key":"k"}`, 400, "policy is required"},
		{"lower-case escape", "POST", "/v1/check", `{"policy":"d.remote_address","key":"remote_address=a%2cb"}`, 400, `escape "%2c" must be written in upper case, "%2C"`},
		{"bad escape", "POST", "/v1/check", `{"policy":"d.remote_address","key":"remote_address=a%zz"}`, 400, `"%zz" is not an escape`},
		{"lone surrogate", "POST", "/json", `{"domain":"d","descriptors":[{"entries":[{"key":"remote_address","value":"\ud800"}]}]}`, 400, `\ud800 at byte 74 is half of a UTF-16 surrogate pair`},
		{"POST to the dashboard", "POST", "/", `{}`, 405, "use GET for /, not POST"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			req, _ := http.NewRequest(tt.method, base+tt.path, strings.NewReader(tt.body))
			req.Header.Set("Content-Type", "application/json")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			var p struct{ Detail string }
			json.Unmarshal(b, &p)
			if resp.StatusCode != tt.code || resp.Header.Get("Content-Type") != "application/problem+json" || !strings.Contains(p.Detail, tt.detail) || len(b) > 1000 {
				t.Errorf("%d %s (%d bytes) %.300s; want %d problem+json saying %q", resp.StatusCode, resp.Header.Get("Content-Type"), len(b), b, tt.code, tt.detail)
			}
		})
	}
}
