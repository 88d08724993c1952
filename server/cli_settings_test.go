package server

import (
	"bytes"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

// runSluice runs the sluice command to its exit and returns its exit code
// and stderr.
func runSluice(t *testing.T, env []string, args ...string) (int, string) {
	t.Helper()
	var stderr bytes.Buffer
	cmd := sluiceCmd(env, args...)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A run that wrongly starts serving would otherwise hang.
	kill := time.AfterFunc(20*time.Second, func() { cmd.Process.Kill() })
	err := cmd.Wait()
	kill.Stop()
	if ee, ok := err.(*exec.ExitError); ok {
		return ee.ExitCode(), stderr.String()
	} else if err != nil {
		t.Fatal(err)
	}
	return 0, stderr.String()
}

// A setting that is set but empty, in the environment or on the command
// line, is refused at start: an empty secret must not turn into the
// memory store (each instance its own limits), no decision token, or a
// listener on every interface.
func TestCLIEmptySettingsRefused(t *testing.T) {
	cfg := writeConfig(t, "policies:\n  - name: api\n    limit: 5/min\n    key: \"{api_key}\"\n")
	base := []string{"--config", cfg, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}
	// without returns base less the flag (and its value) named.
	without := func(flag string) []string {
		i := slices.Index(base, "--"+flag)
		if i < 0 {
			return base
		}
		return slices.Delete(slices.Clone(base), i, i+2)
	}
	for _, s := range emptyRefused {
		if s.env == "" {
			continue // a flag only, below
		}
		for _, value := range []string{"", " "} {
			t.Run(fmt.Sprintf("%s=%q", s.env, value), func(t *testing.T) {
				code, stderr := runSluice(t, []string{s.env + "=" + value}, append([]string{"serve"}, without(s.flag)...)...)
				// The logger refuses a blank format or level itself.
				named := strings.Contains(stderr, s.env+" is set but empty") && strings.Contains(stderr, `msg="bad environment"`) ||
					strings.HasPrefix(s.env, "SLUICE_LOG_") && value != "" && strings.Contains(stderr, "invalid log option")
				if code != 2 || !named {
					t.Errorf("exit %d, want 2 naming %s; stderr:\n%s", code, s.env, stderr)
				}
			})
		}
	}
	for _, flag := range []string{"config", "redis", "http", "grpc", "failure-policy", "admin-token", "decision-token", "log-format", "log-level",
		"http-tls-cert", "http-tls-key", "grpc-tls-cert", "grpc-tls-key", "http-tls-client-ca", "grpc-tls-client-ca"} {
		t.Run("--"+flag, func(t *testing.T) {
			code, stderr := runSluice(t, nil, append([]string{"serve", "--" + flag + "="}, without(flag)...)...)
			if code != 2 || !strings.Contains(stderr, "--"+flag+" is empty") {
				t.Errorf("exit %d, want 2 naming --%s; stderr:\n%s", code, flag, stderr)
			}
		})
	}
	// A flag wins over its variable, which is then not read: these run on
	// Redis and require the token.
	t.Run("flags over empty variables", func(t *testing.T) {
		p := startSluice(t, []string{"SLUICE_REDIS_URL=", "SLUICE_DECISION_TOKEN="},
			append(slices.Clone(base), "--redis", "redis://"+redistest.Addr(t), "--decision-token", "s3cret")...)
		if p.started["store.kind"] != "redis" {
			t.Errorf("startup line %v, want store.kind=redis", p.started)
		}
		body := fmt.Sprintf(`{"policy":"api","key":"empty-env-%d"}`, time.Now().UnixNano())
		check := func(auth string) int {
			t.Helper()
			req, _ := http.NewRequest("POST", "http://"+p.http+"/v1/check", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if code := check(""); code != http.StatusUnauthorized {
			t.Errorf("check without the token: %d, want 401", code)
		}
		if code := check("Bearer s3cret"); code != http.StatusOK {
			t.Errorf("check with the token: %d, want 200", code)
		}
		p.stop(t)
	})
}

// A bad setting is logged as one record that names where it came from: the
// variable, under "bad environment", or the flag, under "bad flag".
func TestBadSettingNamesItsSource(t *testing.T) {
	listen := []string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}
	for _, tt := range []struct {
		env  string
		args []string
		want []string
	}{
		{"SLUICE_FAILURE_POLICY=x", nil, []string{`msg="bad environment"`, `SLUICE_FAILURE_POLICY`, "want error, local, open or closed"}},
		{"", []string{"--failure-policy", "x"}, []string{`msg="bad flag"`, `--failure-policy`}},
		{"SLUICE_REDIS_URL=foo://x", nil, []string{`msg="bad environment"`, `SLUICE_REDIS_URL`, `scheme \"foo\"`}},
		{"", []string{"--redis", "foo://x"}, []string{`msg="bad flag"`, `--redis`}},
		{"SLUICE_FLEET_SIZE=x", nil, []string{`msg="bad environment"`, `SLUICE_FLEET_SIZE=\"x\": want a whole number`}},
		{"SLUICE_FLEET_SIZE=-2", nil, []string{`msg="bad environment"`, `SLUICE_FLEET_SIZE -2: want 1 or more`}},
		{"SLUICE_MAX_CONNECTIONS=0", nil, []string{`msg="bad environment"`, `SLUICE_MAX_CONNECTIONS 0: want 1 or more`}},
		{"SLUICE_MAX_KEYS=many", nil, []string{`msg="bad environment"`, `SLUICE_MAX_KEYS=\"many\": want a whole number`}},
		{"SLUICE_MAX_KEYS=-1", nil, []string{`msg="bad environment"`, `SLUICE_MAX_KEYS -1: want 1 or more`}},
		{"SLUICE_FLEET_SHRINK=-1s", nil, []string{`msg="bad environment"`, `SLUICE_FLEET_SHRINK -1s: want a positive duration`}},
		{"SLUICE_DECISION_TIMEOUT=-1s", nil, []string{`msg="bad environment"`, `SLUICE_DECISION_TIMEOUT -1s`}},
		{"SLUICE_LOG_FORMAT=xml", nil, []string{`msg="bad environment"`, `SLUICE_LOG_FORMAT: `, `want text or json`}},
		{"", []string{"--log-format", "xml"}, []string{`msg="bad flag"`, `--log-format: `}},
		{"SLUICE_LOG_LEVEL=loud", nil, []string{`msg="bad environment"`, `SLUICE_LOG_LEVEL: `, `want debug, info, warn or error`}},
		// A TLS file without its pair is the flags' mistake, not the files'.
		{"", []string{"--http-tls-client-ca", "ca.pem"}, []string{`msg="bad flag"`, `--http-tls-client-ca without --http-tls-cert`}},
		{"", []string{"--http-tls-cert", "c.pem"}, []string{`msg="bad flag"`, `--http-tls-cert without --http-tls-key`}},
		{"", []string{"--grpc-tls-key", "k.pem", "--grpc-tls-client-ca", "ca.pem"}, []string{`msg="bad flag"`, `--grpc-tls-key and --grpc-tls-client-ca without --grpc-tls-cert`}},
	} {
		t.Run(tt.env+strings.Join(tt.args, " "), func(t *testing.T) {
			var env []string
			if tt.env != "" {
				env = []string{tt.env}
			}
			code, stderr := runSluice(t, env, append(append([]string(nil), listen...), tt.args...)...)
			lines := strings.Split(strings.TrimSpace(stderr), "\n")
			ok := code == 2 && len(lines) == 1 && strings.HasPrefix(lines[0], "time=")
			for _, w := range tt.want {
				ok = ok && strings.Contains(stderr, w)
			}
			if !ok {
				t.Errorf("exit %d, stderr %q; want 2 and one log record saying %q", code, stderr, tt.want)
			}
		})
	}
}

// TestCLIQuotedBooleanRefused: `sluice serve` and `sluice check-config`
// refuse a boolean written as a string, naming file:line:column and what
// is accepted. allow_empty: "yes" served no policies (every request
// passed), expose_keys: "on" showed raw keys.
func TestCLIQuotedBooleanRefused(t *testing.T) {
	dir := t.TempDir()
	for _, tt := range []struct {
		name, yaml, want string
	}{
		{"allow_empty", "allow_empty: \"yes\"\npolicies: []\n", `:1:14: allow_empty: want true or false, unquoted, got a quoted string "yes"`},
		{"expose_keys", "policies:\n  - name: api\n    limit: 5/min\n    expose_keys: on\n", `:4:18: expose_keys: want true or false, unquoted, got "on"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(dir, tt.name+".yaml")
			if err := os.WriteFile(file, []byte(tt.yaml), 0o600); err != nil {
				t.Fatal(err)
			}
			if code, stderr := runSluice(t, nil, "check-config", file); code == 0 || !strings.Contains(stderr, file+tt.want) {
				t.Errorf("check-config: exit %d, want an error naming %s%s; stderr:\n%s", code, file, tt.want, stderr)
			}
			code, stderr := runSluice(t, nil, "serve", "--config", file, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
			if code == 0 || !strings.Contains(stderr, `msg="cannot start"`) || !strings.Contains(stderr, strings.ReplaceAll(file+tt.want, `"`, `\"`)) {
				t.Errorf("serve: exit %d, want it not to start, naming %s%s; stderr:\n%s", code, file, tt.want, stderr)
			}
		})
	}
}

