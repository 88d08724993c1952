package ipkey

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestClient(t *testing.T) {
	t.Parallel()
	proxies := []string{"10.0.0.0/8", "2001:db8:ffff::/48", "192.0.2.7"}
	tests := []struct {
		name    string
		trusted []string
		header  string
		peer    string
		lines   []string
		want    string
	}{
		{"no proxies: peer, whatever the header", nil, "", "203.0.113.9", []string{"1.1.1.1"}, "203.0.113.9"},
		{"untrusted peer: spoofed header ignored", proxies, "", "203.0.113.9", []string{"1.1.1.1"}, "203.0.113.9"},
		{"trusted peer: rightmost hop", proxies, "", "10.1.2.3", []string{"198.51.100.1"}, "198.51.100.1"},
		{"client-forged hops left of the real one", proxies, "", "10.1.2.3", []string{"6.6.6.6, 7.7.7.7, 198.51.100.1"}, "198.51.100.1"},
		{"chain of trusted proxies", proxies, "", "10.1.2.3", []string{"6.6.6.6, 198.51.100.1, 10.9.9.9, 192.0.2.7"}, "198.51.100.1"},
		{"several header lines", proxies, "", "10.1.2.3", []string{"6.6.6.6, 198.51.100.1", "10.9.9.9"}, "198.51.100.1"},
		{"all trusted: leftmost", proxies, "", "10.1.2.3", []string{"10.0.0.1, 10.0.0.2"}, "10.0.0.1"},
		{"no header: peer", proxies, "", "10.1.2.3", nil, "10.1.2.3"},
		{"garbage hop: the proxy that reported it", proxies, "", "10.1.2.3", []string{"garbage, 10.0.0.5"}, "10.0.0.5"},
		{"garbage left of the client is never read", proxies, "", "10.1.2.3", []string{"garbage, 198.51.100.1"}, "198.51.100.1"},
		{"ports and brackets", proxies, "", "10.1.2.3", []string{"[2001:db8::1]:443, 10.0.0.9:8080"}, "2001:db8::1"},
		{"empty hops skipped", proxies, "", "10.1.2.3", []string{" , 198.51.100.1 ,, "}, "198.51.100.1"},
		{"ipv4-mapped peer and hops", proxies, "", "::ffff:10.1.2.3", []string{"::ffff:198.51.100.1"}, "198.51.100.1"},
		{"ipv6 proxy", proxies, "", "2001:db8:ffff::1", []string{"198.51.100.1"}, "198.51.100.1"},
		{"Forwarded", proxies, "Forwarded", "10.1.2.3", []string{`for=6.6.6.6, for="[2001:db8:cafe::17]:4711";proto=https, for=10.0.0.1;by=10.0.0.2`}, "2001:db8:cafe::17"},
		{"Forwarded obfuscated", proxies, "Forwarded", "10.1.2.3", []string{`for=_hidden, for=10.0.0.1`}, "10.0.0.1"},
		{"Forwarded without for", proxies, "Forwarded", "10.1.2.3", []string{`proto=https`}, "10.1.2.3"},
		{"Forwarded ignored when XFF configured", proxies, "", "10.1.2.3", nil, "10.1.2.3"},
		// A proxy quotes values the client chose (host=): a comma or
		// semicolon inside a quoted-string splits nothing.
		{"Forwarded two elements", proxies, "Forwarded", "10.0.0.1", []string{`for=6.6.6.6, for=203.0.113.9;proto=https`}, "203.0.113.9"},
		{"Forwarded quoted ';' before for", proxies, "Forwarded", "10.0.0.1", []string{`host="x;for=6.6.6.6;y=";for=203.0.113.9`}, "203.0.113.9"},
		{"Forwarded quoted ',' after for", proxies, "Forwarded", "10.0.0.1", []string{`for=203.0.113.9;host="a,for=6.6.6.6"`}, "203.0.113.9"},
		{"Forwarded escaped quote inside quotes", proxies, "Forwarded", "10.0.0.1", []string{`host="a\",for=6.6.6.6;";for=203.0.113.9`}, "203.0.113.9"},
		{"Forwarded quoted-pair in for", proxies, "Forwarded", "10.0.0.1", []string{`for="\203.0.113.9"`}, "203.0.113.9"},
		{"Forwarded several lines", proxies, "Forwarded", "10.0.0.1", []string{`for=6.6.6.6`, `for=203.0.113.9`, `for=10.0.0.2`}, "203.0.113.9"},
		{"Forwarded for=unknown", proxies, "Forwarded", "10.0.0.1", []string{`for=unknown`}, "10.0.0.1"},
		{"Forwarded for=_hidden", proxies, "Forwarded", "10.0.0.1", []string{`for=_hidden`}, "10.0.0.1"},
		// Malformed elements name no client: the walk ends at the proxy.
		{"Forwarded garbage after quotes", proxies, "Forwarded", "10.0.0.1", []string{`for="203.0.113.9"x`}, "10.0.0.1"},
		{"Forwarded for twice", proxies, "Forwarded", "10.0.0.1", []string{`for=203.0.113.9;for=6.6.6.6`}, "10.0.0.1"},
		{"Forwarded pair without =", proxies, "Forwarded", "10.0.0.1", []string{`for=203.0.113.9;secure`}, "10.0.0.1"},
		{"Forwarded unterminated quote in the proxy's element", proxies, "Forwarded", "10.0.0.1", []string{`for=203.0.113.9;host="a`}, "10.0.0.1"},
		// Elements are split from the right: a client's unterminated or
		// escaped quote cannot swallow the element its proxy appended.
		{"Forwarded client's lone quote", proxies, "Forwarded", "10.0.0.1", []string{`for=", for=203.0.113.9`}, "203.0.113.9"},
		{"Forwarded client's unterminated quote after a pair", proxies, "Forwarded", "10.0.0.1", []string{`for=6.6.6.6;host=", for=203.0.113.9`}, "203.0.113.9"},
		{"Forwarded client's escaped closing quote", proxies, "Forwarded", "10.0.0.1", []string{`host="a\", for=203.0.113.9`}, "203.0.113.9"},
		{"Forwarded client's unterminated by", proxies, "Forwarded", "10.0.0.1", []string{`for=198.51.100.1;by="x, for=203.0.113.9`}, "203.0.113.9"},
		{"Forwarded client's quote, then trusted hops", proxies, "Forwarded", "10.0.0.1", []string{`for=", for=203.0.113.9, for=10.0.0.2;host="a,b"`}, "203.0.113.9"},
		{"Forwarded client's unterminated quote before a quoted for", proxies, "Forwarded", "10.0.0.1", []string{`host="a,for=6.6.6.6, for="[2001:db8::9]:4711"`}, "2001:db8::9"},
		{"Forwarded client's quote on its own line", proxies, "Forwarded", "10.0.0.1", []string{`for="`, `for=203.0.113.9`}, "203.0.113.9"},
		{"Forwarded escaped backslash closes the quote", proxies, "Forwarded", "10.0.0.1", []string{`for=6.6.6.6;host="a\\", for=203.0.113.9;host="b\\"`}, "203.0.113.9"},
		// What a client writes left of its proxy's element is all it
		// controls: a quote opened there does not reach rightwards.
		{"Forwarded unterminated quote left of the proxy's element", proxies, "Forwarded", "10.0.0.1", []string{`for=6.6.6.6, for=203.0.113.9;host="a,for=198.51.100.1`}, "198.51.100.1"},
		{"Forwarded empty elements and pairs skipped", proxies, "Forwarded", "10.0.0.1", []string{`for=6.6.6.6, ,;for=203.0.113.9;;proto=https,, `}, "203.0.113.9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.trusted, tt.header, 0, 128)
			if err != nil {
				t.Fatal(err)
			}
			got := r.Client(netip.MustParseAddr(tt.peer), tt.lines)
			if got.String() != tt.want {
				t.Errorf("Client = %v, want %s", got, tt.want)
			}
		})
	}
}

