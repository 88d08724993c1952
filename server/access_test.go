package server

import (
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/server/config"
)

func TestAPIMutationsJSONOnly(t *testing.T) {
	e := newAPI(t, nil)
	for _, path := range []string{"/v1/check", "/v1/peek", "/v1/reset"} {
		for _, ct := range []string{"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "application/jsonx"} {
			w := e.do(t, "POST", path, `{"policy":"fw","key":"k"}`, map[string]string{"Content-Type": ct}, "")
			if w.Code != http.StatusUnsupportedMediaType || w.Header().Get("Content-Type") != "application/problem+json" {
				t.Errorf("POST %s as %q: %d %s, want 415 problem+json", path, ct, w.Code, w.Body.String())
			}
		}
	}
	// /json takes its body as JSON whatever its type, as envoyproxy/ratelimit
	// does (its documented call is curl --data, a form's type).
	for _, ct := range []string{"application/x-www-form-urlencoded", ""} {
		if w := e.do(t, "POST", "/json", `{"domain":"d","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`, map[string]string{"Content-Type": ct}, ""); w.Code != 200 {
			t.Errorf("POST /json as %q: %d %s, want 200", ct, w.Code, w.Body.String())
		}
	}
	w := e.do(t, "POST", "/v1/check", `{"policy":"fw","key":"k"}`, map[string]string{"Content-Type": "application/json; charset=utf-8"}, "")
	if w.Code != 200 {
		t.Errorf("application/json with a charset: %d %s", w.Code, w.Body.String())
	}
}

