package server

import (
	"context"
	"crypto/subtle"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Admin modes: how admin endpoints (reset) decide who may call them.
const (
	// AdminToken: the admin token, as "Authorization: Bearer <token>".
	AdminToken = "token"
	// AdminLoopback: without a token, clients connected from a loopback
	// address (the peer address; forwarding headers are not trusted).
	AdminLoopback = "loopback"
	// AdminInsecure: the loopback rule kept by --insecure-admin while
	// other hosts can reach the port (a local proxy passes for loopback).
	AdminInsecure = "insecure"
	// AdminDisabled: nobody (403). The Server's choice when it listens
	// beyond loopback without an admin token.
	AdminDisabled = "disabled"
)

// adminMode is the admin rule for a server listening on httpAddr.
// Without a token, the loopback rule holds only while no other host can
// reach the port; insecure keeps it anyway (a proxy on the same host then
// passes for loopback).
func adminMode(token, httpAddr string, insecure bool) string {
	switch {
	case token != "":
		return AdminToken
	case loopbackOnly(httpAddr):
		return AdminLoopback
	case insecure:
		return AdminInsecure
	}
	return AdminDisabled
}

// loopbackOnly reports whether addr (host:port) can be reached from this
// host only: a loopback IP, or "localhost".
func loopbackOnly(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// bearer returns the token of an "Authorization: Bearer <token>" value;
// the scheme is case-insensitive (RFC 9110, section 11.1).
func bearer(auth string) (string, bool) {
	scheme, token, ok := strings.Cut(strings.TrimSpace(auth), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	token = strings.TrimSpace(token)
	return token, token != ""
}

// tokenMatches compares in constant time, so timing tells nothing of a
// token; any of tokens matches.
func tokenMatches(got string, tokens ...string) bool {
	ok := false
	for _, t := range tokens {
		if t != "" && subtle.ConstantTimeCompare([]byte(got), []byte(t)) == 1 {
			ok = true
		}
	}
	return ok
}

// admin applies the admin rule; on refusal it answers and returns false.
func (a *api) admin(w http.ResponseWriter, r *http.Request) bool {
	switch a.adminMode {
	case AdminDisabled:
		problem(w, http.StatusForbidden, "admin endpoints are disabled: this server listens beyond loopback without an admin token; "+
			"start it with --admin-token (SLUICE_ADMIN_TOKEN), or with --insecure-admin to allow loopback clients without one")
		return false
	case AdminToken:
		return a.authorize(w, r, "admin endpoint", a.token)
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		problem(w, http.StatusForbidden, "admin endpoint: without an admin token only loopback clients may call it")
		return false
	}
	// A loopback peer is not enough: a page on another site whose name
	// its DNS rebinds to 127.0.0.1 is same-origin to the browser, which
	// sends its requests here with that name as Host.
	if !loopbackHost(r.Host) {
		problem(w, http.StatusForbidden, "admin endpoint: without an admin token the request must be addressed to a loopback host "+
			"(localhost, 127.0.0.1 or [::1], any port); a request from loopback naming another host is refused "+
			"as a DNS rebinding attack may send it: call the server by its loopback address, or set --admin-token")
		return false
	}
	return true
}

// loopbackHost reports whether a Host header (host or host:port) names
// this host by loopback alone: localhost, or a loopback IP literal. No
// name that a DNS server answers for, which an attacker could rebind.
func loopbackHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	} else if len(host) > 2 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.WithZone("").Unmap().IsLoopback()
}

// decision applies the decision token, when one is set. The admin token
// is accepted too: whoever may reset may also decide.
func (a *api) decision(w http.ResponseWriter, r *http.Request) bool {
	if a.decisionToken == "" {
		return true
	}
	return a.authorize(w, r, "decision endpoint", a.decisionToken, a.token)
}

func (a *api) authorize(w http.ResponseWriter, r *http.Request, what string, tokens ...string) bool {
	got, ok := bearer(r.Header.Get("Authorization"))
	if !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
		problem(w, http.StatusUnauthorized, what+": send Authorization: Bearer <token>")
		return false
	}
	if !tokenMatches(got, tokens...) {
		problem(w, http.StatusForbidden, what+": wrong token")
		return false
	}
	return true
}

// jsonOnly refuses a request body that is not declared application/json
// with 415: a browser sends text/plain or a form across sites without
// asking, never JSON.
func jsonOnly(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		mt, params, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			w.Header().Set("Accept-Post", "application/json")
			problem(w, http.StatusUnsupportedMediaType, "send the body as Content-Type: application/json")
			return
		}
		// JSON is UTF-8 (RFC 8259): a body in another charset would be read
		// as UTF-8 all the same, its keys other bytes than the client's.
		// "utf8", a common misspelling, and US-ASCII, a subset, read alike.
		if cs, ok := params["charset"]; ok && !utf8Charset(cs) {
			w.Header().Set("Accept-Post", "application/json")
			problem(w, http.StatusUnsupportedMediaType, "charset "+clipQuoted(cs, logClip)+": send the body in UTF-8 (application/json; charset=utf-8, or no charset)")
			return
		}
		if !unencoded(w, r) {
			return
		}
		next(w, r)
	}
}

// unencoded refuses a body sent with a content coding (gzip, br...) with
// 415 and Accept-Encoding: identity (RFC 9110, 15.5.16), and reports
// whether the body may be read. The service decodes none: a compressed
// body would be read as its compressed bytes, and a plain one marked
// compressed is not what its client meant to send.
// utf8Charset reports whether a body in charset cs reads as UTF-8.
func utf8Charset(cs string) bool {
	for _, c := range []string{"utf-8", "utf8", "us-ascii"} {
		if strings.EqualFold(cs, c) {
			return true
		}
	}
	return false
}

func unencoded(w http.ResponseWriter, r *http.Request) bool {
	for _, v := range r.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
				w.Header().Set("Accept-Encoding", "identity")
				problem(w, http.StatusUnsupportedMediaType, "Content-Encoding "+clipQuoted(c, logClip)+": send the body uncompressed, without Content-Encoding")
				return false
			}
		}
	}
	return true
}

// crossOrigin refuses unsafe requests (POST...) a browser sends from
// another origin, with a problem+json 403; requests without browser
// headers (curl, Envoy, SDKs) pass.
func crossOrigin(next http.Handler) http.Handler {
	p := http.NewCrossOriginProtection()
	p.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		problem(w, http.StatusForbidden, "cross-origin request refused: call the API from the same origin or without a browser")
	}))
	return p.Handler(next)
}

// grpcToken refuses rate limit calls without the decision token in
// "authorization" metadata ("Bearer <token>"; Envoy sends it through the
// grpc_service's initial_metadata). Health checks need no token.
func grpcToken(token string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if token == "" || strings.HasPrefix(info.FullMethod, "/grpc.health.") {
			return handler(ctx, req)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		var got string
		ok := false
		for _, v := range md.Get("authorization") {
			if got, ok = bearer(v); ok {
				break
			}
		}
		if !ok {
			return nil, status.Error(codes.Unauthenticated, "sluice: send authorization metadata: Bearer <decision token>")
		}
		if !tokenMatches(got, token) {
			return nil, status.Error(codes.PermissionDenied, "sluice: wrong decision token")
		}
		return handler(ctx, req)
	}
}
