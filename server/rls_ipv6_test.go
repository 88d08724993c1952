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
		cfg := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(cfg, []byte(fmt.Sprintf(rule, extra)), 0o600); err != nil {
			t.Fatal(err)
		}
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
