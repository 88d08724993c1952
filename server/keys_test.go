package server

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestKeyEscapesAsRendered: a JSON API key spelling a value with an
// escape its rendering never writes (%41 for "A") is no second counter of
// the value's but a 400 naming the key to send, on every endpoint that
// takes a rendered key; /v1/acquire takes the client's own text, which
// the service escapes, so "%41" is a key apart from "A" there.
func TestKeyEscapesAsRendered(t *testing.T) {
	srv := startServerConfig(t, `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: minute, requests_per_unit: 1}
policies:
  - name: one
    limit: 1/min
    key: "{user}"
  - name: two
    limit: 1/min
    key: "{user}:{ip}"
  - name: jobs
    key: "{user}"
    in_flight: {max: 1, hold: 30s}
`)
	base := "http://" + srv.HTTPAddr()

	// Envoy spends user A's one request; the JSON API's "A" is that counter.
	code, out := postJSON(t, srv, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "A"}}},
	}})
	if code != http.StatusOK || out.GetOverallCode() != rlsv3.RateLimitResponse_OK {
		t.Fatalf("/json user A: %d %v", code, out.GetOverallCode())
	}
	if code, _, _ := post(t, base, "/v1/check", `{"policy":"one","key":"A"}`); code != http.StatusTooManyRequests {
		t.Errorf(`check "A" after Envoy spent it: %d, want 429`, code)
	}

	for _, tt := range []struct{ path, body, detail string }{
		{"/v1/check", `{"policy":"one","key":"%41"}`, `"%41" is not an escape here: a value escapes only '%', '{' and '}' (%25, %7B, %7D); send "A"`},
		{"/v1/peek", `{"policy":"one","key":"%41"}`, `send "A"`},
		{"/v1/reset", `{"policy":"one","key":"%41"}`, `send "A"`},
		{"/v1/check", `{"policy":"one","key":"50%2525%2f"}`, `escape "%2f" must be written in upper case, "%2F"`},
		{"/v1/check", `{"policy":"one","key":"x%7b"}`, `escape "%7b" must be written in upper case, "%7B"`},
		{"/v1/check", `{"policy":"one","key":"a%3Ab"}`, `send "a:b"`},
		// Before the last variable the text between variables is escaped
		// too (a%3Ab:c is user a:b), after it not.
		{"/v1/check", `{"policy":"two","key":"a:b%3Ac"}`, `"%3A" is not an escape here: a value escapes only '%', '{' and '}' (%25, %7B, %7D), and one before the template's last variable the text between its variables too; send "a:b:c"`},
		{"/v1/peek", `{"policy":"two","key":"a%41:c"}`, `send "aA:c"`},
		{"/v1/check", `{"policy":"d.k","key":"k=%41"}`, `"%41" is not an escape here: an entry's key and value escape only '%', ',', '=', '|', '{' and '}' (%25, %2C, %3D, %7C, %7B, %7D); send "k=A"`},
		{"/v1/reset", `{"policy":"d.k","key":"k=a=b%25"}`, `a '=' is written %3D here: an entry's key and value escape only`},
	} {
		code, body, h := post(t, base, tt.path, tt.body)
		detail, _ := body["detail"].(string)
		if code != http.StatusBadRequest || h.Get("Content-Type") != "application/problem+json" || !strings.Contains(detail, tt.detail) {
			t.Errorf("%s %s: %d %s %q; want 400 problem+json saying %q", tt.path, tt.body, code, h.Get("Content-Type"), detail, tt.detail)
		}
	}

	// The rendered forms are taken: escapes the rendering writes, and the
	// text between variables escaped before the last one.
	for _, tt := range []struct{ path, body string }{
		{"/v1/check", `{"policy":"one","key":"50%25%7Bx%7D"}`},
		{"/v1/check", `{"policy":"two","key":"a%3Ab:c"}`},
		{"/v1/peek", `{"policy":"two","key":"a:b:c"}`},
		{"/v1/check", `{"policy":"d.k","key":"k=a%3Db%2C%7C"}`},
	} {
		if code, body, _ := post(t, base, tt.path, tt.body); code != http.StatusOK {
			t.Errorf("%s %s: %d %v, want 200", tt.path, tt.body, code, body)
		}
	}
	if code, _, _ := post(t, base, "/v1/reset", `{"policy":"one","key":"A"}`); code != http.StatusNoContent {
		t.Errorf(`reset "A": %d, want 204`, code)
	}

	// An in-flight key is the client's text: "%41" and "A" hold a slot each.
	for _, key := range []string{"%41", "A", "{x}"} {
		if code, body, _ := post(t, base, "/v1/acquire", `{"policy":"jobs","key":"`+key+`"}`); code != http.StatusOK {
			t.Errorf("acquire %q: %d %v, want 200 (a key of its own)", key, code, body)
		}
	}
}

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

// A key longer than a store key may be is hashed over Envoy RLS; the JSON
// API must hash it the same way, so that both front ends share its counter.
func TestLongKeySharedByRLSAndJSON(t *testing.T) {
	addr := redistest.Addr(t)
	cfg := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: fixed_window 3/1h\n    key: \"{user}\"\n")
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + addr + "/0"})
	p := &proc{http: srv.HTTPAddr()}
	rls := dialRLS(t, srv.GRPCAddr())
	key := redistest.Prefix(t) + strings.Repeat("u", 600)

	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK} {
		r := call(t, rls, rlsRequest("d", desc("user="+key)))
		if r.OverallCode != want || r.Statuses[0].LimitRemaining != uint32(2-i) {
			t.Fatalf("RLS take %d: %v, remaining %d", i+1, r.OverallCode, r.Statuses[0].LimitRemaining)
		}
	}
	body := `{"policy":"api","key":"` + key + `"}`
	if code, m := p.post(t, "/v1/peek", body); code != 200 || m["remaining"] != 1.0 {
		t.Fatalf("peek after two RLS takes: %d %v, want 200 with remaining 1", code, m)
	}
	if code, m := p.post(t, "/v1/check", body); code != 200 || m["remaining"] != 0.0 {
		t.Fatalf("check after two RLS takes: %d %v, want 200 with remaining 0", code, m)
	}
	if r := call(t, rls, rlsRequest("d", desc("user="+key))); r.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("RLS after the JSON check: %v, want OVER_LIMIT", r.OverallCode)
	}
	if code, m := p.post(t, "/v1/reset", body); code/100 != 2 {
		t.Fatalf("reset: %d %v", code, m)
	}
	if r := call(t, rls, rlsRequest("d", desc("user="+key))); r.OverallCode != rlsv3.RateLimitResponse_OK || r.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("RLS after the JSON reset: %v remaining %d, want OK with 2", r.OverallCode, r.Statuses[0].LimitRemaining)
	}
}
