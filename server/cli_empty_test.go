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
	cfg := filepath.Join(t.TempDir(), "sluice.yaml")
	os.WriteFile(cfg, []byte("policies:\n  - name: api\n    limit: 5/min\n    key: \"{api_key}\"\n"), 0o644)
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
	for _, flag := range []string{"config", "redis", "http", "grpc", "failure-policy", "admin-token", "decision-token", "log-format", "log-level"} {
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
