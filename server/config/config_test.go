package config

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
)

func TestParseSluiceConfig(t *testing.T) {
	cfg := mustConfig(t, `
domain: edge
policies:
  - name: api
    limit: 100/min burst 20
    key: "{api_key}"
    overrides:
      - match: premium-*
        limit: 1000/min
      - match: [partner-a, partner-b]
        limit: token_bucket 50/s
      - match: partner-*
        limit: 500/min
  - name: login
    algorithm: sliding_window_log
    limit: 5/15m
    cost: 1
    strategy: shadow
  - name: export
    limit: 10/h
    burst: 3
    cost: 2
    lease: 1m
  - name: same
    limit: 10/h burst 3
    burst: 3
`)
	if got, want := len(cfg.Policies), 4; got != want {
		t.Fatalf("%d policies, want %d", got, want)
	}
	api, login, export, same := cfg.Policy("api"), cfg.Policy("login"), cfg.Policy("export"), cfg.Policy("same")
	checkValues(t, []valueCase{
		{"api limit", api.Limit, sluice.Limit{Rate: 100, Period: time.Minute, Burst: 20}},
		{"api key", api.Key, "{api_key}"},
		{"api domain", api.Domain, "edge"},
		{"premium override keeps GCRA", api.LimitFor("premium-42"), sluice.Limit{Rate: 1000, Period: time.Minute}},
		{"partner override names its algorithm", api.LimitFor("partner-b"), sluice.Limit{Algorithm: sluice.TokenBucket, Rate: 50, Period: time.Second}},
		{"a wider match after narrower ones", api.LimitFor("partner-c"), sluice.Limit{Rate: 500, Period: time.Minute}},
		{"others get the policy's limit", api.LimitFor("gold-c"), api.Limit},
		{"login algorithm field", login.Limit, sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 5, Period: 15 * time.Minute}},
		{"login strategy", login.Strategy, enforce.Shadow},
		{"login default key", login.Key, "{key}"},
		{"export burst field", export.Limit, sluice.Limit{Rate: 10, Period: time.Hour, Burst: 3}},
		{"the same burst twice", same.Limit, sluice.Limit{Rate: 10, Period: time.Hour, Burst: 3}},
		{"export cost", export.Cost, int64(2)},
		{"export lease", export.Lease, time.Minute},
		{"api has no lease", api.Lease, time.Duration(0)},
		{"domains", strings.Join(cfg.Domains(), ","), "edge"},
	})
}

// valueCase is a value read from a configuration and the one wanted.
type valueCase struct {
	name      string
	got, want any
}

func checkValues(t *testing.T, tests []valueCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got != tt.want {
				t.Errorf("got %v, want %v", tt.got, tt.want)
			}
		})
	}
}