// A body the service would read as other than it was sent is refused,
// not decided on: compressed (the gzip bytes are no JSON, and a plain body
// marked compressed is not what its client sent) or in a charset other
// than UTF-8 (keys are compared byte for byte).
func TestAPIBodyEncodingRefused(t *testing.T) {
	base := serveHTTP(t, newAPI(t, nil).svc)
	send := func(path, body string, hdr map[string]string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequest("POST", base+path, strings.NewReader(body))
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
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	io.WriteString(zw, `{"policy":"fw","key":"k"}`)
	zw.Close()
	envoy := `{"domain":"web","descriptors":[{"entries":[{"key":"k","value":"v"}]}]}`
	tests := []struct {
		name, path, body string
		hdr              map[string]string
		detail           string
	}{
		{"gzip", "/v1/check", gz.String(), map[string]string{"Content-Type": "application/json", "Content-Encoding": "gzip"}, "Content-Encoding"},
		{"plain body marked gzip", "/v1/check", `{"policy":"fw","key":"k"}`, map[string]string{"Content-Type": "application/json", "Content-Encoding": "gzip"}, "Content-Encoding"},
		{"two codings", "/v1/reset", `{"policy":"fw","key":"k"}`, map[string]string{"Content-Type": "application/json", "Content-Encoding": "identity, br"}, "Content-Encoding"},
		{"latin-1", "/v1/check", `{"policy":"fw","key":"k"}`, map[string]string{"Content-Type": "application/json; charset=iso-8859-1"}, "UTF-8"},
		{"/json gzip", "/json", envoy, map[string]string{"Content-Encoding": "gzip"}, "Content-Encoding"},
	}
	for _, tt := range tests {
		code, ct, body := send(tt.path, tt.body, tt.hdr)
		if code != http.StatusUnsupportedMediaType || ct != "application/problem+json" || !strings.Contains(body, tt.detail) {
			t.Errorf("%s: %d %s %s, want 415 problem+json naming %s", tt.name, code, ct, body, tt.detail)
		}
	}
	// The identity coding is no coding; UTF-8 is the charset in any case.
	for _, hdr := range []map[string]string{
		{"Content-Type": "application/json", "Content-Encoding": "identity"},
		{"Content-Type": "application/json; charset=UTF-8"},
		{"Content-Type": `application/json; charset="utf-8"`},
		{"Content-Type": "application/json; charset=utf8"},
		{"Content-Type": "application/json; charset=US-ASCII"},
	} {
		if code, _, body := send("/v1/check", `{"policy":"fw","key":"k2"}`, hdr); code == http.StatusUnsupportedMediaType {
			t.Errorf("POST /v1/check with %v: %d %s, want it decided", hdr, code, body)
		}
	}
	// Nothing refused was taken: fw's key k has its whole limit left.
	if _, _, body := send("/v1/peek", `{"policy":"fw","key":"k"}`, map[string]string{"Content-Type": "application/json"}); !strings.Contains(body, `"remaining":3`) {
		t.Errorf("after the refused requests: %s, want the whole limit left", body)
	}
}

// A page on another site cannot make a browser reset or spend limits,
// even on loopback: the browser's Sec-Fetch-Site or Origin gives it away.
func TestAPICrossOriginRefused(t *testing.T) {
	e := newAPI(t, nil)
	for _, hdr := range []map[string]string{
		{"Sec-Fetch-Site": "cross-site"},
		{"Sec-Fetch-Site": "same-site"},
		{"Origin": "https://evil.example"},
	} {
		for _, path := range []string{"/v1/reset", "/v1/check"} {
			w := e.do(t, "POST", path, `{"policy":"fw","key":"k"}`, hdr, "")
			if w.Code != http.StatusForbidden || !strings.Contains(w.Body.String(), "cross-origin") {
				t.Errorf("POST %s with %v: %d %s, want 403", path, hdr, w.Code, w.Body.String())
			}
		}
	}
	// The dashboard itself: same origin.
	if w := e.do(t, "POST", "/v1/reset", `{"policy":"fw","key":"k"}`, map[string]string{"Sec-Fetch-Site": "same-origin"}, ""); w.Code != 204 {
		t.Errorf("same-origin reset: %d %s", w.Code, w.Body.String())
	}
	// Reads stay open to any origin.
	if w := e.do(t, "GET", "/v1/policies", "", map[string]string{"Sec-Fetch-Site": "cross-site"}, ""); w.Code != 200 {
		t.Errorf("cross-site GET: %d", w.Code)
	}
}

func TestAPIBearerSchemeCaseInsensitive(t *testing.T) {
	e := newAPI(t, &HandlerOptions{AdminToken: "s3cret"})
	for _, auth := range []string{"Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR  s3cret"} {
		if w := e.do(t, "POST", "/v1/reset", `{"policy":"fw","key":"k"}`, map[string]string{"Authorization": auth}, "203.0.113.9:5000"); w.Code != 204 {
			t.Errorf("%q: %d %s", auth, w.Code, w.Body.String())
		}
	}
	if w := e.do(t, "POST", "/v1/reset", `{"policy":"fw","key":"k"}`, map[string]string{"Authorization": "Bearers3cret"}, ""); w.Code != 401 {
		t.Errorf("no space after the scheme: %d", w.Code)
	}
}

func TestAPIAdminDisabled(t *testing.T) {
	e := newAPI(t, &HandlerOptions{AdminDisabled: true})
	w := e.do(t, "POST", "/v1/reset", `{"policy":"fw","key":"k"}`, nil, "127.0.0.1:5000")
	if w.Code != 403 || w.Header().Get("Content-Type") != "application/problem+json" ||
		!strings.Contains(w.Body.String(), "--admin-token") || !strings.Contains(w.Body.String(), "--insecure-admin") {
		t.Fatalf("reset with admin disabled: %d %s, want 403 saying how to enable it", w.Code, w.Body.String())
	}
	if got := decodeBody(t, e.do(t, "GET", "/v1/status", "", nil, ""))["admin"]; got != AdminDisabled {
		t.Errorf("status admin %v, want %s (the dashboard hides Reset)", got, AdminDisabled)
	}
	// A token still enables them.
	e = newAPI(t, &HandlerOptions{AdminDisabled: true, AdminToken: "t"})
	if w := e.do(t, "POST", "/v1/reset", `{"policy":"fw","key":"k"}`, map[string]string{"Authorization": "Bearer t"}, "203.0.113.9:5000"); w.Code != 204 {
		t.Errorf("reset with a token: %d", w.Code)
	}
}

func TestAdminMode(t *testing.T) {
	for _, tt := range []struct {
		token, addr string
		insecure    bool
		want        string
	}{
		{"", "127.0.0.1:8080", false, AdminLoopback},
		{"", "[::1]:8080", false, AdminLoopback},
		{"", "localhost:8080", false, AdminLoopback},
		{"", ":8080", false, AdminDisabled},
		{"", "0.0.0.0:8080", false, AdminDisabled},
		{"", "10.1.2.3:8080", false, AdminDisabled},
		{"", ":8080", true, AdminInsecure},
		{"", "127.0.0.1:8080", true, AdminLoopback},
		{"t", ":8080", false, AdminToken},
	} {
		if got := adminMode(tt.token, tt.addr, tt.insecure); got != tt.want {
			t.Errorf("adminMode(%q, %q, %v) = %s, want %s", tt.token, tt.addr, tt.insecure, got, tt.want)
		}
	}
}

func TestAPIDecisionToken(t *testing.T) {
	e := newAPI(t, &HandlerOptions{DecisionToken: "dec", AdminToken: "adm"})
	body := `{"policy":"fw","key":"k"}`
	envoy := `{"domain":"sluice","descriptors":[{"entries":[{"key":"fw","value":"k"}]}]}`
	for _, tt := range []struct {
		path, body, auth string
		code             int
	}{
		{"/v1/check", body, "", 401},
		{"/v1/check", body, "Bearer nope", 403},
		{"/v1/check", body, "Bearer dec", 200},
		{"/v1/check", body, "bearer adm", 200},
		{"/v1/peek", body, "", 401},
		{"/v1/peek", body, "Bearer dec", 200},
		{"/json", envoy, "", 401},
		{"/json", envoy, "Bearer dec", 200},
	} {
		hdr := map[string]string{}
		if tt.auth != "" {
			hdr["Authorization"] = tt.auth
		}
		if w := e.do(t, "POST", tt.path, tt.body, hdr, ""); w.Code != tt.code {
			t.Errorf("%s with %q: %d %s, want %d", tt.path, tt.auth, w.Code, w.Body.String(), tt.code)
		}
	}
	// The decision token is not an admin token.
	if w := e.do(t, "POST", "/v1/reset", body, map[string]string{"Authorization": "Bearer dec"}, ""); w.Code != 403 {
		t.Errorf("reset with the decision token: %d", w.Code)
	}
}

func TestRLSDecisionToken(t *testing.T) {
	svc := newMemService(t, apiConfig, newFakeClock())
	c := serveRLS(t, svc, grpc.ChainUnaryInterceptor(grpcToken("dec")))
	req := rlsRequest(config.DefaultDomain, desc("fw=k"))
	for _, tt := range []struct {
		auth string
		code codes.Code
	}{
		{"", codes.Unauthenticated},
		{"Bearer nope", codes.PermissionDenied},
		{"Bearer dec", codes.OK},
		{"bearer dec", codes.OK},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		if tt.auth != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "authorization", tt.auth)
		}
		_, err := c.ShouldRateLimit(ctx, req)
		cancel()
		if got := status.Code(err); got != tt.code {
			t.Errorf("authorization %q: %v, want %v", tt.auth, err, tt.code)
		}
	}
}

