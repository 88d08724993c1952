package server

import (
	"context"
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
