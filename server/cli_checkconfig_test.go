package server

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
