package server

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"testing"
)

// -h prints each flag's default, and the environment's value is the
// default: a token or a Redis password in the environment was printed.
// Tokens show nothing, a Redis URL its password masked; the values still
// reach the settings.
func TestServeHelpHidesSecrets(t *testing.T) {
	env := envOf(map[string]string{
		"SLUICE_ADMIN_TOKEN":    "admin-s3cret",
		"SLUICE_DECISION_TOKEN": "decision-s3cret",
		"SLUICE_REDIS_URL":      "redis+sentinel://user:redis-s3cret@127.0.0.1:26379/0?master_name=m&sentinel_password=sentinel-s3cret",
	})
	var out bytes.Buffer
	if _, err := parseServe([]string{"-h"}, env, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	if !strings.Contains(out.String(), "-admin-token") {
		t.Fatalf("no help printed:\n%s", out.String())
	}
	for _, secret := range []string{"admin-s3cret", "decision-s3cret", "redis-s3cret", "sentinel-s3cret"} {
		if strings.Contains(out.String(), secret) {
			t.Errorf("-h printed %q:\n%s", secret, out.String())
		}
	}
	if !strings.Contains(out.String(), "redis+sentinel://user:xxxxx@127.0.0.1:26379/0") {
		t.Errorf("-h does not show the Redis URL with its password masked:\n%s", out.String())
	}
	st, err := parseServe(nil, env, &out)
	if err != nil {
		t.Fatal(err)
	}
	if st.adminToken != "admin-s3cret" || st.decToken != "decision-s3cret" || !strings.Contains(st.redisURL, ":redis-s3cret@") {
		t.Errorf("settings from the environment: %+v", st)
	}
	st, err = parseServe([]string{"--admin-token", "flag-token"}, env, &out)
	if err != nil || st.adminToken != "flag-token" {
		t.Errorf("--admin-token flag-token: %q, %v", st.adminToken, err)
	}
	if _, err := parseServe([]string{"--decision-token", " "}, env, &out); err == nil || !strings.Contains(err.Error(), "--decision-token is empty") {
		t.Errorf("--decision-token blank: %v, want it refused as empty", err)
	}
}