// TestConfigErrors: every error names file:line:column, and decoding is
// strict.
func TestConfigErrors(t *testing.T) {
	checkErrors(t, []errorCase{
		{"unknown top-level field", "policies: []\nlimits: 3\n", `2:1: unknown field "limits"`},
		{"unknown policy field", "policies:\n  - name: a\n    limit: 1/s\n    burts: 3\n", `4:5: unknown field "burts"`},
		{"unknown envoy field", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      request_per_unit: 3\n", `6:7: unknown field "request_per_unit" (want one of algorithm, name, replaces, requests_per_unit, unit, unit_multiplier, unlimited)`},
		{"bad limit", "policies:\n  - name: a\n    limit: 10/fortnight\n", `3:12: sluice: invalid limit`},
		{"bad algorithm", "policies:\n  - name: a\n    limit: 1/s\n    algorithm: bogus\n", `4:16: sluice: invalid limit: unknown algorithm "bogus"`},
		{"algorithm contradicts limit", "policies:\n  - name: a\n    limit: token_bucket 1/s\n    algorithm: gcra\n", `4:16: algorithm gcra contradicts`},
		{"burst contradicts limit", "policies:\n  - name: a\n    limit: 10/min burst 5\n    burst: 7\n", `4:12: burst 7 contradicts the limit's burst 5: give the burst once`},
		{"override burst contradicts its limit", "policies:\n  - name: a\n    limit: 10/min\n    overrides:\n      - {match: x, limit: 20/min burst 5, burst: 6}\n", `5:50: burst 6 contradicts the limit's burst 5`},
		{"window with burst", "policies:\n  - name: a\n    limit: fixed_window 5/s\n    burst: 9\n", `4:12: sluice: invalid limit`},
		{"missing name", "policies:\n  - limit: 1/s\n", `2:5: policy needs a name`},
		{"missing limit", "policies:\n  - name: a\n", `2:5: policy "a" needs a limit`},
		{"bad name", "policies:\n  - name: ''\n    limit: 1/s\n", `2:11: policy name ""`},
		{"duplicate name", "policies:\n  - name: a\n    limit: 1/s\n  - name: a\n    limit: 2/s\n", `4:11: duplicate policy name "a" (first at test.yaml:2)`},
		{"duplicate field", "policies:\n  - name: a\n    limit: 1/s\n    limit: 2/s\n", `4:5: duplicate field "limit"`},
		{"reserved name", "domain: d\npolicies:\n  - name: d.override\n    limit: 1/s\n    lease: 50ms\n", `3:11: policy name "d.override" is reserved`},
		{"bad strategy", "policies:\n  - name: a\n    limit: 1/s\n    strategy: delay\n", `4:15: strategy "delay": want reject or shadow`},
		{"cost above burst", "policies:\n  - name: a\n    limit: 1/s\n    cost: 2\n", `4:11: sluice: cost exceeds burst`},
		{"cost not a number", "policies:\n  - name: a\n    limit: 1/s\n    cost: lots\n", `4:11: cost: want an integer`},
		{"bad key template", "policies:\n  - name: a\n    limit: 1/s\n    key: '{user'\n", `4:10: key "{user": unclosed '{'`},
		{"template variable too long", "policies:\n  - name: a\n    limit: 1/s\n    key: '{" + strings.Repeat("v", 129) + "}'\n", `4:10: key "{` + strings.Repeat("v", 129) + `}": variable {vvvvvvvvvvvvvvvv…} is 129 bytes long: at most 128`},
		{"adjacent template variables", "policies:\n  - name: a\n    limit: 1/s\n    key: '{u}{r}'\n", `4:10: key "{u}{r}": variables {u} and {r} need text between them without '%', or their values could not be told apart`},
		{"raw percent around a template variable", "policies:\n  - name: a\n    limit: 1/s\n    key: '100%:{u}'\n", `4:10: key "100%:{u}": the text around its variables: "%:" is not an escape: write a '%' of the key's text as %25`},
		{"percent between template variables", "policies:\n  - name: a\n    limit: 1/s\n    key: '{u}%{r}'\n", `4:10: key "{u}%{r}": variables {u} and {r} need text between them without '%', or their values could not be told apart`},
		{"template without variables", "policies:\n  - name: a\n    limit: 1/s\n    key: fixed\n", `4:10: key "fixed": needs at least one {variable}`},
		{"unquoted template", "policies:\n  - name: a\n    limit: 1/s\n    key: {user}\n", `4:10: key is a YAML mapping, not a template: quote the braces (key: "{user}")`},
		{"unquoted template with text after it", "policies:\n  - name: a\n    limit: 1/s\n    key: {user}:{id}\n", `4:5: did not find expected key: a value that starts with '{' is a YAML mapping; quote it (key: "{user}:{id}")`},
		{"unquoted in-flight template", "policies:\n  - name: a\n    in_flight: {max: 3, hold: 10s}\n    key: {user}\n", `4:10: key is a YAML mapping, not a template: quote the braces (key: "{user}")`},
		{"template not a string", "policies:\n  - name: a\n    limit: 1/s\n    key: [user]\n", `4:10: want a string, got a list`},
		{"policy as a template variable", "policies:\n  - name: a\n    limit: 1/s\n    key: '{policy}:{user}'\n", `4:10: key "{policy}:{user}": variable {policy} is reserved: a descriptor whose first entry is policy=NAME goes to the policy NAME`},
		{"policy as an in-flight template variable", "policies:\n  - name: a\n    in_flight: {max: 3, hold: 10s}\n    key: '{policy}'\n", `4:10: key "{policy}": variable {policy} is reserved`},
		{"same descriptor keys", "policies:\n  - name: a\n    limit: 1/s\n    key: '{u}:{r}'\n  - name: b\n    limit: 1/s\n    key: '{r}/{u}'\n", `7:10: key "{r}/{u}" takes the same descriptor entries as policy "a"`},
		{"override glob inside", "policies:\n  - name: a\n    limit: 1/s\n    overrides:\n      - {match: 'user-*-vip', limit: 2/s}\n", `5:17: override match "user-*-vip": '*' is a wildcard only at the end ("premium:*"); a match is a whole key or such a prefix`},
		{"override without match", "policies:\n  - name: a\n    limit: 1/s\n    overrides:\n      - limit: 2/s\n", `5:9: override needs match and limit`},
		{"duplicate override match", "policies:\n  - name: a\n    limit: 10/min\n    overrides:\n      - match: a\n        limit: 10/s\n      - match: a\n        limit: 20/s\n", `7:16: duplicate override match "a" (first at test.yaml:5)`},
		{"duplicate override match in a list", "policies:\n  - name: a\n    limit: 10/min\n    overrides:\n      - {match: [x, y], limit: 10/s}\n      - {match: [z, y], limit: 20/s}\n", `6:21: duplicate override match "y" (first at test.yaml:5)`},
		{"override match with a brace", "policies:\n  - name: a\n    limit: 10/min\n    overrides:\n      - {match: 't{x}*', limit: 10/s}\n", `5:17: override match "t{x}*" never applies: a '{' in a key is written %7B`},
		{"override match with a lone percent", "policies:\n  - name: a\n    limit: 10/min\n    overrides:\n      - {match: 50%off, limit: 10/s}\n", `5:17: override match "50%off" never applies: "%of" is not an escape`},
		{"override match with an escape never rendered", "policies:\n  - name: a\n    limit: 10/min\n    overrides:\n      - {match: '%41', limit: 10/s}\n", `5:17: override match "%41" never applies: "%41" is not an escape here: a value escapes only '%', '{' and '}' (%25, %7B, %7D); send "A"`},
		{"override match behind a prefix", "policies:\n  - name: a\n    limit: 10/min\n    overrides:\n      - {match: premium-*, limit: 10/s}\n      - {match: premium-gold*, limit: 20/s}\n", `6:17: override match "premium-gold*" never applies: the earlier match "premium-*" (at test.yaml:5) takes all its keys first`},
		{"lease on a sliding window log", "policies:\n  - name: a\n    limit: sliding_window_log 5/min\n    lease: 50ms\n", `4:12: lease: the policy's limit (sliding_window_log 5/min) cannot be leased`},
		{"lease on an override's sliding window log", "policies:\n  - name: a\n    limit: 5/min\n    lease: 50ms\n    overrides:\n      - {match: x, limit: sliding_window_log 9/min}\n", `4:12: lease: override x (sliding_window_log 9/min) cannot be leased`},
		{"lease of zero", "policies:\n  - name: a\n    limit: 5/s\n    lease: 0s\n", `4:12: lease "0s": want a positive duration`},
		{"negative lease", "policies:\n  - name: a\n    limit: 5/s\n    lease: -1ms\n", `4:12: lease "-1ms": want a positive duration`},
		{"lease not a duration", "policies:\n  - name: a\n    limit: 5/s\n    lease: soon\n", `4:12: lease "soon": want a positive duration`},
		{"lease below a round trip", "policies:\n  - name: a\n    limit: 5/s\n    lease: 1ns\n", `4:12: lease 1ns: shorter than 1ms`},
		{"lease longer than the period", "policies:\n  - name: a\n    limit: 5/s\n    lease: 2s\n", `4:12: lease 2s is longer than the period of the policy's limit (5/s)`},
		{"lease longer than an override's period", "policies:\n  - name: a\n    limit: 5/min\n    lease: 2s\n    overrides:\n      - {match: [x, y], limit: 50/s}\n", `4:12: lease 2s is longer than the period of override x, y (50/s)`},
		{"lease in envoy format", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      lease: 50ms\n", `7:14: lease: Envoy-format limits are exact`},
		{"control character in domain", "domain: \"a\\tb\"\npolicies: [{name: a, limit: 1/s}]\n", `1:9: domain "a\tb": want 1 to 1024 bytes of UTF-8 text without control characters`},
		{"envoy without domain", "descriptors:\n  - key: a\n", `1:1: envoy ratelimit config needs a domain`},
		{"envoy empty key", "domain: d\ndescriptors:\n  - value: a\n", `3:5: descriptor has empty key`},
		{"envoy bad unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 3\n", `5:13: invalid rate limit unit 'fortnight': want second, minute, hour, day, week, month or year`},
		{"envoy unlimited with unit", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unlimited: true\n      unit: second\n", `6:13: should not specify rate limit unit when unlimited`},
		{"envoy duplicate descriptor", "domain: d\ndescriptors:\n  - key: a\n    value: b\n  - key: a\n    value: b\n", `5:5: duplicate descriptor composite key 'd.a_b'`},
		{"envoy share_threshold needs a wildcard", "domain: d\ndescriptors:\n  - key: a\n    value: b\n    share_threshold: true\n", `5:22: share_threshold can only be used with wildcard values`},
		{"envoy replaces itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      name: x\n      replaces: [{name: x}]\n      unit: second\n      requests_per_unit: 1\n", `6:25: replaces should not contain name of same descriptor`},
		{"envoy bad algorithm", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      algorithm: magic\n", `7:18: sluice: invalid limit: unknown algorithm "magic"`},
		{"envoy limit beyond sluice's bounds", "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 4000000000\n", `6:26: sluice: invalid limit: rate 4000000000 exceeds`},
		{"duplicate domain", "domain: d\n---\ndomain: d\n", `3:9: duplicate domain "d" (first at test.yaml:1)`},
		{"default domain named after it was used", "policies: [{name: a, limit: 1/s}]\n---\ndomain: sluice\npolicies: [{name: b, limit: 1/s}]\n", `3:9: duplicate domain "sluice" (first at test.yaml:1): policies without a domain: line are in domain "sluice"; write another domain in one of the two`},
		{"default domain used after it was named", "domain: sluice\npolicies: [{name: a, limit: 1/s}]\n---\npolicies: [{name: b, limit: 1/s}]\n", `4:1: duplicate domain "sluice" (first at test.yaml:1): policies without a domain: line are in domain "sluice"`},
		{"default domain's policies keep unique names", "policies: [{name: a, limit: 1/s}]\n---\npolicies: [{name: a, limit: 2/s}]\n", `3:19: duplicate policy name "a" (first at test.yaml:1)`},
		{"default domain's policies keep unique keys", "policies: [{name: a, limit: 1/s, key: '{u}'}]\n---\npolicies: [{name: b, limit: 2/s, key: '{u}'}]\n", `3:39: key "{u}" takes the same descriptor entries as policy "a"`},
		{"unknown anchor", "policies:\n  - name: a\n    limit: 1/s\n    key: *nope\n", `4:5: unknown anchor 'nope' referenced`},
		{"invalid utf-8", "policies:\n  - name: a\xff\n", `2:3: invalid leading UTF-8 octet`},
		{"yaml syntax", "policies:\n  - name: a\n    limit: \"unclosed\n", `3:1: found unexpected end of stream`},
		{"yaml tab", "policies:\n  - name: a\n\tlimit: 1/s\n", `3:1: found a tab character`},
		{"not a mapping", "- a\n- b\n", `1:1: want a mapping`},
		{"empty", "# nothing\n", ` empty configuration`},
	})
}

// errorCase is a configuration that must fail: want is a substring of
// the error, after "test.yaml:".
type errorCase struct{ name, yaml, want string }

// checkErrors parses each case's text and checks its error.
func checkErrors(t *testing.T, tests []errorCase) {
	t.Helper()
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("test.yaml", []byte(tt.yaml))
			if err == nil {
				t.Fatal("no error")
			}
			if !errors.Is(err, ErrConfig) {
				t.Errorf("error %v does not wrap ErrConfig", err)
			}
			if !strings.Contains(err.Error(), "test.yaml:"+tt.want) {
				t.Errorf("error:\n  %v\nwant it to contain:\n  test.yaml:%s", err, tt.want)
			}
		})
	}
}

func TestConfigCollectsSeveralErrors(t *testing.T) {
	_, err := Parse("x.yaml", []byte("policies:\n  - name: a\n    limit: nope\n  - name: b\n    limit: 1/s\n    colour: red\n"))
	var joined interface{ Unwrap() []error }
	if !errors.As(err, &joined) || len(joined.Unwrap()) != 2 {
		t.Fatalf("err = %v, want two errors", err)
	}
	var ce *Error
	if !errors.As(joined.Unwrap()[1], &ce) || ce.File != "x.yaml" || ce.Line != 6 {
		t.Errorf("second error = %#v, want x.yaml line 6", ce)
	}
}

func TestLoadConfigDirectory(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "domain: one\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	write("b.yml", "policies:\n  - name: p\n    limit: 1/s\n")
	write("notes.txt", "not yaml: [")
	cfg, err := Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(cfg.Domains(), ","), "one,sluice"; got != want {
		t.Errorf("domains %q, want %q", got, want)
	}
	if got, want := len(cfg.Files), 2; got != want {
		t.Errorf("%d files, want %d", got, want)
	}
	// Sluice-format files without a domain share the default one.
	write("b2.yaml", "policies:\n  - name: q\n    limit: 2/s\n")
	cfg, err = Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(cfg.Domains(), ","), "one,sluice"; got != want {
		t.Errorf("domains %q, want %q", got, want)
	}
	if m, ok := cfg.Domain(DefaultDomain).Match([]Entry{{"policy", "q"}, {"key", "k"}}); !ok || m.Policy != cfg.Policy("q") {
		t.Errorf("policy q from b2.yaml: match %+v, %v; want it in domain %q", m, ok, DefaultDomain)
	}
	write("c.yaml", "domain: one\n")
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "c.yaml")+":1:9: duplicate domain") {
		t.Errorf("err = %v, want a duplicate domain in c.yaml", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); !errors.Is(err, ErrConfig) {
		t.Errorf("missing file: err = %v, want ErrConfig", err)
	}
}

