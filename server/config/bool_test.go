package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// boolFields are every boolean of both formats, each as a configuration
// that sets it to VALUE and a reading of the loaded value.
var boolFields = []struct {
	name string
	yaml string // with VALUE for the value
	line int    // of the value
	read func(*Config) bool
}{
	{"allow_empty", "allow_empty: VALUE\npolicies: []\n", 1, func(c *Config) bool { return c.AllowEmpty }},
	{"expose_keys", "policies:\n  - name: a\n    limit: 1/s\n    expose_keys: VALUE\n", 4, func(c *Config) bool { return c.Policy("a").ExposeKeys }},
	{"shadow_mode", "domain: d\ndescriptors:\n  - key: k\n    shadow_mode: VALUE\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 4, func(c *Config) bool { return c.Policy("d.k").Strategy != 0 }},
	{"quota_mode", "domain: d\ndescriptors:\n  - key: k\n    quota_mode: VALUE\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 4, func(c *Config) bool { return c.Policy("d.k").Strategy != 0 }},
	{"unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: VALUE\n", 5, func(c *Config) bool { return c.Policy("d.k") == nil }},
	{"share_threshold", "domain: d\ndescriptors:\n  - key: k\n    value: 'a*'\n    share_threshold: VALUE\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 5, nil},
	{"detailed_metric", "domain: d\ndescriptors:\n  - key: k\n    detailed_metric: VALUE\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 4, nil},
	{"value_to_metric", "domain: d\ndescriptors:\n  - key: k\n    value_to_metric: VALUE\n    rate_limit: {unit: second, requests_per_unit: 1}\n", 4, nil},
}

// TestBooleansAreYAMLBooleans: every boolean field takes true or false,
// unquoted (and YAML's True, FALSE...), and nothing else: a quoted
// "true" was refused while YAML 1.1's yes, on, y, quoted or not, loaded
// as true (allow_empty: "yes" served no policies, expose_keys: "on" showed
// raw keys). Each refusal names file:line:column, the field, and what is
// accepted.
func TestBooleansAreYAMLBooleans(t *testing.T) {
	for _, f := range boolFields {
		for value, want := range map[string]bool{"true": true, "false": false, "True": true, "FALSE": false} {
			t.Run(f.name+"="+value, func(t *testing.T) {
				if f.name == "unlimited" && !want {
					t.Skip("unlimited: false with no unit is another error")
				}
				cfg, err := Parse("test.yaml", []byte(strings.ReplaceAll(f.yaml, "VALUE", value)))
				if err != nil {
					t.Fatalf("%s: %v", value, err)
				}
				if f.read != nil && f.read(cfg) != want {
					t.Errorf("%s: %s: %v, want %v", f.name, value, f.read(cfg), want)
				}
			})
		}
		for _, value := range []string{`"true"`, `'false'`, `"yes"`, `yes`, `on`, `"on"`, `no`, `off`, `y`, `Y`, `1`, `0`, `"1"`, `null`, `[true]`, `{a: true}`} {
			t.Run(f.name+"="+value, func(t *testing.T) {
				yaml := strings.ReplaceAll(f.yaml, "VALUE", value)
				_, err := Parse("test.yaml", []byte(yaml))
				if err == nil {
					t.Fatalf("%s: %s loaded, want an error", f.name, value)
				}
				if !errors.Is(err, ErrConfig) {
					t.Errorf("error %v does not wrap ErrConfig", err)
				}
				col := strings.Index(strings.Split(yaml, "\n")[f.line-1], f.name+": ") + len(f.name) + 3
				want := fmt.Sprintf("test.yaml:%d:%d: %s: want true or false, unquoted, got ", f.line, col, f.name)
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error:\n  %v\nwant it to contain:\n  %s", err, want)
				}
				if quoted := strings.HasPrefix(value, `"`) || strings.HasPrefix(value, `'`); quoted && !strings.Contains(err.Error(), "a quoted string") {
					t.Errorf("error %v does not say the value is quoted", err)
				}
			})
		}
	}
}
