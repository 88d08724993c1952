package config

import (
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

func TestParseInFlightPolicy(t *testing.T) {
	cfg := mustConfig(t, `
policies:
  - name: exports
    key: "{user}"
    in_flight:
      max: 20
      hold: 30s
      reserve: {critical: 0.2, normal: 0.3}
  - name: uploads
    in_flight: {max: 5, hold: 1m}
  - name: api
    limit: 100/min
    key: "{user}:{route}"
`)
	exports, uploads := cfg.Policy("exports"), cfg.Policy("uploads")
	if exports.InFlight == nil || uploads.InFlight == nil {
		t.Fatalf("InFlight unset: exports %v, uploads %v", exports.InFlight, uploads.InFlight)
	}
	checkValues(t, []valueCase{
		{"exports limit", exports.InFlight.Limit, sluice.Concurrent(20, 30*time.Second)},
		{"exports reserve", exports.InFlight.Reserve, sluice.Reserve{Critical: 0.2, Normal: 0.3}},
		{"exports key", exports.Key, "{user}"},
		{"uploads limit", uploads.InFlight.Limit, sluice.Concurrent(5, time.Minute)},
		{"uploads reserves nothing", uploads.InFlight.Reserve, sluice.Reserve{}},
		{"uploads default key", uploads.Key, "{key}"},
		{"rate policy stays one", cfg.Policy("api").InFlight == nil, true},
		{"string", exports.InFlight.String(), "20 in flight (hold 30s), reserve critical 0.2, normal 0.3"},
	})
}

// TestInFlightConfigErrors: every bad in-flight policy is refused with its
// file:line:column.
func TestInFlightConfigErrors(t *testing.T) {
	checkErrors(t, []errorCase{
		{"max zero", "policies:\n  - name: a\n    in_flight: {max: 0, hold: 1s}\n", `3:22: max 0 is out of range [1, 1000000]`},
		{"max negative", "policies:\n  - name: a\n    in_flight: {max: -3, hold: 1s}\n", `3:22: max -3 is out of range`},
		{"max not a number", "policies:\n  - name: a\n    in_flight: {max: many, hold: 1s}\n", `3:22: max: want an integer`},
		{"hold zero", "policies:\n  - name: a\n    in_flight: {max: 1, hold: 0s}\n", `3:31: hold "0s": want a duration between 1µs and 24h0m0s`},
		{"hold negative", "policies:\n  - name: a\n    in_flight: {max: 1, hold: -1s}\n", `3:31: hold "-1s"`},
		{"hold above MaxHold", "policies:\n  - name: a\n    in_flight: {max: 1, hold: 25h}\n", `3:31: hold "25h"`},
		{"hold not a duration", "policies:\n  - name: a\n    in_flight: {max: 1, hold: soon}\n", `3:31: hold "soon"`},
		{"missing hold", "policies:\n  - name: a\n    in_flight: {max: 1}\n", `3:16: policy "a": in_flight needs max`},
		{"reserve above one", "policies:\n  - name: a\n    in_flight:\n      max: 1\n      hold: 1s\n      reserve: {critical: 0.8, normal: 0.3}\n", `6:16: sluice: invalid priority: reserve critical 0.8, normal 0.3`},
		{"reserve negative", "policies:\n  - name: a\n    in_flight:\n      max: 1\n      hold: 1s\n      reserve: {normal: -0.1}\n", `6:16: sluice: invalid priority`},
		{"reserve not a number", "policies:\n  - name: a\n    in_flight:\n      max: 1\n      hold: 1s\n      reserve: {critical: most}\n", `6:27: want a share such as 0.2`},
		{"reserve unknown priority", "policies:\n  - name: a\n    in_flight:\n      max: 1\n      hold: 1s\n      reserve: {sheddable: 0.1}\n", `6:17: unknown field "sheddable"`},
		{"unknown in_flight field", "policies:\n  - name: a\n    in_flight: {max: 1, hold: 1s, weight: 2}\n", `3:35: unknown field "weight"`},
		{"with a limit", "policies:\n  - name: a\n    limit: 1/s\n    in_flight: {max: 1, hold: 1s}\n", `3:12: policy "a" is an in-flight policy: it takes no limit`},
		{"with a cost", "policies:\n  - name: a\n    cost: 2\n    in_flight: {max: 1, hold: 1s}\n", `3:11: policy "a" is an in-flight policy: it takes no cost`},
		{"with a strategy", "policies:\n  - name: a\n    strategy: shadow\n    in_flight: {max: 1, hold: 1s}\n", `3:15: policy "a" is an in-flight policy: it takes no strategy`},
		{"with overrides", "policies:\n  - name: a\n    overrides: []\n    in_flight: {max: 1, hold: 1s}\n", `3:16: policy "a" is an in-flight policy: it takes no overrides`},
		{"bad key template", "policies:\n  - name: a\n    key: '{u'\n    in_flight: {max: 1, hold: 1s}\n", `3:10: key "{u": unclosed '{'`},
		{"not a mapping", "policies:\n  - name: a\n    in_flight: 20\n", `3:16: want a mapping`},
		{"duplicate name", "policies:\n  - name: a\n    limit: 1/s\n  - name: a\n    in_flight: {max: 1, hold: 1s}\n", `4:11: duplicate policy name "a"`},
	})
}

// TestInFlightPolicyNotOverRLS: descriptors never match an in-flight
// policy, by its template or by name, so it takes no descriptor
// signature from a rate policy either.
func TestInFlightPolicyNotOverRLS(t *testing.T) {
	cfg := mustConfig(t, `
policies:
  - name: exports
    key: "{user}"
    in_flight: {max: 2, hold: 10s}
  - name: api
    limit: 10/s
    key: "[{user}]"
`)
	d := cfg.Domain(DefaultDomain)
	m, ok := d.Match([]Entry{{"user", "ann"}})
	if !ok || m.Policy != cfg.Policy("api") {
		t.Errorf("{user} matched %+v, %v; want the rate policy api", m, ok)
	}
	if m, ok := d.Match([]Entry{{"policy", "exports"}, {"user", "ann"}}); ok {
		t.Errorf("a descriptor naming the in-flight policy matched %+v", m)
	}
}

func TestDescribeInFlight(t *testing.T) {
	cfg := mustConfig(t, `
policies:
  - name: exports
    key: "{user}"
    in_flight: {max: 20, hold: 30s, reserve: {critical: 0.2}}
`)
	var b strings.Builder
	cfg.Describe(&b)
	want := "  policy exports: 20 in flight (hold 30s), reserve critical 0.2, normal 0, key {user}; JSON API only (acquire, extend, release), not offered over Envoy RLS\n"
	if !strings.Contains(b.String(), want) {
		t.Errorf("Describe:\n%s\nlacks:\n%s", b.String(), want)
	}
}