func TestDescribe(t *testing.T) {
	cfg, err := Load("../testdata/envoy-example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	cfg.Describe(&b)
	for _, want := range []string{
		"domain rl\n",
		"  foo: fixed_window 2/min\n",
		"    bar=banned: blocked (0 per 1m0s), name banned_limit\n",
		"    baz=shady: fixed_window 3/min, shadow_mode\n",
		"    bay: unlimited\n",
		"  category=account: fixed_window 4/min, replaces bkthomps, fake_name\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Describe lacks %q:\n%s", want, b.String())
		}
	}
}

// A quota_mode rule is listed as such, not as shadow_mode: the two differ
// in what Envoy's responses say.
func TestDescribeQuotaMode(t *testing.T) {
	cfg := mustConfig(t, `
domain: q
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 1}
    quota_mode: true
  - key: b
    rate_limit: {unit: minute, requests_per_unit: 1}
    shadow_mode: true
`)
	var b strings.Builder
	cfg.Describe(&b)
	for _, want := range []string{"  a: fixed_window 1/min, quota_mode\n", "  b: fixed_window 1/min, shadow_mode\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Describe lacks %q:\n%s", want, b.String())
		}
	}
}

func TestDescribeLease(t *testing.T) {
	cfg := mustConfig(t, `
policies:
  - name: search
    limit: 1000/s
    lease: 50ms
  - name: login
    limit: 5/15m
  - name: exposed
    limit: 5/s
    expose_keys: true
  - name: jobs
    in_flight: {max: 3, hold: 1s}
    expose_keys: true
`)
	var b strings.Builder
	cfg.Describe(&b)
	for _, want := range []string{"  policy search: 1000/s, lease 50ms\n", "  policy login: 5/15m\n", "  policy exposed: 5/s, expose_keys\n", ", expose_keys; JSON API only"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Describe lacks %q:\n%s", want, b.String())
		}
	}
}

