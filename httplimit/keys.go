package httplimit

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/internal/enforce"
)

// KeyFunc says whom a request is counted against: a client IP, an API key,
// a user. It returns ErrNoKey when the request carries no such key (no API
// key header, no session cookie); the rule then does not apply to it, so
// that, say, anonymous requests fall to a per-IP rule. Any other error
// fails the request (see Options.ErrorHandler).
//
// Keys are opaque: the middleware prefixes them with the rule's name, and
// hashes them when Options.HashKey is set or when they are too long. A key
// may carry a Redis Cluster hash tag ("{tenant42}:user", see "Layered
// limits" in docs/middleware.md) to share a slot with related keys: the user's own
// KeyFunc and ContextValue keep theirs, while the functions that read the
// request (Header, Cookie, Route) escape '%', '{' and '}' (as %25, %7B and
// %7D), so that no client, nor a mux pattern's wildcard, picks a key's
// slot.
//
// It is a func(*http.Request) (string, error); Global, Compose,
// ContextValue and ClientIP are written once for httplimit and grpclimit.
type KeyFunc = enforce.KeyFunc[*http.Request]

// ErrNoKey is returned by a KeyFunc when the request has no key of its kind.
var ErrNoKey = errors.New("httplimit: no key")

// IPOptions configures ClientIP. A nil *IPOptions is valid: the peer
// address is the key, whatever the headers say.
type IPOptions struct {
	// TrustedProxies lists the CIDRs (or single addresses) of the proxies
	// in front of the server. Only when the direct peer is one of them is
	// the forwarding header read, and then the client is the rightmost hop
	// that is not a trusted proxy: hops further left were written by the
	// client and may be forged. Default: none.
	TrustedProxies []string

	// Header is the forwarding header the trusted proxies set:
	// "X-Forwarded-For" (default) or "Forwarded" (RFC 7239).
	Header string

	// IPv6Prefix groups IPv6 clients by this prefix length, since one host
	// commonly owns a whole /64. Default: 64. 128 keys each address.
	IPv6Prefix int

	// IPv4Prefix groups IPv4 clients likewise. Default: 32 (each address).
	IPv4Prefix int
}

// ClientIP returns a KeyFunc for the client's IP address (or its IPv6
// prefix), spoof-proof as IPOptions describes. It fails on a bad CIDR or
// prefix length. A request whose peer is not an IP address (a server
// listening on a Unix socket, whose requests' RemoteAddr is "@") cannot
// be keyed by it, whatever the headers say: it fails with ErrKey (500 by
// default). Key such servers with a KeyFunc of your own, such as Header
// of a field the proxy in front sets.
func ClientIP(opts *IPOptions) (KeyFunc, error) {
	var o IPOptions
	if opts != nil {
		o = *opts
	}
	f, err := enforce.ClientIP("httplimit", o.TrustedProxies, o.Header, o.IPv4Prefix, o.IPv6Prefix, remoteAddr, headerLines)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return f, nil
}

func remoteAddr(r *http.Request) (string, bool) { return r.RemoteAddr, true }

// headerLines reads the named header's lines, its name canonicalized once
// (r.Header.Values would do it on every request).
func headerLines(name string) func(*http.Request) []string {
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) []string { return r.Header[name] }
}

// PeerIP returns a KeyFunc for the direct peer's address, IPv6 grouped by
// /64: ClientIP with no trusted proxies (so a Unix socket's peer fails
// with ErrKey, as there).
func PeerIP() KeyFunc {
	f, _ := ClientIP(nil) // the defaults cannot fail
	return f
}

// Header returns a KeyFunc for the first value of the named request header,
// such as an API key. A missing or empty header is ErrNoKey. The value's
// '%', '{' and '}' are written %25, %7B and %7D, so that a client cannot
// choose its key's Redis Cluster slot (see KeyFunc). An empty name fails
// every request with ErrKey and ErrInvalidConfig (a 500), where a header
// named "" would never be found and the rule never applied.
func Header(name string) KeyFunc {
	if strings.TrimSpace(name) == "" {
		return unnamed("Header")
	}
	name = http.CanonicalHeaderKey(name)
	return func(r *http.Request) (string, error) {
		if v := r.Header[name]; len(v) > 0 && v[0] != "" {
			return enforce.EscapeKey(v[0]), nil
		}
		return "", ErrNoKey
	}
}

// Cookie returns a KeyFunc for the value of the named cookie, such as a
// session id. A missing or empty cookie is ErrNoKey. Its '%', '{' and '}'
// are escaped as Header's are; an empty name fails as Header's does.
func Cookie(name string) KeyFunc {
	if strings.TrimSpace(name) == "" {
		return unnamed("Cookie")
	}
	return func(r *http.Request) (string, error) {
		c, err := r.Cookie(name)
		if err != nil || c.Value == "" {
			return "", ErrNoKey
		}
		return enforce.EscapeKey(c.Value), nil
	}
}

// ContextValue returns a KeyFunc for the value stored under key in the
// request's context, typically the authenticated user or account that an
// earlier middleware put there. Strings (of any string type),
// fmt.Stringers and integers (of any kind) are accepted; a missing (nil)
// value, a typed nil pointer (a nil *User for an anonymous caller), map,
// slice, func or channel included, or an empty string is ErrNoKey; any
// other type, or a String method that panics, is an error.
func ContextValue(key any) KeyFunc {
	return enforce.ContextValue("httplimit", ErrNoKey, (*http.Request).Context, key)
}

// Route returns a KeyFunc for the method and route: "GET /items/%7Bid%7D"
// for the pattern "GET /items/{id}" when the middleware runs inside an
// http.ServeMux route (r.Pattern is set), else the method and URL path.
// '%', '{' and '}' are escaped as Header's are: a pattern's wildcard would
// otherwise be a Redis Cluster hash tag, putting every client's key of
// every route whose first wildcard is {id} on one master.
// Paths come from clients, so wrapping a whole mux with a Route key lets
// clients create keys at will; the store's key bound then applies.
func Route() KeyFunc {
	return func(r *http.Request) (string, error) {
		p := r.Pattern
		if p == "" {
			p = r.URL.Path
		} else if i := strings.IndexByte(p, ' '); i >= 0 {
			p = p[i+1:] // the pattern's own method, if any, is r.Method
		}
		return enforce.EscapeKey(r.Method + " " + p), nil
	}
}

// Global returns a KeyFunc that puts every request under one key: a limit
// for the whole endpoint or service.
func Global() KeyFunc { return enforce.Global[*http.Request]() }

// Compose returns a KeyFunc for the combination of fns, such as "per API
// key per route": Compose(Header("X-API-Key"), Route()). If any part is
// ErrNoKey (or another error), so is the whole. Parts are length-prefixed,
// so no two different combinations can produce the same key.
func Compose(fns ...KeyFunc) KeyFunc { return enforce.Compose("httplimit", fns...) }

// unnamed is the KeyFunc of fn given no name: every request fails with
// ErrKey and ErrInvalidConfig, loud at the first one, rather than a rule
// that never finds a key and so never limits.
func unnamed(fn string) KeyFunc {
	err := fmt.Errorf("%w: %s(\"\"): no name", ErrInvalidConfig, fn)
	return func(*http.Request) (string, error) { return "", err }
}
