package server

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// cliEnvSettings are the settings read from the environment too: their
// variable, their flag, and a value the flag takes.
var cliEnvSettings = []struct{ env, flag, good string }{
	{"SLUICE_CONFIG", "config", "sluice.yaml"},
	{"SLUICE_REDIS_URL", "redis", "redis://127.0.0.1:6379/0"},
	{"SLUICE_HTTP_ADDR", "http", "127.0.0.1:0"},
	{"SLUICE_GRPC_ADDR", "grpc", "127.0.0.1:0"},
	{"SLUICE_FAILURE_POLICY", "failure-policy", "closed"},
	{"SLUICE_DECISION_TIMEOUT", "decision-timeout", "75ms"},
	{"SLUICE_FLEET_SIZE", "fleet-size", "3"},
	{"SLUICE_FLEET_SHRINK", "fleet-shrink", "2m"},
	{"SLUICE_ADMIN_TOKEN", "admin-token", "a"},
	{"SLUICE_DECISION_TOKEN", "decision-token", "d"},
	{"SLUICE_MAX_CONNECTIONS", "max-connections", "100"},
	{"SLUICE_MAX_KEYS", "max-keys", "1000"},
	{"SLUICE_LOG_FORMAT", "log-format", "json"},
	{"SLUICE_LOG_LEVEL", "log-level", "warn"},
}

// TestCLIEnvSettingsListed: every variable emptyRefused names is fuzzed.
func TestCLIEnvSettingsListed(t *testing.T) {
	n := 0
	for _, s := range emptyRefused {
		if s.env == "" {
			continue
		}
		n++
		found := false
		for _, c := range cliEnvSettings {
			found = found || c.env == s.env && c.flag == s.flag
		}
		if !found {
			t.Errorf("%s (--%s) is not in cliEnvSettings", s.env, s.flag)
		}
	}
	if n != len(cliEnvSettings) {
		t.Errorf("cliEnvSettings has %d settings, emptyRefused %d", len(cliEnvSettings), n)
	}
}

func envOf(vars map[string]string) lookupEnv {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// FuzzCLIEnv sets one SLUICE_* variable to a value for `sluice serve`'s
// settings: a value refused is a "bad environment" error naming the
// variable, never a panic; the variable and its flag take and refuse the
// same values, and one taken is the same setting either way; and a flag
// given wins over its variable, whatever that holds.
func FuzzCLIEnv(f *testing.F) {
	for i, s := range cliEnvSettings {
		for _, v := range []string{s.good, "", " ", s.good + " ", " " + s.good, strings.ToUpper(s.good), "x", "-1", "0", "1", "+5", "0x10", "0o17", "0b11", "1_000", "010",
			"9223372036854775807", "9223372036854775808", "-9223372036854775808", "1e3", "5m", "-1s", "1.5h", "0s", "1µs", "300ms", "2562047h47m16.854775807s", "2562048h",
			"text", "JSON", "Info", "DEBUG", "warn+2", "info-4", "error", "none", "local", "fail_open", "Fail-Closed", "sometimes",
			"redis://x", "foo://x", "redis+cluster://a:1,b:2", "redis+sentinel://m@h:26379", "rediss://h?dial_timeout=-1s", ":8080", "\x00", "é"} {
			f.Add(uint8(i), v)
		}
	}
	f.Fuzz(func(t *testing.T, i uint8, value string) {
		s := cliEnvSettings[int(i)%len(cliEnvSettings)]
		fromEnv, envErr := parseServe(nil, envOf(map[string]string{s.env: value}), io.Discard)
		fromFlag, flagErr := parseServe([]string{"--" + s.flag + "=" + value}, envOf(nil), io.Discard)
		if envErr != nil {
			var bad *settingError
			if !errors.As(envErr, &bad) || bad.msg != "bad environment" || !strings.Contains(bad.err.Error(), s.env) {
				t.Fatalf("%s=%q: %v, want a bad environment error naming %s", s.env, value, envErr, s.env)
			}
		}
		if (envErr == nil) != (flagErr == nil) {
			t.Fatalf("%s=%q: %v, but --%s=%q: %v", s.env, value, envErr, s.flag, value, flagErr)
		}
		if envErr == nil && fromEnv != fromFlag {
			t.Fatalf("%s=%q reads %+v, --%s=%q reads %+v", s.env, value, fromEnv, s.flag, value, fromFlag)
		}
		// The flag wins: the variable is not read.
		want, err := parseServe([]string{"--" + s.flag + "=" + s.good}, envOf(nil), io.Discard)
		if err != nil {
			t.Fatalf("--%s=%s: %v", s.flag, s.good, err)
		}
		got, err := parseServe([]string{"--" + s.flag + "=" + s.good}, envOf(map[string]string{s.env: value}), io.Discard)
		if err != nil || got != want {
			t.Fatalf("--%s=%s with %s=%q: %+v, %v; want %+v (the flag wins)", s.flag, s.good, s.env, value, got, err, want)
		}
	})
}
