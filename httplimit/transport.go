package httplimit

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"golang.org/x/net/idna"
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
// When the provider answers 429 Too Many Requests or 503 Service
// Unavailable with a Retry-After (seconds, or an HTTP-date read against
// the response's Date), the Transport holds the key's requests until then
// (at most MaxProviderHold, or TransportOptions.MaxHold): none is sent
// before the hold ends, unless ClearHold lifts it, and then they
// draw on the quota again. A request whose deadline ends before the hold
// does fails at once with an error wrapping ErrProviderHold and
// context.DeadlineExceeded; one without a deadline waits, until its
// context ends. The hold is kept in this process and in the limiter's
// store, beside the quota's key, so that a fleet sharing a Redis store
// holds together. Requests already sent when the 429 arrives are not
// recalled. Other rate-limit headers (RateLimit, X-RateLimit-Reset) are
// not read: providers disagree on what they mean.
//
// With a Redis store, a whole fleet shares the provider's quota.
type Transport struct {
	base    http.RoundTripper
	limiter *sluice.Limiter
	key     func(*http.Request) string
	cost    func(*http.Request) int64
	holds   holds
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
	// ("[::ffff:127.0.0.1]:8080" is "127.0.0.1:8080"), an international
	// name in its ASCII form ("bücher.example" is "xn--bcher-kva.example").
	// Names are not resolved: "localhost" and "127.0.0.1" are two quotas.
	Key func(*http.Request) string
	// Cost is a request's weight. Default: 1.
	Cost func(*http.Request) int64
	// Logger receives a line when a provider's hold could not be shared
	// through the store (this process still holds), or looked up there:
	// per kind, one at once, then at most one a minute, with the number
	// not logged (failures_not_logged) written when the minute ends.
	// Default: slog.Default().
	Logger *slog.Logger
	// MaxHold is the longest hold one Retry-After, or a hold read from the
	// store, keeps this Transport's requests; a hold read from the store
	// counts from when this Transport first saw it (a later, longer hold
	// there is a new one). Default (0):
	// MaxProviderHold; above it, or negative, NewTransport fails with
	// ErrInvalidConfig. ClearHold lifts a hold sooner.
	MaxHold time.Duration
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
	t.holds = holds{store: limiter.Store(), prefix: limiter.Prefix(), logger: slog.Default()}
	if opts != nil {
		if opts.Base != nil {
			t.base = opts.Base
		}
		t.key, t.cost = opts.Key, opts.Cost
		if opts.Logger != nil {
			t.holds.logger = opts.Logger
		}
		if opts.MaxHold < 0 || opts.MaxHold > MaxProviderHold {
			return nil, fmt.Errorf("%w: MaxHold %v outside 0..%v", ErrInvalidConfig, opts.MaxHold, MaxProviderHold)
		}
		t.holds.max = opts.MaxHold
	}
	return t, nil
}

// ClearHold lifts the provider's hold on key (a key as TransportOptions.Key
// gives it, or the normalized host by default) in this process and in the
// store, so that every Transport sharing the store sends again: their
// waiters look at the store at least once a second. An error says the
// store's hold could not be cleared; this process's is cleared anyway.
// The quota's own state is untouched (see sluice.Limiter.Reset).
func (t *Transport) ClearHold(ctx context.Context, key string) error {
	if t == nil || t.holds.store == nil {
		return fmt.Errorf("%w: nil or zero *httplimit.Transport: build one with NewTransport", ErrInvalidConfig)
	}
	if writing := t.holds.drop(key); writing != nil {
		select { // a write started before the clear must not land after it
		case <-writing:
		case <-ctx.Done():
		}
	}
	err := t.holds.store.Reset(ctx, t.holds.storeKey(key), holdLook)
	t.holds.clear(key)
	if err != nil {
		return fmt.Errorf("httplimit: clearing the provider's hold on %q in the store: %w", key, err)
	}
	return nil
}

// Close waits until no provider's hold is being shared through the store
// (see RoundTrip): each write takes at most a second. After it returns
// nothing of the Transport's runs or logs, until its next request: the
// Transport stays usable.
func (t *Transport) Close() error {
	if t != nil {
		t.holds.flush()
	}
	return nil
}

// RoundTrip waits out the provider's hold on req's key, if any, then for
// quota (Limiter.WaitN), and then sends req. A nil req or URL fails with
// ErrKey, as does a URL without a host under the default key (there is no
// host to key on); a nil t fails with ErrInvalidConfig. A 429 or 503 with
// Retry-After is returned once its hold is shared through the store or
// req's context ends, whichever comes first: the write (at most a second)
// goes on without it, one at a time per key.
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
	ctx := req.Context()
	for {
		// No quota is taken while the key is known to be held; a hold
		// found only after the take (set while this request waited, or by
		// another process) costs the unit taken, and the request draws
		// again once the hold ends, so that the held requests do not all
		// go at once.
		if err := t.holds.wait(ctx, key); err != nil {
			closeBody(req)
			return nil, err
		}
		if _, err := t.limiter.WaitN(ctx, key, cost); err != nil {
			closeBody(req)
			return nil, fmt.Errorf("httplimit: waiting for quota for %q: %w", key, err)
		}
		if t.holds.held(ctx, key) {
			continue
		}
		// Last look before sending: a 429 another request got while this
		// one read the store holds it too.
		if t.holds.left(key) <= 0 {
			break
		}
	}
	resp, err := t.base.RoundTrip(req)
	if err == nil && (resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable) {
		if d := retryAfter(resp.Header, time.Now()); d > 0 {
			t.holds.hold(ctx, key, d)
		}
	}
	return resp, err
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
	} else if a, err := idna.Lookup.ToASCII(host); err == nil {
		host = a // as net/http dials it: "bücher.example" is "xn--bcher-kva.example"
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
