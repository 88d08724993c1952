package ipkey

import (
	"net/netip"
	"testing"
)

// FuzzClient: whatever a client writes in its forwarding header, and
// whatever peer address a listener reports, nothing panics, and the hop a
// trusted proxy appends after the client's text is the client found.
func FuzzClient(f *testing.F) {
	for _, s := range []string{"1.1.1.1", "6.6.6.6, 7.7.7.7", "garbage", "[2001:db8::1]:443", " , ,, ", "::ffff:198.51.100.1",
		`for=6.6.6.6`, `for=", `, `host="a\`, `for=6.6.6.6;host="`, `for="[2001:db8:cafe::17]:4711";proto=https`, `for=_hidden`, `for=203.0.113.9;for=6.6.6.6`, `by="x`,
		"1.1.1.1:80", "[::1]", "fe80::1%eth0", `for="[fe80::1%eth0]"`, "for=unknown", "FOR=1.1.1.1", "for = 1.1.1.1", "1.1.1.1,", ",1.1.1.1",
		"01.1.1.1", "1.1.1.1\t", "::ffff:10.0.0.1", `for="::ffff:10.0.0.1"`, "10.0.0.1, 10.0.0.2"} {
		f.Add("10.1.2.3:5000", s, "2001:db8::7")
	}
	// Peers a listener may report in other forms: a 4in6 trusted proxy,
	// a zone, a Unix socket's.
	for _, p := range []string{"[::ffff:10.1.2.3]:5000", "[fe80::1%eth0]:80", "@", "", "10.1.2.3", "[2001:db8:ffff::1]:1"} {
		f.Add(p, "6.6.6.6", "10.0.0.0/8")
	}
	proxies := []string{"10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.7"}
	xff, err := New(proxies, XForwardedFor, 0, 0)
	if err != nil {
		f.Fatal(err)
	}
	fwd, err := New(proxies, Forwarded, 0, 0)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, peer, client, other string) {
		if a, err := ParsePeer(peer); err == nil {
			if !a.IsValid() || a.Zone() != "" || a.Is4In6() {
				t.Fatalf("ParsePeer(%q) = %v", peer, a)
			}
		}
		for _, r := range []*Resolver{xff, fwd} {
			a, _ := ParsePeer(peer)
			for _, lines := range [][]string{{client}, {client, other}, {other, client}} {
				got := r.Client(a, lines)
				if got.IsValid() {
					_ = r.Key(got)
				}
			}
			if p, err := netip.ParsePrefix(other); err == nil {
				_, _ = r.PrefixKey(p)
			}
		}
		// A trusted proxy appends the address it saw: the client's own
		// text, left of it, never overrides it.
		proxy := netip.MustParseAddr("10.1.2.3")
		want := netip.MustParseAddr("203.0.113.9")
		if got := xff.Client(proxy, []string{client + ", 203.0.113.9"}); got != want {
			t.Fatalf("X-Forwarded-For %q: client %v, want %v", client+", 203.0.113.9", got, want)
		}
		if got := fwd.Client(proxy, []string{client + ", for=203.0.113.9"}); got != want {
			t.Fatalf("Forwarded %q: client %v, want %v", client+", for=203.0.113.9", got, want)
		}
		if got := fwd.Client(proxy, []string{client, "for=203.0.113.9"}); got != want {
			t.Fatalf("Forwarded %q then for=203.0.113.9: client %v, want %v", client, got, want)
		}
	})
}
