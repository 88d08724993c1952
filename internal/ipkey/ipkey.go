// Package ipkey turns client addresses into rate-limit keys: it finds the
// client behind trusted proxies (rightmost untrusted hop of
// X-Forwarded-For or Forwarded) and groups IPv6 clients by prefix, so that
// one host cannot rotate through its /64.
package ipkey

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// ErrConfig: a bad CIDR or prefix length.
var ErrConfig = errors.New("invalid client IP configuration")

// Header formats understood by Resolver.
const (
	XForwardedFor = "X-Forwarded-For"
	Forwarded     = "Forwarded"
)

// MaxHops bounds how many trusted hops are walked, so an enormous header
// costs little even from a trusted peer.
const MaxHops = 32

// Resolver finds and groups client addresses. The zero value is not
// usable; build one with New.
type Resolver struct {
	trusted   []netip.Prefix
	forwarded bool // parse Forwarded (RFC 7239), else X-Forwarded-For
	v4, v6    int
}

// New returns a Resolver. trusted holds CIDRs or single addresses of the
// proxies whose forwarding headers are believed; header is XForwardedFor
// (default when empty) or Forwarded; v4 and v6 are the prefix lengths
// clients are grouped by (0 means 32 and 64).
func New(trusted []string, header string, v4, v6 int) (*Resolver, error) {
	r := &Resolver{v4: v4, v6: v6}
	if r.v4 == 0 {
		r.v4 = 32
	}
	if r.v6 == 0 {
		r.v6 = 64
	}
	if r.v4 < 1 || r.v4 > 32 {
		return nil, fmt.Errorf("%w: IPv4 prefix /%d (want 1 to 32)", ErrConfig, r.v4)
	}
	if r.v6 < 1 || r.v6 > 128 {
		return nil, fmt.Errorf("%w: IPv6 prefix /%d (want 1 to 128)", ErrConfig, r.v6)
	}
	switch {
	case header == "" || strings.EqualFold(header, XForwardedFor):
	case strings.EqualFold(header, Forwarded):
		r.forwarded = true
	default:
		return nil, fmt.Errorf("%w: header %q (want %s or %s)", ErrConfig, header, XForwardedFor, Forwarded)
	}
	for _, s := range trusted {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			a, aerr := netip.ParseAddr(s)
			if aerr != nil {
				return nil, fmt.Errorf("%w: trusted proxy %q is neither a CIDR nor an address", ErrConfig, s)
			}
			a = a.Unmap()
			p = netip.PrefixFrom(a, a.BitLen())
		}
		if p.Addr().Is4In6() {
			// Peers are compared unmapped, as IPv4. A mapped prefix shorter
			// than /96 spans IPv6 addresses too; clamped, it became
			// 0.0.0.0/0 and trusted every IPv4 peer.
			if p.Bits() < 96 {
				return nil, fmt.Errorf("%w: trusted proxy %q: an IPv4-mapped prefix needs /96 or longer (write it as an IPv4 CIDR, e.g. %s)", ErrConfig, s, netip.PrefixFrom(p.Addr().Unmap(), 8).Masked())
			}
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96)
		}
		r.trusted = append(r.trusted, p.Masked())
	}
	return r, nil
}

// Header returns the forwarding header the resolver reads.
func (r *Resolver) Header() string {
	if r.forwarded {
		return Forwarded
	}
	return XForwardedFor
}

// Trusts reports whether a is a trusted proxy.
func (r *Resolver) Trusts(a netip.Addr) bool {
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// Client returns the client address for a request from peer carrying the
// given forwarding header lines (in order). With no trusted proxies, or an
// untrusted peer, it is the peer. Otherwise it is the rightmost hop that is
// not a trusted proxy; a hop that cannot be parsed ends the walk at the
// trusted hop that reported it.
func (r *Resolver) Client(peer netip.Addr, lines []string) netip.Addr {
	peer = peer.Unmap()
	if len(r.trusted) == 0 || !r.Trusts(peer) {
		return peer
	}
	client := peer
	hops := 0
	// step takes the next hop leftwards and reports whether the walk ends.
	step := func(a netip.Addr, ok bool) bool {
		if !ok {
			return true
		}
		client = a
		hops++
		return !r.Trusts(a) || hops >= MaxHops
	}
	for i := len(lines) - 1; i >= 0; i-- {
		if r.forwarded {
			line := lines[i]
			for end := len(line); end >= 0; {
				start := lastElement(line[:end])
				if elem := line[start:end]; strings.TrimSpace(elem) != "" {
					if step(forwardedFor(elem)) {
						return client
					}
				}
				end = start - 1
			}
			continue
		}
		rest := lines[i]
		for rest != "" {
			var hop string
			if j := strings.LastIndexByte(rest, ','); j >= 0 {
				hop, rest = rest[j+1:], rest[:j]
			} else {
				hop, rest = rest, ""
			}
			hop = strings.TrimSpace(hop)
			if hop == "" {
				continue
			}
			if step(parseAddr(hop)) {
				return client
			}
		}
	}
	return client
}

// lastElement returns where the last forwarded-element of s starts: just
// after the rightmost comma outside quoted-strings (RFC 7239 §4, RFC 7230
// §3.2.6), or 0. The scan runs from the right because proxies append:
// the trusted proxies' elements are found before, and whatever the client
// wrote to their left (an unterminated quote, say) cannot change them.
// Scanning leftwards, a quote opens a quoted-string when outside one and
// closes it unless an odd run of backslashes (a quoted-pair) precedes it.
func lastElement(s string) int {
	quoted := false
	for i := len(s) - 1; i >= 0; i-- {
		switch s[i] {
		case '"':
			if !quoted {
				quoted = true
				continue
			}
			k := i
			for k > 0 && s[k-1] == '\\' {
				k--
			}
			if (i-k)%2 == 0 {
				quoted = false
			}
		case ',':
			if !quoted {
				return i + 1
			}
		}
	}
	return 0
}

// skipQuoted returns the index of the quote that closes the quoted-string
// opening at s[i], or len(s) when it is unterminated; a backslash escapes
// the byte after it (quoted-pair).
func skipQuoted(s string, i int) int {
	for i++; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i
		}
	}
	return len(s)
}

