package config

import (
	"fmt"
	"strings"
	"testing"
)

const ipv6Config = `
domain: edge
descriptors:
  - key: remote_address
    ipv6_prefix: 64
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: remote_address
    value: 2001:db8:1:2::99    # an exact value is matched before the grouped descriptor
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: client
    descriptors:
      - key: remote_address
        ipv6_prefix: 48
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: plain_address          # no ipv6_prefix: keyed as sent, as envoyproxy/ratelimit does
    rate_limit: {unit: minute, requests_per_unit: 2}
policies:
  - name: login
    limit: 5/min
    key: "{user}:{ip}"
    ipv6_prefix: 56
`

// A descriptor with ipv6_prefix keys an IPv6 value by its prefix and an
// IPv4-mapped one as IPv4, so one host cannot rotate through its /64 for
// fresh budgets; other values, and descriptors without it, are keyed as
// sent.
func TestIPv6PrefixGroupsDescriptorValues(t *testing.T) {
	t.Parallel()
	dom := mustConfig(t, ipv6Config).Domain("edge")
	key := func(entries ...Entry) string {
		t.Helper()
		m, ok := dom.Match(entries)
		if !ok {
			t.Fatalf("%v: no match", entries)
		}
		return m.Key
	}
	for i := 1; i <= 50; i++ {
		if got := key(Entry{"remote_address", fmt.Sprintf("2001:db8:1:2::%x", i)}); got != "remote_address=2001:db8:1:2::/64" {
			t.Fatalf("address %d of one /64: key %q, want the /64's", i, got)
		}
	}
	for value, want := range map[string]string{
		"2001:db8:1:3::1":      "remote_address=2001:db8:1:3::/64",
		"2001:DB8:1:2:0:0:0:7": "remote_address=2001:db8:1:2::/64",
		"fe80::1%eth0":         "remote_address=fe80::/64",
		"198.51.100.7":         "remote_address=198.51.100.7",
		"::ffff:198.51.100.7":  "remote_address=198.51.100.7",
		"::ffff:c633:6407":     "remote_address=198.51.100.7",
		"198.051.100.007":      "remote_address=198.051.100.007", // not an address: as sent
		"2001:db8:1:2::/64":    "remote_address=2001:db8:1:2::/64",
		"2001:DB8:1:2::/64":    "remote_address=2001:db8:1:2::/64", // a group's key, however spelled
		"2001:db8:1:2::7/64":   "remote_address=2001:db8:1:2::/64",
		"2001:DB8::/48":        "remote_address=2001:DB8::/48", // no group of /64: as sent
		"[2001:db8:1:2::1]":    "remote_address=[2001:db8:1:2::1]",
		"not-an-ip":            "remote_address=not-an-ip",
	} {
		if got := key(Entry{"remote_address", value}); got != want {
			t.Errorf("%s: key %q, want %q", value, got, want)
		}
	}
	if m, _ := dom.Match([]Entry{{"remote_address", "2001:db8:1:2::99"}}); !m.RateLimit.Blocked || m.Key != "remote_address=2001:db8:1:2::99" {
		t.Errorf("the exact value: %+v, want its own blocked descriptor", m)
	}
	if got := key(Entry{"client", "a"}, Entry{"remote_address", "2001:db8:1:2::1"}); got != "client=a,remote_address=2001:db8:1::/48" {
		t.Errorf("nested: key %q", got)
	}
	for _, v := range []string{"2001:db8:1:2::1", "::ffff:198.51.100.7"} {
		if got := key(Entry{"plain_address", v}); got != "plain_address="+v {
			t.Errorf("without ipv6_prefix: key %q, want the value as sent", got)
		}
	}
	// A sluice-format policy groups every variable's address.
	for _, tt := range []struct{ user, ip, want string }{
		{"bob", "2001:db8:1:2ff::1", "bob:2001:db8:1:200::/56"},
		{"bob", "::ffff:10.0.0.1", "bob:10.0.0.1"},
		{"2001:db8::1", "10.0.0.1", "2001%3Adb8%3A%3A/56:10.0.0.1"},
	} {
		if got := key(Entry{"user", tt.user}, Entry{"ip", tt.ip}); got != tt.want {
			t.Errorf("login %s %s: key %q, want %q", tt.user, tt.ip, got, tt.want)
		}
	}
}

// The JSON API reaches a grouped descriptor's counter by its grouped key
// only; CountedKey names it for an address.
func TestIPv6PrefixReaches(t *testing.T) {
	t.Parallel()
	cfg := mustConfig(t, ipv6Config)
	p := cfg.Policy("edge.remote_address")
	if !cfg.Reaches(p, "remote_address=2001:db8:1:2::/64") || !cfg.Reaches(p, "remote_address=198.51.100.7") {
		t.Error("grouped keys do not reach")
	}
	if cfg.Reaches(p, "remote_address=2001:db8:1:2::1") || cfg.Reaches(p, "remote_address=::ffff:198.51.100.7") {
		t.Error("an address its group stands for reaches a counter of its own")
	}
	if got, ok := cfg.CountedKey(p, "remote_address=2001:db8:1:2::1"); !ok || got != "remote_address=2001:db8:1:2::/64" {
		t.Errorf("CountedKey = %q, %v", got, ok)
	}
}