func TestClientBoundedWalk(t *testing.T) {
	t.Parallel()
	r, err := New([]string{"10.0.0.0/8"}, "", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	line := "198.51.100.1," + strings.Repeat("10.0.0.1,", 100_000) + "10.0.0.2"
	if got := r.Client(netip.MustParseAddr("10.1.1.1"), []string{line}); got.String() == "198.51.100.1" || !r.Trusts(got) {
		t.Errorf("Client = %v: want the walk to stop after %d trusted hops", got, MaxHops)
	}
}

func TestClientBoundedWalkForwarded(t *testing.T) {
	t.Parallel()
	r, err := New([]string{"10.0.0.0/8"}, Forwarded, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	line := `for=198.51.100.1,` + strings.Repeat(`for=10.0.0.1;host="a,b;c",`, 100_000) + `for=10.0.0.2`
	if got := r.Client(netip.MustParseAddr("10.1.1.1"), []string{line}); got.String() == "198.51.100.1" || !r.Trusts(got) {
		t.Errorf("Client = %v: want the walk to stop after %d trusted hops", got, MaxHops)
	}
	// Fewer trusted hops than MaxHops: the walk reaches the client.
	line = `for=198.51.100.1,` + strings.Repeat(`for=10.0.0.1;host="a,b;c",`, MaxHops-2) + `for=10.0.0.2`
	if got := r.Client(netip.MustParseAddr("10.1.1.1"), []string{line}); got.String() != "198.51.100.1" {
		t.Errorf("Client = %v, want 198.51.100.1", got)
	}
}

func TestKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		v4, v6 int
		addr   string
		want   string
	}{
		{0, 0, "192.0.2.1", "192.0.2.1"},
		{0, 0, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{0, 0, "2001:db8:1:2:ffff::", "2001:db8:1:2::/64"},
		{0, 0, "fe80::1%eth0", "fe80::/64"},
		{0, 128, "2001:db8:1:2:3:4:5:6", "2001:db8:1:2:3:4:5:6"},
		{0, 48, "2001:db8:1:2:3:4:5:6", "2001:db8:1::/48"},
		{24, 0, "192.0.2.200", "192.0.2.0/24"},
		{0, 0, "::ffff:192.0.2.1", "192.0.2.1"},
	}
	for _, tt := range tests {
		r, err := New(nil, "", tt.v4, tt.v6)
		if err != nil {
			t.Fatal(err)
		}
		if got := r.Key(netip.MustParseAddr(tt.addr)); got != tt.want {
			t.Errorf("Key(%s, /%d, /%d) = %q, want %q", tt.addr, tt.v4, tt.v6, got, tt.want)
		}
	}
}

func TestNewErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		trusted []string
		header  string
		v4, v6  int
	}{
		{[]string{"10.0.0.0/33"}, "", 0, 0},
		{[]string{"not-an-ip"}, "", 0, 0},
		{nil, "X-Real-IP", 0, 0},
		{nil, "", 33, 0},
		{nil, "", 0, 129},
		{nil, "", -1, 0},
		// Clamped to 0.0.0.0/0, it trusted every IPv4 peer.
		{[]string{"::ffff:10.0.0.0/90"}, "", 0, 0},
		{[]string{"::ffff:0.0.0.0/0"}, "", 0, 0},
	} {
		if _, err := New(tt.trusted, tt.header, tt.v4, tt.v6); !errors.Is(err, ErrConfig) {
			t.Errorf("New(%v, %q, %d, %d) = %v, want ErrConfig", tt.trusted, tt.header, tt.v4, tt.v6, err)
		}
	}
	// A mapped /96 or longer is its IPv4 prefix.
	r, err := New([]string{"::ffff:10.0.0.0/104"}, "", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Trusts(netip.MustParseAddr("10.9.9.9")) || r.Trusts(netip.MustParseAddr("11.0.0.1")) {
		t.Errorf("::ffff:10.0.0.0/104 trusts %v", r.trusted)
	}
}

