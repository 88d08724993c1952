package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
)

// envoyproxy/ratelimit's own test and example configurations load where
// upstream's tests load them, and fail where upstream's fail, with errors
// that name file:line:column. Every policy name they make passes the one
// name rule.
func TestUpstreamConfigs(t *testing.T) {
	t.Parallel()
	dir := filepath.Join("testdata", "envoyproxy-ratelimit")
	tests := []struct {
		file, err string // err: "" loads, else a substring after "file:"
	}{
		{"test-config/basic_config.yaml", ""},
		{"test-config/duplicate_domain.yaml", ""}, // a duplicate only beside basic_config.yaml
		{"test-config/merge_domain_key1.yaml", ""},
		{"test-config/merge_domain_key2.yaml", ""},
		{"test-config/metadata.yaml", ""},
		{"test-config/shadowmode_config.yaml", ""},
		{"test-config/share_threshold.yaml", ""},
		{"test-config/wildcard.yaml", ""},
		{"examples/config.yaml", ""},
		{"examples/example.yaml", ""},
		{"test-config/bad_limit_unit.yaml", "6:13: invalid rate limit unit 'foo'"},
		{"test-config/bad_yaml.yaml", "2:1: found unexpected end of stream"},
		{"test-config/duplicate_key.yaml", "6:5: duplicate descriptor composite key 'test-domain.key1_value1'"},
		{"test-config/empty_domain.yaml", "1:1: envoy ratelimit config needs a domain"},
		{"test-config/empty_key.yaml", "3:5: descriptor has empty key"},
		{"test-config/misspelled_key.yaml", `5:5: unknown field "ratelimit"`},
		{"test-config/misspelled_key2.yaml", `7:7: unknown field "requestsperunit"`},
		{"test-config/non_map_list.yaml", `3:5: want a mapping, got "a"`},
		{"test-config/non_string_key.yaml", `1:1: unknown field "0.25"`},
		{"test-config/replaces_empty.yaml", "10:15: should not have an empty replaces entry"},
		{"test-config/replaces_self.yaml", "10:21: replaces should not contain name of same descriptor"},
		{"test-config/unlimited_with_unit.yaml", "6:13: should not specify rate limit unit when unlimited"},
		{"unit-multiplier/unit_multiplier.yaml", ""},
		{"unit-multiplier/zero_unit_multiplier.yaml", "8:24: invalid unit multiplier of 0"},
	}
	files, err := filepath.Glob(filepath.Join(dir, "*", "*.yaml"))
	if err != nil || len(files) != len(tests) {
		t.Fatalf("%d files in %s (%v), %d in the table: every upstream file has a row", len(files), dir, err, len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			path := filepath.Join(dir, tt.file)
			cfg, err := Load(path)
			if tt.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range cfg.Policies {
					if err := enforce.ValidateName(p.Name); err != nil {
						t.Errorf("policy name: %v", err)
					}
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), path+":"+tt.err) {
				t.Errorf("err = %v, want %s:%s", err, path, tt.err)
			}
		})
	}
	if _, err := Load(filepath.Join(dir, "test-config")); err == nil {
		t.Error("the whole directory loaded, with its broken files")
	}
}

// Anchors, aliases and merge keys load, as upstream's YAML library reads
// them; errors inside merged or aliased values still name their position.
func TestYAMLAnchorsAndMerges(t *testing.T) {
	t.Parallel()
	cfg := mustConfig(t, `
domain: d
descriptors:
  - key: a
    rate_limit: &per_sec {unit: second, requests_per_unit: 5}
  - key: b
    rate_limit: *per_sec
  - key: c
    rate_limit:
      <<: *per_sec
      requests_per_unit: 7
  - key: e
    rate_limit:
      <<: [{unit: minute}, *per_sec]
      name: x
`)
	var b strings.Builder
	cfg.Describe(&b)
	for _, want := range []string{"  a: fixed_window 5/s\n", "  b: fixed_window 5/s\n", "  c: fixed_window 7/s\n", "  e: fixed_window 5/min, name x\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Describe lacks %q:\n%s", want, b.String())
		}
	}
	_, err := Parse("test.yaml", []byte("domain: d\ndefaults: &d {unit: second, request_per_unit: 5}\n"))
	if err == nil || !strings.Contains(err.Error(), `test.yaml:2:1: unknown field "defaults"`) {
		t.Errorf("err = %v", err)
	}
	_, err = Parse("test.yaml", []byte("domain: d\ndescriptors:\n  - key: a\n    rate_limit: &x {unit: second, request_per_unit: 5}\n  - key: b\n    rate_limit:\n      <<: *x\n"))
	if err == nil || !strings.Contains(err.Error(), `test.yaml:4:35: unknown field "request_per_unit"`) {
		t.Errorf("err = %v", err)
	}
}