// forwardedFor extracts the for= node of one Forwarded element
// (RFC 7239 §4): for=192.0.2.60;proto=http, for="[2001:db8::1]:4711".
// An element that does not parse (a pair without "=", an unterminated or
// trailing-garbage quoted-string, for= twice) has no usable node: the walk
// then ends at the trusted proxy that reported it.
func forwardedFor(elem string) (netip.Addr, bool) {
	var node string
	found := false
	for start, i := 0, 0; i <= len(elem); i++ {
		if i < len(elem) && elem[i] == '"' {
			if i = skipQuoted(elem, i); i == len(elem) {
				return netip.Addr{}, false
			}
			continue
		}
		if i < len(elem) && elem[i] != ';' {
			continue
		}
		pair := strings.TrimSpace(elem[start:i])
		start = i + 1
		if pair == "" {
			continue
		}
		name, value, ok := strings.Cut(pair, "=")
		name = strings.TrimSpace(name)
		if !ok || name == "" {
			return netip.Addr{}, false
		}
		value, ok = unquote(strings.TrimSpace(value))
		if !ok {
			return netip.Addr{}, false
		}
		if strings.EqualFold(name, "for") {
			if found {
				return netip.Addr{}, false
			}
			node, found = value, true
		}
	}
	if !found {
		return netip.Addr{}, false
	}
	return parseAddr(node)
}

// unquote returns a value as written, or a quoted-string's content with
// its quoted-pairs undone. A quote anywhere but around the whole value is
// malformed.
func unquote(v string) (string, bool) {
	if !strings.Contains(v, `"`) {
		return v, true
	}
	if len(v) < 2 || v[0] != '"' || skipQuoted(v, 0) != len(v)-1 {
		return "", false
	}
	v = v[1 : len(v)-1]
	if !strings.Contains(v, `\`) {
		return v, true
	}
	var b strings.Builder
	for i := 0; i < len(v); i++ {
		if v[i] == '\\' && i+1 < len(v) {
			i++
		}
		b.WriteByte(v[i])
	}
	return b.String(), true
}

// parseAddr accepts an address, optionally with a port, IPv6 optionally
// bracketed: 192.0.2.1, 192.0.2.1:80, 2001:db8::1, [2001:db8::1]:443.
func parseAddr(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return a.Unmap().WithZone(""), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return a.Unmap().WithZone(""), true
		}
	}
	return netip.Addr{}, false
}

// ParsePeer parses a net/http RemoteAddr or gRPC peer address
// ("192.0.2.1:1234", "[2001:db8::1]:443", or a bare address).
func ParsePeer(s string) (netip.Addr, error) {
	// Peers nearly always come with a port: trying that form first spares
	// every request a failed parse and its error allocation. No string
	// parses both with and without a port, so the order changes nothing.
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return ap.Addr().Unmap().WithZone(""), nil
	}
	if a, ok := parseAddr(s); ok {
		return a, nil
	}
	return netip.Addr{}, fmt.Errorf("peer address %q is not an IP address", s)
}

// Key returns a's group as a key: the address itself for a full-length
// prefix ("192.0.2.1"), else the masked prefix ("2001:db8:1:2::/64").
func (r *Resolver) Key(a netip.Addr) string {
	a = a.Unmap().WithZone("")
	bits := r.v6
	if a.Is4() {
		bits = r.v4
	}
	if bits >= a.BitLen() {
		return a.String()
	}
	p, err := a.Prefix(bits)
	if err != nil { // cannot happen: bits is within range
		return a.String()
	}
	return p.String()
}

// PrefixKey returns the key of the group p names, written as Key writes
// it (masked, lower case): ok only when p is one group, an IPv6 prefix of
// the resolver's IPv6 length or an IPv4 one of its IPv4 length (under 32),
// so that one group spelled two ways is one key.
func (r *Resolver) PrefixKey(p netip.Prefix) (string, bool) {
	a := p.Addr()
	bits := r.v6
	if a.Is4() {
		bits = r.v4
	}
	if a.Is4In6() || bits >= a.BitLen() || p.Bits() != bits {
		return "", false
	}
	return p.Masked().String(), true
}
