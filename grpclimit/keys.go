package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/internal/ipkey"
)

// KeyFunc says whom a call is counted against. It returns ErrNoKey when the
// call carries no such key; the rule then does not apply to it. Any other
// error fails the call with codes.Internal.
type KeyFunc func(ctx context.Context, fullMethod string) (string, error)

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
	var o IPOptions
	if opts != nil {
		o = *opts
	}
	res, err := ipkey.New(o.TrustedProxies, "", o.IPv4Prefix, o.IPv6Prefix)
	if err != nil {
		return nil, fmt.Errorf("grpclimit: %w", err)
	}
	return func(ctx context.Context, _ string) (string, error) {
		p, ok := peer.FromContext(ctx)
		if !ok || p.Addr == nil {
			return "", errors.New("grpclimit: no peer address")
		}
		a, err := ipkey.ParsePeer(p.Addr.String())
		if err != nil {
			return "", fmt.Errorf("grpclimit: %w", err)
		}
		md, _ := metadata.FromIncomingContext(ctx)
		return res.Key(res.Client(a, md.Get("x-forwarded-for"))), nil
	}, nil
}

// PeerIP returns a KeyFunc for the transport peer's address, IPv6 grouped
// by /64: ClientIP with no trusted proxies.
func PeerIP() KeyFunc {
	f, _ := ClientIP(nil) // the defaults cannot fail
	return f
}

// Metadata returns a KeyFunc for the first value of the named incoming
// metadata key, such as an API key. Missing or empty is ErrNoKey.
func Metadata(name string) KeyFunc {
	name = strings.ToLower(name)
	return func(ctx context.Context, _ string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(name); len(v) > 0 && v[0] != "" {
			return v[0], nil
		}
		return "", ErrNoKey
	}
}

// ContextValue returns a KeyFunc for a string (or fmt.Stringer) stored in
// the call's context by an earlier interceptor, such as the authenticated
// account. Missing is ErrNoKey.
func ContextValue(key any) KeyFunc {
	return func(ctx context.Context, _ string) (string, error) {
		switch v := ctx.Value(key).(type) {
		case nil:
			return "", ErrNoKey
		case string:
			if v == "" {
				return "", ErrNoKey
			}
			return v, nil
		case fmt.Stringer:
			return v.String(), nil
		default:
			return "", fmt.Errorf("grpclimit: context value %T is not a string", v)
		}
	}
}

// Method returns a KeyFunc for the full method name, "/pkg.Service/Method":
// a limit per operation.
func Method() KeyFunc {
	return func(_ context.Context, m string) (string, error) { return m, nil }
}

// Global returns a KeyFunc putting every call under one key.
func Global() KeyFunc {
	return func(context.Context, string) (string, error) { return "*", nil }
}

// Compose returns a KeyFunc for the combination of fns ("per API key per
// method"). If any part is ErrNoKey, so is the whole. Parts are
// length-prefixed, so different combinations never collide.
func Compose(fns ...KeyFunc) KeyFunc {
	for _, f := range fns {
		if f == nil {
			return func(context.Context, string) (string, error) {
				return "", errors.New("grpclimit: Compose was given a nil KeyFunc")
			}
		}
	}
	return func(ctx context.Context, m string) (string, error) {
		var b strings.Builder
		for _, f := range fns {
			k, err := f(ctx, m)
			if err != nil {
				return "", err
			}
			b.WriteString(strconv.Itoa(len(k)))
			b.WriteByte(':')
			b.WriteString(k)
		}
		return b.String(), nil
	}
}