// A '*' anywhere in a descriptor value matches any run of characters, as
// in envoyproxy/ratelimit; share_threshold shares one counter per pattern.
func TestWildcardValues(t *testing.T) {
	t.Parallel()
	cfg := mustConfig(t, `
domain: d
descriptors:
  - key: path
    value: /api*v1
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: path
    value: svc*ep*rpc
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: path
    value: /static/*
    rate_limit: {unit: minute, requests_per_unit: 3}
`)
	dom := cfg.Domain("d")
	for _, tt := range []struct{ value, policy, key string }{
		{"/api/users/v1", "d.path_/api*v1", "path=/api*v1"},
		{"/apiv1", "d.path_/api*v1", "path=/api*v1"},
		{"svc-a.ep-b.rpc", "d.path_svc*ep*rpc", "path=svc-a.ep-b.rpc"},
		{"svcrpc", "", ""},
		{"/static/a.css", "d.path_/static/*", "path=/static/a.css"},
		{"/api/v2", "", ""},
	} {
		m, ok := dom.Match([]Entry{{"path", tt.value}})
		if got := ""; ok {
			got = m.RateLimit.Policy.Name
			if got != tt.policy || m.Key != tt.key {
				t.Errorf("%s: %s key %q, want %s key %q", tt.value, got, m.Key, tt.policy, tt.key)
			}
		} else if tt.policy != "" {
			t.Errorf("%s: no match, want %s", tt.value, tt.policy)
		}
	}
}

// A YAML error names the line that broke the file, not the line where the
// construct it broke began.
func TestYAMLErrorLine(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ yaml, want string }{
		{"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n     requests_per_unit: 3\n", "test.yaml:6:6: "},
		{"policies:\n  - name: a\n    limit: 1/s\n  - name: b\n   limit: 2/s\n", "test.yaml:5:4: "},
	} {
		if _, err := Parse("test.yaml", []byte(tt.yaml)); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("err = %v, want %s...", err, tt.want)
		}
	}
}

// unit_multiplier makes the window unit×N, as in envoyproxy/ratelimit.
func TestUnitMultiplier(t *testing.T) {
	t.Parallel()
	cfg, err := Load(filepath.Join("testdata", "envoyproxy-ratelimit", "unit-multiplier", "unit_multiplier.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		policy string
		limit  sluice.Limit
	}{
		{"test-domain.key1", sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 20, Period: 5 * time.Minute}},
		{"test-domain.key2", sluice.Limit{Algorithm: sluice.FixedWindow, Rate: 25, Period: time.Minute}},
	} {
		if p := cfg.Policy(tt.policy); p == nil || p.Limit != tt.limit {
			t.Errorf("%s: %+v, want %v", tt.policy, p, tt.limit)
		}
	}
	m, ok := cfg.Domain("test-domain").Match([]Entry{{"key1", "x"}})
	if !ok || m.RateLimit.Unit != time.Minute || m.RateLimit.Period != 5*time.Minute {
		t.Errorf("match %+v: want unit 1m, window 5m", m.RateLimit)
	}
	_, err = Parse("test.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: year, requests_per_unit: 1, unit_multiplier: 2}\n"))
	if err == nil || !strings.Contains(err.Error(), "test.yaml:4:") {
		t.Errorf("two years: %v", err)
	}
}
