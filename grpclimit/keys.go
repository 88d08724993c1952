package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/internal/enforce"
)

// KeyFunc says whom a call is counted against. It returns ErrNoKey when the
// call carries no such key; the rule then does not apply to it. Any other
// error fails the call with codes.Internal "grpclimit: rate limiter
// misconfigured", the error going to Options.Logger, not to the client.
//
// A key may carry a Redis Cluster hash tag ("{tenant42}:user", see
// "Layered limits" in docs/middleware.md) to share a slot with related keys: the user's
// own KeyFunc and ContextValue keep theirs, while Metadata and Method,
// which read what the client sent, escape '%', '{' and '}' (as %25, %7B
// and %7D), so that no client picks its key's slot.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

// call is one call as the shared rule collector sees it (see
// enforce.Rules): the request type of its rules and key functions.
type call struct {
	ctx    context.Context
	method string
}

func (c call) context() context.Context { return c.ctx }

// keyFunc adapts f to the collector; fromShared adapts back.
func (f KeyFunc) keyFunc() enforce.KeyFunc[call] {
	if f == nil {
		return nil
	}
	return func(c call) (string, error) { return f(c.ctx, c.method) }
}

func fromShared(f enforce.KeyFunc[call]) KeyFunc {
	return func(ctx context.Context, m string) (string, error) { return f(call{ctx, m}) }
}

// ErrNoKey is returned by a KeyFunc when the call has no key of its kind.
var ErrNoKey = errors.New("grpclimit: no key")

// IPOptions configures ClientIP. A nil *IPOptions is valid: the peer
// address is the key.
type IPOptions struct {
	// TrustedProxies lists the CIDRs (or addresses) of proxies whose
	// "x-forwarded-for" metadata is believed, and then only its rightmost
	// untrusted hop. Default: none.
	TrustedProxies []string
	// IPv6Prefix groups IPv6 clients by this prefix length. Default: 64.
	IPv6Prefix int
	// IPv4Prefix groups IPv4 clients likewise. Default: 32.
	IPv4Prefix int
}

// ClientIP returns a KeyFunc for the calling client's IP address (IPv6
// grouped by prefix), from the transport peer or, behind trusted proxies,
// from x-forwarded-for metadata. It fails on a bad CIDR or prefix length.
func ClientIP(opts *IPOptions) (KeyFunc, error) {
	if opts == nil {
		opts = new(IPOptions)
	}
	f, err := enforce.ClientIP("grpclimit", opts.TrustedProxies, "", opts.IPv4Prefix, opts.IPv6Prefix, peerAddr, forwardedFor)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return fromShared(f), nil
}

func peerAddr(c call) (string, bool) {
	p, ok := peer.FromContext(c.ctx)
	if !ok || p.Addr == nil {
		return "", false
	}
	return p.Addr.String(), true
}

// forwardedFor reads x-forwarded-for metadata, whatever the header's name
// in HTTP terms.
func forwardedFor(string) func(call) []string {
	return func(c call) []string {
		md, _ := metadata.FromIncomingContext(c.ctx)
		return md.Get("x-forwarded-for")
	}
}

// PeerIP returns a KeyFunc for the transport peer's address, IPv6 grouped
// by /64: ClientIP with no trusted proxies. A peer whose address is not an
// IP (a Unix socket, an in-memory listener) cannot be keyed by it: its
// calls fail with Internal; key such servers by metadata instead.
func PeerIP() KeyFunc {
	f, _ := ClientIP(nil) // the defaults cannot fail
	return f
}

// Metadata returns a KeyFunc for the first value of the named incoming
// metadata key, such as an API key. Missing or empty is ErrNoKey. The
// value's '%', '{' and '}' are written %25, %7B and %7D (see KeyFunc).
// An empty name fails every call with Internal (ErrInvalidConfig), where
// a key named "" would never be found and the rule never applied.
func Metadata(name string) KeyFunc {
	if strings.TrimSpace(name) == "" {
		err := fmt.Errorf("%w: Metadata(\"\"): no name", ErrInvalidConfig)
		return func(context.Context, string) (string, error) { return "", err }
	}
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(name); len(v) > 0 && v[0] != "" {
			return enforce.EscapeKey(v[0]), nil
		}
		return "", ErrNoKey
	}
}

// ContextValue returns a KeyFunc for the value stored under key in the
// call's context by an earlier interceptor, such as the authenticated
// account. Strings (of any string type), fmt.Stringers and integers (of
// any kind) are accepted; a missing (nil) value, a typed nil pointer (a
// nil *User for an anonymous caller), map, slice, func or channel
// included, or an empty string is ErrNoKey; any other type, or a String
// method that panics, is an error.
func ContextValue(key any) KeyFunc {
	return fromShared(enforce.ContextValue("grpclimit", ErrNoKey, call.context, key))
}

// Method returns a KeyFunc for the full method name, "/pkg.Service/Method":
// a limit per operation. The client names it, so it is escaped as
// Metadata's values are (a method of a .proto file holds none of them).
func Method() KeyFunc {
	return func(_ context.Context, m string) (string, error) { return enforce.EscapeKey(m), nil }
}

// Global returns a KeyFunc putting every call under one key.
func Global() KeyFunc { return fromShared(enforce.Global[call]()) }

// Compose returns a KeyFunc for the combination of fns ("per API key per
// method"). If any part is ErrNoKey, so is the whole. Parts are
// length-prefixed, so different combinations never collide.
func Compose(fns ...KeyFunc) KeyFunc {
	shared := make([]enforce.KeyFunc[call], len(fns))
	for i, f := range fns {
		shared[i] = f.keyFunc()
	}
	return fromShared(enforce.Compose("grpclimit", shared...))
}
