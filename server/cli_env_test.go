package server

import (
	"strings"
	"testing"
)

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