// check-config on key templates that cannot work as written: one error,
// at file:line:column, that says why and what to write instead.
func TestCLICheckConfigKeyTemplates(t *testing.T) {
	dir := t.TempDir()
	tests := []struct{ name, yaml, want string }{
		// A descriptor policy=NAME,user=U names the policy NAME: it could
		// never be meant for this template's {policy}.
		{"policy variable", "policies:\n  - name: a\n    limit: 5/min\n    key: \"{user}\"\n  - name: b\n    limit: 2/min\n    key: \"{policy}:{user}\"\n",
			`:7:10: key "{policy}:{user}": variable {policy} is reserved: a descriptor whose first entry is policy=NAME goes to the policy NAME`},
		// Unquoted, {user} is a YAML mapping: one error, not a second
		// about an empty template.
		{"unquoted braces", "policies:\n  - name: a\n    limit: 5/s\n    key: {user}\n",
			`:4:10: key is a YAML mapping, not a template: quote the braces (key: "{user}")`},
		{"template a list", "policies:\n  - name: a\n    limit: 5/s\n    key: [user]\n", `:4:10: want a string, got a list`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".yaml")
			if err := os.WriteFile(file, []byte(tt.yaml), 0o644); err != nil {
				t.Fatal(err)
			}
			code, stderr := runSluice(t, nil, "check-config", file)
			if code != 1 || !strings.Contains(stderr, "sluice: "+file+tt.want) {
				t.Errorf("exit %d, want 1 and %q; stderr:\n%s", code, file+tt.want, stderr)
			}
			if n := strings.Count(stderr, "sluice: "); n != 1 {
				t.Errorf("%d errors, want one; stderr:\n%s", n, stderr)
			}
		})
	}
}