// A sluice-format policy's JSON key is the grouped one too: a key whose
// template value is one address of a group (or a group spelled another
// way) is a counter RLS never reaches.
func TestIPv6PrefixReachesSluiceFormat(t *testing.T) {
	t.Parallel()
	cfg := mustConfig(t, ipv6Config+`  - name: perip
    limit: 2/min
    key: "{remote_address}"
    ipv6_prefix: 64
  - name: tagged
    limit: 2/min
    key: "ip:{addr}:end"
    ipv6_prefix: 64
`)
	for _, tt := range []struct{ policy, key, counted string }{
		{"perip", "2001:db8:1:2::/64", ""},
		{"perip", "198.51.100.7", ""},
		{"perip", "not-an-ip", ""},
		{"perip", "2001:DB8:1:2::/64", "2001:db8:1:2::/64"},
		{"perip", "2001:db8:1:2::10", "2001:db8:1:2::/64"},
		{"perip", "2001:db8:1:2::13", "2001:db8:1:2::/64"},
		{"perip", "::ffff:198.51.100.7", "198.51.100.7"},
		{"perip", "fe80::1%25eth0", "fe80::/64"}, // a value's '%' is escaped
		{"tagged", "ip:2001:db8:1:2::10:end", "ip:2001:db8:1:2::/64:end"},
		{"tagged", "ip:2001:db8:1:2::/64:end", ""},
		{"tagged", "2001:db8:1:2::10", ""}, // fits no descriptor's key: as before
		{"login", "bob:2001:db8:1:2ff::1", "bob:2001:db8:1:200::/56"},
		{"login", "bob:2001:db8:1:200::/56", ""},
		{"login", "2001%3Adb8%3A%3A1:10.0.0.1", "2001%3Adb8%3A%3A/56:10.0.0.1"},
		{"login", "2001%3Adb8%3A%3A/56:::ffff:10.0.0.1", "2001%3Adb8%3A%3A/56:10.0.0.1"},
	} {
		p := cfg.Policy(tt.policy)
		got, ok := cfg.CountedKey(p, tt.key)
		if reaches := cfg.Reaches(p, tt.key); reaches != (tt.counted == "") || got != tt.counted || ok != (tt.counted != "") {
			t.Errorf("%s key %q: Reaches %v, CountedKey %q %v; want counted %q", tt.policy, tt.key, reaches, got, ok, tt.counted)
		}
	}
}

func TestIPv6PrefixErrors(t *testing.T) {
	checkErrors(t, []errorCase{
		{"exact value", "domain: d\ndescriptors:\n  - key: a\n    value: x\n    ipv6_prefix: 64\n    rate_limit: {unit: second, requests_per_unit: 1}\n", `5:18: ipv6_prefix groups the addresses a descriptor matches, but 'a_x' matches the value "x" only`},
		{"zero", "domain: d\ndescriptors:\n  - key: a\n    ipv6_prefix: 0\n", `4:18: ipv6_prefix 0 is out of range [1, 128]`},
		{"too long", "policies:\n  - name: a\n    limit: 1/s\n    ipv6_prefix: 129\n", `4:18: ipv6_prefix 129 is out of range [1, 128]`},
		{"not a number", "policies:\n  - name: a\n    limit: 1/s\n    ipv6_prefix: /64\n", `4:18: ipv6_prefix: want an integer`},
		{"override of one address", "policies:\n  - name: a\n    limit: 1/s\n    key: \"{user}:{ip}\"\n    ipv6_prefix: 64\n    overrides:\n      - match: [\"vip:2001:db8:1:2::/64\", \"vip:2001:db8:1:2::5\"]\n        limit: 100/s\n", `7:42: override match "vip:2001:db8:1:2::5" never applies: ipv6_prefix 64 keys its address by group, as "vip:2001:db8:1:2::/64"`},
		{"in-flight", "policies:\n  - name: a\n    ipv6_prefix: 64\n    in_flight: {max: 1, hold: 1s}\n", `3:18: policy "a" is an in-flight policy: it takes no ipv6_prefix`},
	})
}

func TestDescribeIPv6Prefix(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	mustConfig(t, ipv6Config).Describe(&b)
	for _, want := range []string{"  remote_address: fixed_window 2/min, ipv6_prefix 64\n", "    remote_address: fixed_window 5/min, ipv6_prefix 48\n", ", key {user}:{ip}, ipv6_prefix 56\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Describe lacks %q:\n%s", want, b.String())
		}
	}
}