func mustConfig(t testing.TB, yaml string) *Config {
	t.Helper()
	cfg, err := Parse("test.yaml", []byte(strings.TrimLeft(yaml, "\n")))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	return cfg
}

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

// An alias inside the mapping or descriptor list it names is refused,
// naming the line: read, it would merge itself or nest itself forever
// (the process died of a stack overflow).
func TestYAMLAliasCycles(t *testing.T) {
	t.Parallel()
	checkErrors(t, []errorCase{
		{"merge of itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &x\n      <<: *x\n", `5:11: a merge key names a mapping that holds it (*x)`},
		{"merge list with itself", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &x\n      <<: [{unit: second}, *x]\n", `5:28: a merge key names a mapping that holds it (*x)`},
		{"merge of a mapping merging it", "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &x\n      <<: {<<: *x}\n", `5:16: a merge key names a mapping that holds it (*x)`},
		{"descriptors holding themselves", "domain: d\ndescriptors: &l\n  - key: a\n    descriptors: *l\n", `2:14: descriptors: an alias names a list of descriptors that holds it`},
	})
	// A mapping merged twice, side by side, is no cycle.
	mustConfig(t, "domain: d\ndescriptors:\n  - key: a\n    rate_limit: &x {unit: second, requests_per_unit: 3}\n  - key: b\n    rate_limit: &y {<<: *x, name: n}\n  - key: c\n    rate_limit: {<<: [*x, *y]}\n")
}

// Descriptor lists aliased into lists repeat their descriptors, doubling
// at each level: 30 levels (120 lines) made a billion descriptors, read for
// hours. Past maxRepeats repeats the configuration is refused, at once.
func TestYAMLAliasRepeatsBounded(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	b.WriteString("domain: d\ndescriptors:\n  - key: k0\n    descriptors: &l0\n      - {key: a, rate_limit: {unit: second, requests_per_unit: 1}}\n")
	for i := 1; i <= 30; i++ {
		fmt.Fprintf(&b, "  - key: k%d\n    descriptors: &l%d\n      - {key: a, descriptors: *l%d}\n      - {key: b, descriptors: *l%d}\n", i, i, i-1, i-1)
	}
	checkErrors(t, []errorCase{{"30 levels", b.String(), "5:9: descriptors: aliases repeat more than 100000 descriptors"}})
	// 10 levels, 2,047 descriptors, load.
	cfg := mustConfig(t, strings.Join(strings.SplitAfter(b.String(), "\n")[:5+4*10], ""))
	if got := len(cfg.Policies); got != 1<<11-1 {
		t.Errorf("%d policies, want %d", got, 1<<11-1)
	}
}

const wildcardConfig = `
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
`

// A '*' anywhere in a descriptor value matches any run of characters, as
// in envoyproxy/ratelimit; share_threshold shares one counter per pattern.
func TestWildcardValues(t *testing.T) {
	t.Parallel()
	cfg := mustConfig(t, wildcardConfig)
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
		{"'unclosed", "test.yaml:1:1: found unexpected end of stream"}, // the library names no line on the first
	} {
		if _, err := Parse("test.yaml", []byte(tt.yaml)); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("err = %v, want %s...", err, tt.want)
		}
	}
}

