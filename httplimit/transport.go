package httplimit

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	"github.com/sluicehq/sluice"
)

// Transport is an http.RoundTripper that waits for quota before each
// request, for clients of rate-limited third-party APIs: it keeps a
// service within the provider's limit instead of collecting 429s. The
// wait honours the request's context: a request whose deadline would pass
// while waiting (behind this process's other waiters on the key: see
// sluice.Limiter.WaitN) fails at once with an error wrapping
// context.DeadlineExceeded, and the provider is never called. Requests
// other processes send on the key can still make one wait and then fail
// at its deadline.
//
// With a Redis store, a whole fleet shares the provider's quota.
type Transport struct {
	base    http.RoundTripper
	limiter *sluice.Limiter
	key     func(*http.Request) string
	cost    func(*http.Request) int64
}

// TransportOptions configures a Transport. A nil *TransportOptions is valid.
type TransportOptions struct {
	// Base performs the requests. Default: http.DefaultTransport.
	Base http.RoundTripper
	// Key is the quota a request draws on. Default: its URL's host, so one
	// Transport can call several providers, each with its own quota. The
	// host is normalized, so that one provider has one quota however its
	// URLs spell it: lower case, without a trailing dot or the scheme's
	// default port (80 for http, 443 for https), an IP address in its
	// canonical form, an IPv4-mapped IPv6 address as the IPv4 address
	// ("[::ffff:127.0.0.1]:8080" is "127.0.0.1:8080"). Names are not
	// resolved: "localhost" and "127.0.0.1" are two quotas.
	Key func(*http.Request) string
	// Cost is a request's weight. Default: 1.
	Cost func(*http.Request) int64
}

var _ http.RoundTripper = (*Transport)(nil)

// NewTransport returns a Transport drawing on limiter. A nil or zero
// limiter (one not made by sluice.NewLimiter) is refused with
// ErrInvalidConfig.
func NewTransport(limiter *sluice.Limiter, opts *TransportOptions) (*Transport, error) {
	if limiter == nil {
		return nil, fmt.Errorf("%w: nil limiter", ErrInvalidConfig)
	}
	if err := limiter.Limit().Validate(); err != nil {
		// NewLimiter validates its limit: this is a zero Limiter, which
		// would fail every request.
		return nil, fmt.Errorf("%w: zero Limiter: build one with sluice.NewLimiter: %w", ErrInvalidConfig, err)
	}
	t := &Transport{base: http.DefaultTransport, limiter: limiter}
	if opts != nil {
		if opts.Base != nil {
			t.base = opts.Base
		}
		t.key, t.cost = opts.Key, opts.Cost
	}
	return t, nil
}

// RoundTrip waits for quota (Limiter.WaitN) and then sends req. A nil req
// or URL fails with ErrKey, as does a URL without a host under the default
// key (there is no host to key on); a nil t fails with ErrInvalidConfig.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch {
	case req == nil:
		return nil, fmt.Errorf("%w: nil Request", ErrKey)
	case t == nil:
		closeBody(req)
		return nil, fmt.Errorf("%w: nil *httplimit.Transport: build one with NewTransport", ErrInvalidConfig)
	case req.URL == nil:
		closeBody(req)
		return nil, fmt.Errorf("%w: nil Request.URL", ErrKey)
	}
	var key string
	if t.key != nil {
		key = t.key(req)
	} else if key = hostKey(req.URL); key == "" {
		closeBody(req)
		return nil, fmt.Errorf("%w: request URL has no host", ErrKey)
	}
	cost := int64(1)
	if t.cost != nil {
		cost = t.cost(req)
	}
	if _, err := t.limiter.WaitN(req.Context(), key, cost); err != nil {
		closeBody(req)
		return nil, fmt.Errorf("httplimit: waiting for quota for %q: %w", key, err)
	}
	return t.base.RoundTrip(req)
}

// closeBody closes req's body: a RoundTripper must, even on error.
func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// hostKey is the default key: u's host, normalized (see
// TransportOptions.Key), or "" when u has none. Only spellings of one
// address are merged: resolving names would make the key depend on DNS.
func hostKey(u *url.URL) string {
	host, port := strings.TrimSuffix(u.Hostname(), "."), u.Port()
	if host == "" {
		return ""
	}
	if a, err := netip.ParseAddr(host); err == nil {
		host = a.Unmap().String()
	} else {
		host = strings.ToLower(host)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err == nil {
		port = strconv.FormatUint(n, 10) // "0443" is 443
	}
	switch strings.ToLower(u.Scheme) {
	case "http":
		if port == "80" {
			port = ""
		}
	case "https":
		if port == "443" {
			port = ""
		}
	}
	if port != "" {
		return net.JoinHostPort(host, port)
	}
	if strings.Contains(host, ":") { // IPv6: bracketed, as in a URL
		return "[" + host + "]"
	}
	return host
}
