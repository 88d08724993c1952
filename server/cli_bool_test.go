package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