// YAML breaks lines at CR LF and at a lone CR too: a file with either
// line ending has its errors on the lines it has with LF.
func TestYAMLErrorLineEndings(t *testing.T) {
	t.Parallel()
	for _, text := range []string{
		"domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n     requests_per_unit: 3\n",
		"policies:\n  - name: a\n    limit: 1/s\n  - name: b\n   limit: 2/s\n",
		"policies:\n  - name: a\n    limit: 1/s\n    key: *nope\n",
		"policies:\n  - name: a\n    limit: 1/s\n  - name: b\xff\n",
		"policies:\n  - name: a\n\tlimit: 1/s\n",
		"policies:\n  - name: a\n    limit: \"unclosed\n",
		"policies:\n  - name: a\n    limit: nope\n",
		"domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
	} {
		_, want := Parse("test.yaml", []byte(text))
		if want == nil {
			t.Fatalf("%q: no error", text)
		}
		for _, br := range []string{"\r\n", "\r"} {
			_, err := Parse("test.yaml", []byte(strings.ReplaceAll(text, "\n", br)))
			if err == nil || err.Error() != want.Error() {
				t.Errorf("%q with %q line endings:\n  %v\nwant\n  %v", text, br, err, want)
			}
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

// A unit_multiplier out of range is one error, not two.
func TestUnitMultiplierOutOfRangeOneError(t *testing.T) {
	t.Parallel()
	_, err := Parse("test.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5, unit_multiplier: -3}\n"))
	if err == nil || strings.Count(err.Error(), "test.yaml:") != 1 || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("got %v, want one error saying out of range", err)
	}
}

// An Envoy-format field written with no value (rate_limit:, value:,
// metadata:) is left out, as envoyproxy/ratelimit's reader takes it.
func TestEnvoyNullFieldsLeftOut(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("test.yaml", []byte(`domain: d
descriptors:
  - key: a
    rate_limit:
    metadata:
    descriptors:
      - key: b
        value:
        rate_limit: {unit: second, requests_per_unit: 5, unit_multiplier: , name: }
`))
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Policy("d.a.b"); p == nil || p.Limit.Rate != 5 {
		t.Errorf("d.a.b: %+v, want 5/s", p)
	}
	if p := cfg.Policy("d.a"); p != nil {
		t.Errorf("d.a: %+v, want no policy (rate_limit: with no value)", p)
	}
}

// TestTemplateValuesEscaped: two descriptors never render one key, and no
// value puts a brace in it. Every value's '%', '{' and '}' are
// percent-escaped; with two variables or more, so are the bytes of the
// literal text between them in every value but the last.
func TestTemplateValuesEscaped(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("test.yaml", []byte("policies:\n  - name: a\n    limit: 1/s\n    key: 'u={user}:{ip}'\n  - name: b\n    limit: 1/s\n    key: '<{k}>'\n"))
	if err != nil {
		t.Fatal(err)
	}
	dom := cfg.Domain(DefaultDomain)
	for _, tt := range []struct {
		entries []Entry
		want    string
	}{
		{[]Entry{{"user", "bob"}, {"ip", "10.0.0.1"}}, "u=bob:10.0.0.1"},
		{[]Entry{{"user", "a:b"}, {"ip", "c"}}, "u=a%3Ab:c"},
		{[]Entry{{"user", "a"}, {"ip", "b:c"}}, "u=a:b:c"},
		{[]Entry{{"user", "bob"}, {"ip", "2001:db8::1"}}, "u=bob:2001:db8::1"},
		{[]Entry{{"user", "x=%"}, {"ip", "u%"}}, "u=x=%25:u%25"},
		{[]Entry{{"k", "a:b%>"}}, "<a:b%25>>"},
		{[]Entry{{"k", "{x}"}}, "<%7Bx%7D>"},
		{[]Entry{{"k", "}x"}}, "<%7Dx>"},
		{[]Entry{{"user", "{t}"}, {"ip", "{t}"}}, "u=%7Bt%7D:%7Bt%7D"},
	} {
		m, ok := dom.Match(tt.entries)
		if !ok || m.Key != tt.want {
			t.Errorf("Match(%v) = %q, %v; want %q", tt.entries, m.Key, ok, tt.want)
		}
	}
}

// TestTemplateInjective: over values drawn from the templates' own text,
// '%', braces and hex digits, distinct descriptors never render one key,
// and no key holds a brace.
func TestTemplateInjective(t *testing.T) {
	t.Parallel()
	alphabet := []string{"", ":", "%", "3A", "a", "/", "-", "25", "::", "{", "}", "7B"}
	var values []string
	distinct := map[string]bool{}
	for _, a := range alphabet {
		for _, b := range alphabet {
			if v := a + b; !distinct[v] {
				distinct[v] = true
				values = append(values, v)
			}
		}
	}
	for _, tmpl := range []string{"{a}", "k{a}", "{a}:{b}", "x{a}/{b}-{c}y", "{a}:-{b}", "{a}::{b}:{c}"} {
		tt, err := parseTemplate(tmpl)
		if err != nil {
			t.Fatal(err)
		}
		seen := map[string][]string{}
		var fill func(vals []string)
		fill = func(vals []string) {
			if len(vals) == len(tt.vars) {
				entries := make([]Entry, len(vals))
				for i, v := range vals {
					entries[i] = Entry{tt.vars[i], v}
				}
				key, ok := tt.render(entries, nil)
				if !ok {
					t.Fatalf("%s: render(%q) failed", tmpl, vals)
				}
				if strings.ContainsAny(key, "{}") {
					t.Fatalf("%s: %q renders %q, with a brace", tmpl, vals, key)
				}
				if prev, ok := seen[key]; ok {
					t.Fatalf("%s: %q and %q both render %q", tmpl, prev, vals, key)
				}
				seen[key] = append([]string(nil), vals...)
				// The JSON API takes every rendered key, and no other
				// spelling of it.
				p := &Policy{tmpl: tt}
				if why := p.KeyEscapeProblem(key); why != "" {
					t.Fatalf("%s: %q renders %q, refused: %s", tmpl, vals, key, why)
				}
				if i := strings.IndexByte(key, 'a'); i >= 0 {
					if alias := key[:i] + "%61" + key[i+1:]; p.KeyEscapeProblem(alias) == "" {
						t.Fatalf("%s: %q renders %q, and %q is taken too", tmpl, vals, key, alias)
					}
				}
				return
			}
			vs := values
			if len(tt.vars) > 2 {
				vs = alphabet // 3 variables of pairs would be 200,000 keys
			}
			for _, v := range vs {
				fill(append(vals, v))
			}
		}
		fill(nil)
	}
}

// No client's value puts a brace in a key, which would pick its Redis
// Cluster slot: descriptors' values are escaped, and a JSON API key is
// written as they render, braces and lone '%' refused with the reason.
func TestKeysCarryNoBrace(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("test.yaml", []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\npolicies:\n  - name: a\n    limit: 1/s\n    key: '{user}'\n"))
	if err != nil {
		t.Fatal(err)
	}
	m, ok := cfg.Domain("d").Match([]Entry{{"k", "{x}%"}})
	if want := "k=%7Bx%7D%25"; !ok || m.Key != want {
		t.Errorf("Envoy-format key %q, %v; want %q", m.Key, ok, want)
	}
	if got := EntriesKey([]Entry{{"}", "{"}}); got != "%7D=%7B" {
		t.Errorf("EntriesKey = %q", got)
	}
	envoy, sluiceFormat := m.RateLimit.Policy, cfg.Policy("a")
	for _, tt := range []struct {
		p       *Policy
		key     string
		reaches bool
		problem string
	}{
		{sluiceFormat, "%7Bx%7D%25", true, ""},
		{sluiceFormat, "{x}", false, `a '{' in a key is written %7B`},
		{sluiceFormat, "x}", false, `a '}' in a key is written %7D`},
		{sluiceFormat, "50%off", false, `"%of" is not an escape`},
		{envoy, "k=%7Bx%7D%25", true, ""},
		{envoy, "k={x}%25", false, `a '{' in a key is written %7B`},
		{sluiceFormat, "%41", false, ""},
		{sluiceFormat, "x%3A", false, ""},
		{envoy, "k=%41", false, ""},
	} {
		if got := cfg.Reaches(tt.p, tt.key); got != tt.reaches {
			t.Errorf("%s: Reaches(%q) = %v", tt.p.Name, tt.key, got)
		}
		if got := EscapeProblem(tt.key); !strings.HasPrefix(got, tt.problem) || (tt.problem == "") != (got == "") {
			t.Errorf("EscapeProblem(%q) = %q, want %q…", tt.key, got, tt.problem)
		}
	}
}

// Text between a template's variables may hold hex digits, which the
// escapes of the values before it hold too: a key is read past its
// escapes, so "%41%3000" under "{a}0{b}" (a's "A" escaped, which no
// descriptor renders) is refused, not taken as a counter of its own.
func TestTemplateTextHexDigits(t *testing.T) {
	t.Parallel()
	cfg := mustConfig(t, "policies:\n  - name: a\n    limit: 1/s\n    key: '{a}0{b}'\n")
	p := cfg.Policy("a")
	m, ok := cfg.Domain(DefaultDomain).Match([]Entry{{"a", "0"}, {"b", "0"}})
	if !ok || m.Key != "%3000" || !cfg.Reaches(p, m.Key) {
		t.Fatalf("Match = %q, %v; reaches %v", m.Key, ok, cfg.Reaches(p, m.Key))
	}
	if cfg.Reaches(p, "%41%3000") {
		t.Errorf("%q reaches the policy; descriptors render %q", "%41%3000", "A%3000")
	}
	if got, want := p.KeyEscapeProblem("%41%3000"), `send "A%3000"`; !strings.Contains(got, want) {
		t.Errorf("KeyEscapeProblem = %q, want it to say %s", got, want)
	}
}