func TestParsePeer(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"192.0.2.1:1234":       "192.0.2.1",
		"[2001:db8::1]:443":    "2001:db8::1",
		"192.0.2.1":            "192.0.2.1",
		"[::ffff:10.0.0.1]:80": "10.0.0.1",
		"[fe80::1%eth0]:80":    "fe80::1",
		"::1:80":               "::1:80", // an address, not ::1 port 80
		"2001:db8::1":          "2001:db8::1",
		"[2001:db8::1]":        "2001:db8::1",
	} {
		got, err := ParsePeer(in)
		if err != nil || got.String() != want {
			t.Errorf("ParsePeer(%q) = %v, %v; want %s", in, got, err, want)
		}
	}
	for _, in := range []string{"", "@", "pipe", "host:80"} {
		if _, err := ParsePeer(in); err == nil {
			t.Errorf("ParsePeer(%q) succeeded", in)
		}
	}
}

// BenchmarkPeerKey is the per-request work of a client-IP key: parse the
// peer address as net/http gives it, find the client, group it.
func BenchmarkPeerKey(b *testing.B) {
	for _, tt := range []struct{ name, peer string }{
		{"ipv4", "203.0.113.7:54321"},
		{"ipv6", "[2001:db8:1:2::7]:443"},
	} {
		b.Run(tt.name, func(b *testing.B) {
			r, err := New(nil, "", 0, 0)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				a, err := ParsePeer(tt.peer)
				if err != nil {
					b.Fatal(err)
				}
				_ = r.Key(r.Client(a, nil))
			}
		})
	}
}

func TestPrefixKey(t *testing.T) {
	t.Parallel()
	r, err := New(nil, "", 24, 64)
	if err != nil {
		t.Fatal(err)
	}
	for in, want := range map[string]string{
		"2001:DB8:1:2::/64":       "2001:db8:1:2::/64",
		"2001:db8:1:2::7/64":      "2001:db8:1:2::/64",
		"2001:db8::/48":           "", // not one group of /64
		"198.51.100.7/24":         "198.51.100.0/24",
		"198.51.100.0/32":         "",
		"::ffff:198.51.100.0/120": "",
	} {
		got, ok := r.PrefixKey(netip.MustParsePrefix(in))
		if got != want || ok != (want != "") {
			t.Errorf("PrefixKey(%s) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
