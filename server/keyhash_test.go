package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// Real sluice serve processes: those given one SLUICE_KEY_HASH_SECRET show
// a denied key under one label, the HMAC of the key under that secret; one
// without it logs that its labels are its own, and shows another label.
func TestKeyHashSecretAcrossProcesses(t *testing.T) {
	cfg := writeConfig(t, "policies:\n  - name: login\n    limit: fixed_window 1/min\n")
	const secret = "5f1b0c9e8d7a6b5c4d3e2f1a0b9c8d7e"
	const key = "+15558675309"
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(key))
	want := "hmac:" + hex.EncodeToString(mac.Sum(nil)[:6])

	listen := []string{"SLUICE_CONFIG=" + cfg, "SLUICE_HTTP_ADDR=127.0.0.1:0", "SLUICE_GRPC_ADDR=127.0.0.1:0"}
	start := func(withSecret bool) *proc {
		env := slices.Clone(listen)
		if withSecret {
			env = append(env, KeyHashSecretEnv+"="+secret)
		}
		p := &proc{cmd: sluiceCmd(env, "serve")}
		if !withSecret { // whatever the test's own environment holds
			p.cmd.Env = slices.DeleteFunc(p.cmd.Env, func(v string) bool { return strings.HasPrefix(v, KeyHashSecretEnv+"=") })
		}
		p.start(t)
		return p
	}
	label := func(p *proc) string {
		t.Helper()
		body := `{"policy":"login","key":"` + key + `"}`
		p.post(t, "/v1/check", body)
		if code, m := p.post(t, "/v1/check", body); code != 429 {
			t.Fatalf("second check: %d %v, want 429", code, m)
		}
		_, metrics := p.get(t, "/metrics")
		if strings.Contains(metrics, key) || strings.Contains(metrics, "5558675309") {
			t.Errorf("the raw key is in /metrics")
		}
		m := regexp.MustCompile(`sluice_top_key_denials\{key="([^"]*)",policy="login"\} 1`).FindStringSubmatch(metrics)
		if m == nil {
			t.Fatalf("no denial series for login in /metrics:\n%s", metrics)
		}
		return m[1]
	}
	a, b, c := start(true), start(true), start(false)
	if la, lb := label(a), label(b); la != want || lb != want {
		t.Errorf("labels with a shared secret: %q, %q; want %q on both", la, lb, want)
	}
	if lc := label(c); lc == want || !regexp.MustCompile(`^hmac:[0-9a-f]{12}$`).MatchString(lc) {
		t.Errorf("label with a random secret: %q; want another hmac: label than %q", lc, want)
	}
	for _, p := range []*proc{a, b, c} {
		p.stop(t)
	}
	random := func(p *proc) int { return strings.Count(p.stderr.String(), "secret=random") }
	if random(a) != 0 || random(b) != 0 || random(c) != 1 {
		t.Errorf("random-secret lines: %d, %d, %d; want 0, 0 and 1:\n%s", random(a), random(b), random(c), c.stderr.String())
	}
	if !strings.Contains(c.stderr.String(), "level=INFO msg=\"top-key metric labels are hashed with a random secret") {
		t.Errorf("no INFO line for the random secret:\n%s", c.stderr.String())
	}

	// A secret set but empty, or too short to resist guessing, stops the start.
	for _, v := range []string{"", " ", "short"} {
		code, stderr := runSluice(t, append(slices.Clone(listen), KeyHashSecretEnv+"="+v), "serve")
		if code != 1 || !strings.Contains(stderr, "cannot start") || !strings.Contains(stderr, KeyHashSecretEnv) {
			t.Errorf("%s=%q: exit %d, stderr %q; want 1, naming the variable", KeyHashSecretEnv, v, code, stderr)
		}
	}
}

func TestKeyHashSecretOption(t *testing.T) {
	t.Setenv(KeyHashSecretEnv, "from-the-environment-0123456789")
	if got, err := keyHashSecret(""); got != "from-the-environment-0123456789" || err != nil {
		t.Errorf("from the environment: %q, %v", got, err)
	}
	if got, err := keyHashSecret("from-the-options-0123456789"); got != "from-the-options-0123456789" || err != nil {
		t.Errorf("the option wins: %q, %v", got, err)
	}
	if _, err := keyHashSecret("short"); !errors.Is(err, ErrKeyHashSecret) {
		t.Errorf("short option: %v, want ErrKeyHashSecret", err)
	}
	t.Setenv(KeyHashSecretEnv, "")
	if _, err := New(Options{Logger: slog.New(slog.DiscardHandler)}); !errors.Is(err, ErrKeyHashSecret) {
		t.Errorf("New with the variable set but empty: %v, want ErrKeyHashSecret", err)
	}
}