// The demo binds loopback by default; a configuration keeps the wildcard
// defaults; a non-loopback address without a token disables admin.
func TestServerDefaultAddresses(t *testing.T) {
	srv, err := New(Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown(context.Background())
	if srv.opts.HTTPAddr != "127.0.0.1:8080" || srv.opts.GRPCAddr != "127.0.0.1:8081" {
		t.Errorf("demo addresses %s, %s; want 127.0.0.1:8080, 127.0.0.1:8081", srv.opts.HTTPAddr, srv.opts.GRPCAddr)
	}
	srv2, err := New(Options{ConfigFile: "testdata/envoy-example.yaml", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv2.Shutdown(context.Background())
	if srv2.opts.HTTPAddr != ":8080" || srv2.opts.GRPCAddr != ":8081" {
		t.Errorf("addresses with a configuration %s, %s; want :8080, :8081", srv2.opts.HTTPAddr, srv2.opts.GRPCAddr)
	}
}

func TestServerAdminDisabledBeyondLoopback(t *testing.T) {
	var logs syncBuffer
	srv := runServer(t, Options{HTTPAddr: "0.0.0.0:0", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if !strings.Contains(logs.String(), "admin endpoints disabled") {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
	_, port, _ := net.SplitHostPort(srv.HTTPAddr())
	p := &proc{http: "127.0.0.1:" + port}
	if code, body := p.post(t, "/v1/reset", `{"policy":"rl.foo","key":"x"}`); code != 403 || !strings.Contains(body["detail"].(string), "--admin-token") {
		t.Errorf("reset: %d %v, want 403 saying how to enable it", code, body)
	}
	// --insecure-admin keeps the loopback rule.
	srv2 := runServer(t, Options{HTTPAddr: "0.0.0.0:0", InsecureAdmin: true})
	_, port, _ = net.SplitHostPort(srv2.HTTPAddr())
	p = &proc{http: "127.0.0.1:" + port}
	if code, body := p.post(t, "/v1/reset", `{"policy":"`+srv2.Service().Config().Policies[0].Name+`","key":"x"}`); code != 204 {
		t.Errorf("reset with --insecure-admin from loopback: %d %v", code, body)
	}
	if code, body := p.get(t, "/v1/status"); code != 200 || !strings.Contains(body, `"admin":"insecure"`) {
		t.Errorf("status with --insecure-admin beyond loopback: %d %s, want admin insecure", code, body)
	}
}

// A page on a site whose DNS rebinds its name to 127.0.0.1 is same-origin
// to the browser, so CrossOriginProtection lets its requests through, with
// that name as Host. Without an admin token, admin endpoints answer only
// requests addressed to a loopback host; decisions and reads are as before.
func TestAdminRefusesRebindingHost(t *testing.T) {
	// Browser headers of a rebound page, as the page sends them.
	sameOrigin := func(host string) map[string]string {
		return map[string]string{"Origin": "http://" + host, "Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
	}
	send := func(t *testing.T, method, url, host, body string, hdr map[string]string) (int, string, string) {
		t.Helper()
		req, err := http.NewRequest(method, url, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Host = host
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	for _, mode := range []struct {
		name string
		opts Options
	}{
		{AdminLoopback, Options{}},
		{AdminInsecure, Options{HTTPAddr: "0.0.0.0:0", InsecureAdmin: true}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			srv := runServer(t, mode.opts)
			_, port, _ := net.SplitHostPort(srv.HTTPAddr())
			base := "http://127.0.0.1:" + port
			reset := `{"policy":"` + srv.Service().Config().Policies[0].Name + `","key":"victim@example.com"}`
			for _, host := range []string{"evil.example:" + port, "evil.example", "localhost.evil.example:" + port, "127.0.0.1.nip.io:" + port, "10.1.2.3:" + port, "[2001:db8::1]:" + port} {
				code, ct, body := send(t, "POST", base+"/v1/reset", host, reset, sameOrigin(host))
				if code != 403 || ct != "application/problem+json" || !strings.Contains(body, "DNS rebinding") {
					t.Errorf("reset with Host %s: %d %s %s, want 403 problem+json naming DNS rebinding", host, code, ct, body)
				}
				if code, _, body := send(t, "GET", base+"/v1/top", host, "", sameOrigin(host)); code != 403 || strings.Contains(body, "denials") {
					t.Errorf("top with Host %s: %d %s, want 403", host, code, body)
				}
			}
			for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LocalHost:" + port, "localhost.:" + port, "localhost", "127.9.9.9:" + port, "[::1]:" + port, "[::ffff:127.0.0.1]:" + port} {
				if code, _, body := send(t, "POST", base+"/v1/reset", host, reset, sameOrigin(host)); code != 204 {
					t.Errorf("reset with Host %s: %d %s, want 204", host, code, body)
				}
				if code, _, body := send(t, "GET", base+"/v1/top", host, "", nil); code != 200 {
					t.Errorf("top with Host %s: %d %s, want 200", host, code, body)
				}
			}
			// Only admin endpoints check the Host.
			if code, _, body := send(t, "GET", base+"/v1/status", "evil.example:"+port, "", sameOrigin("evil.example:"+port)); code != 200 {
				t.Errorf("status with a foreign Host: %d %s, want 200", code, body)
			}
		})
	}
	// A token authorizes whatever the Host: a proxy may forward any name.
	srv := runServer(t, Options{AdminToken: "adm"})
	_, port, _ := net.SplitHostPort(srv.HTTPAddr())
	reset := `{"policy":"` + srv.Service().Config().Policies[0].Name + `","key":"k"}`
	if code, _, body := send(t, "POST", "http://127.0.0.1:"+port+"/v1/reset", "sluice.example.com", reset, map[string]string{"Authorization": "Bearer adm"}); code != 204 {
		t.Errorf("reset with the admin token and a foreign Host: %d %s, want 204", code, body)
	}
}

func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"localhost": true, "localhost:8080": true, "LOCALHOST:1": true, "localhost.": true, "localhost.:80": true,
		"127.0.0.1": true, "127.0.0.1:8080": true, "127.255.0.9:1": true, "[::1]": true, "[::1]:8080": true, "[::ffff:127.0.0.1]:80": true,
		"": false, "evil.example": false, "evil.example:8080": false, "localhost.evil.example": false, "sub.localhost": false,
		"127.0.0.1.evil.example": false, "127.1": false, "0x7f000001": false, "[::2]:80": false, "10.0.0.1": false, "[": false, "[]": false,
	} {
		if got := loopbackHost(host); got != want {
			t.Errorf("loopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}
