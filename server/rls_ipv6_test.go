package server

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Per-address limits through a real sluice serve's RLS: with ipv6_prefix,
// one host rotating the low bits of its /64 shares one budget, and an
// IPv4-mapped address counts as its IPv4 address; without it, each value
// as sent has its own, as envoyproxy/ratelimit keys them.
func TestRLSIPv6PrefixGroupsAddresses(t *testing.T) {
	const rule = "domain: edge_proxy_per_ip\ndescriptors:\n  - key: remote_address\n%s    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n"
	run := func(t *testing.T, grouped bool) (admitted int, mapped []string, p *proc) {
		extra := ""
		if grouped {
			extra = "    ipv6_prefix: 64\n"
		}
		cfg := writeConfig(t, fmt.Sprintf(rule, extra))
		p = startSluice(t, []string{"SLUICE_CONFIG=" + cfg, "SLUICE_HTTP_ADDR=127.0.0.1:0", "SLUICE_GRPC_ADDR=127.0.0.1:0"})
		c := dialRLS(t, p.grpc)
		ask := func(ip string) rlsv3.RateLimitResponse_Code {
			return call(t, c, rlsRequest("edge_proxy_per_ip", desc("remote_address="+ip))).OverallCode
		}
		for i := 1; i <= 50; i++ {
			for range 3 {
				if ask(fmt.Sprintf("2001:db8:1:2::%x", i)) == rlsv3.RateLimitResponse_OK {
					admitted++
				}
			}
		}
		for _, ip := range []string{"198.51.100.7", "198.51.100.7", "::ffff:198.51.100.7", "::ffff:c633:6407"} {
			mapped = append(mapped, short(ask(ip)))
		}
		return admitted, mapped, p
	}
	t.Run("ipv6_prefix 64", func(t *testing.T) {
		admitted, mapped, p := run(t, true)
		if admitted != 2 {
			t.Errorf("one /64, 50 addresses × 3 requests, 2/min per address: %d admitted, want 2", admitted)
		}
		if got := strings.Join(mapped, " "); got != "OK OK OVER OVER" {
			t.Errorf("198.51.100.7 twice, then IPv4-mapped twice: %s, want OK OK OVER OVER", got)
		}
		// The JSON API shares the group's counter, under the group's key.
		pol := "edge_proxy_per_ip.remote_address"
		if code, m := p.post(t, "/v1/check", `{"policy":"`+pol+`","key":"remote_address=2001:db8:1:2::/64"}`); code != 429 {
			t.Errorf("JSON check of the /64: %d %v, want 429 (its budget spent over RLS)", code, m)
		}
		if code, m := p.post(t, "/v1/check", `{"policy":"`+pol+`","key":"remote_address=2001:db8:1:2::1"}`); code != 400 || !strings.Contains(fmt.Sprint(m["detail"]), `"remote_address=2001:db8:1:2::/64"`) {
			t.Errorf("JSON check of an address of the /64: %d %v, want 400 naming the /64's key", code, m)
		}
		p.stop(t)
	})
	t.Run("default, as envoyproxy/ratelimit", func(t *testing.T) {
		admitted, mapped, p := run(t, false)
		if admitted != 100 {
			t.Errorf("50 addresses × 3 requests, 2/min per address: %d admitted, want 100", admitted)
		}
		if got := strings.Join(mapped, " "); got != "OK OK OK OK" {
			t.Errorf("198.51.100.7 twice, then two IPv4-mapped spellings: %s, want each its own budget", got)
		}
		p.stop(t)
	})
}

// The JSON API keys a grouped policy as RLS does, against a real sluice
// serve: on a sluice-format policy the addresses of a /64 (and an
// IPv4-mapped one) are 400 naming the group's key, which shares RLS's
// counter; on an Envoy-format one a group spelled in upper case is 400
// too. check-config refuses an override that names one address.
func TestJSONIPv6PrefixKeysAsRLS(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "c.yaml")
	const yaml = `domain: edge
descriptors:
  - key: remote_address
    ipv6_prefix: 64
    rate_limit: {unit: minute, requests_per_unit: 2}
policies:
  - name: perip
    limit: 2/min
    key: "{remote_address}"
    ipv6_prefix: 64
`
	if err := os.WriteFile(cfg, []byte(yaml), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, []string{"SLUICE_CONFIG=" + cfg, "SLUICE_HTTP_ADDR=127.0.0.1:0", "SLUICE_GRPC_ADDR=127.0.0.1:0"})
	c := dialRLS(t, p.grpc)
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		if got := call(t, c, rlsRequest("edge", desc("policy=perip", fmt.Sprintf("remote_address=2001:db8:1:2::%d", i+1)))).OverallCode; got != want {
			t.Fatalf("RLS request %d: %s, want %s", i+1, got, want)
		}
	}
	check := func(policy, key string, want int, detail string) {
		t.Helper()
		code, m := p.post(t, "/v1/check", fmt.Sprintf(`{"policy":%q,"key":%q}`, policy, key))
		if code != want || !strings.Contains(fmt.Sprint(m["detail"]), detail) {
			t.Errorf("check %s %q: %d %v, want %d with detail naming %s", policy, key, code, m, want, detail)
		}
	}
	for i := 10; i <= 13; i++ {
		check("perip", fmt.Sprintf("2001:db8:1:2::%d", i), 400, `"2001:db8:1:2::/64"`)
	}
	check("perip", "::ffff:198.51.100.7", 400, `"198.51.100.7"`)
	check("perip", "2001:DB8:1:2::/64", 400, `"2001:db8:1:2::/64"`)
	check("perip", "2001:db8:1:2::/64", 429, "") // RLS spent the group's budget
	check("perip", "198.51.100.7", 200, "")
	pol := "edge.remote_address"
	check(pol, "remote_address=2001:DB8:1:2::/64", 400, `"remote_address=2001:db8:1:2::/64"`)
	check(pol, "remote_address=2001:db8:1:2::/64", 200, "")
	p.stop(t)

	bad := filepath.Join(dir, "override.yaml")
	if err := os.WriteFile(bad, []byte(`policies:
  - name: login
    limit: 5/min
    key: "{user}:{ip}"
    ipv6_prefix: 64
    overrides:
      - match: "vip:2001:db8:1:2::5"
        limit: 100/min
`), 0o600); err != nil {
		t.Fatal(err)
	}
	if code, stderr := runSluice(t, nil, "check-config", bad); code == 0 || !strings.Contains(stderr, bad+`:7:16: override match "vip:2001:db8:1:2::5" never applies`) {
		t.Errorf("check-config: exit %d, want an error at %s:7:16; stderr:\n%s", code, bad, stderr)
	}
}
