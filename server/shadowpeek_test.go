//go:build unix

package server

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/server/config"
)

// TestShadowPeekFailureOfDeniedRequest: under the error failure policy, an
// ACL refuses a shadow policy's keys. An Envoy request an enforcing
// policy denies peeks the shadow policy (every descriptor gets a
// status); that peek fails, and is counted and logged as a failed shadow
// take is: outcome="error", an error in /v1/stats, one WARN line. Before,
// neither.
func TestShadowPeekFailureOfDeniedRequest(t *testing.T) {
	r := redistest.StartServer(t)
	admin := r.Client(t)
	sluiceUser(t, admin, "shadowpeek")
	allowKeys(t, admin, "shadowpeek", "~sluice:{v*:api@*")
	cfg := writeConfig(t, `
policies:
  - name: dry
    limit: 5/min
    strategy: shadow
    key: "{ip}"
  - name: api
    limit: 1/min
    key: "{user}"
`)
	logs := &syncBuffer{}
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://shadowpeek:pw@" + r.Addr + "/0", NoFailurePolicy: true,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	p := &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}
	rls := dialRLS(t, p.grpc)
	if got := render(call(t, rls, rlsRequest(config.DefaultDomain, desc("user=ann")))); !strings.HasPrefix(got, "OK:") {
		t.Fatalf("first request: %s, want OK", got)
	}
	got := render(call(t, rls, rlsRequest(config.DefaultDomain, desc("user=ann"), desc("ip=1.2.3.4"))))
	if !strings.HasPrefix(got, "OVER_LIMIT:") {
		t.Fatalf("second request, over policy api: %s, want OVER_LIMIT", got)
	}
	if got := scrapedMetric(t, p, `sluice_decisions_total{outcome="error",policy="dry"}`); got != "1" {
		t.Errorf(`sluice_decisions_total{outcome="error",policy="dry"} = %q, want 1 (the failed peek)`, got)
	}
	if got := scrapedMetric(t, p, `sluice_store_errors_total{cause="permission",op="peek",store="redis"}`); got != "1" {
		t.Errorf(`sluice_store_errors_total{op="peek"} = %q, want 1`, got)
	}
	if got := scrapedMetric(t, p, `sluice_decisions_total{outcome="denied",policy="api"}`); got != "1" {
		t.Errorf(`sluice_decisions_total{outcome="denied",policy="api"} = %q, want 1`, got)
	}
	var st struct {
		Overview Overview `json:"overview"`
	}
	if _, body := p.get(t, "/v1/stats"); json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("/v1/stats: %s", body)
	}
	for _, f := range st.Overview.Policies {
		if want := map[string]int64{"dry": 1}[f.Policy]; f.Errors != want {
			t.Errorf("/v1/stats overview %s: %d errors, want %d", f.Policy, f.Errors, want)
		}
	}
	if n := countLines(logs, "shadow policy's store call failed"); n != 1 || !strings.Contains(logs.String(), `"level":"WARN","msg":"shadow policy's store call failed`) ||
		!strings.Contains(logs.String(), `"policy":"dry"`) {
		t.Errorf("%d lines for the shadow policy's failed peek, want one at WARN naming it:\n%s", n, logs)
	}
	// Once per episode: a second denied request adds a count, no line.
	call(t, rls, rlsRequest(config.DefaultDomain, desc("user=ann"), desc("ip=1.2.3.4")))
	if got := scrapedMetric(t, p, `sluice_decisions_total{outcome="error",policy="dry"}`); got != "2" {
		t.Errorf(`after a second denied request: outcome="error" %q, want 2`, got)
	}
	if n := countLines(logs, "shadow policy's store call failed"); n != 1 {
		t.Errorf("%d lines after a second failed peek, want still 1", n)
	}
}
