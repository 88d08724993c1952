package server

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/server/config"
)

// startServerConfig runs the service on a private redis-server with the
// configuration cfg, listening on loopback for HTTP and gRPC.
func startServerConfig(t *testing.T, cfg string) *Server {
	t.Helper()
	r := redistest.StartServer(t)
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(file, []byte(strings.TrimLeft(cfg, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	return runServer(t, Options{ConfigFile: file, RedisURL: "redis://" + r.Addr, NoFailurePolicy: true})
}

// postJSON posts body to the service's /json and decodes its answer.
func postJSON(t *testing.T, srv *Server, req *rlsv3.RateLimitRequest) (int, *rlsv3.RateLimitResponse) {
	t.Helper()
	body, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.Post("http://"+srv.HTTPAddr()+"/json", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out rlsv3.RateLimitResponse
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if err := protojson.Unmarshal(b, &out); err != nil {
		t.Fatalf("/json answered %d %q: %v", resp.StatusCode, b, err)
	}
	return resp.StatusCode, &out
}

func headerList(resp *rlsv3.RateLimitResponse) string {
	var out []string
	for _, h := range resp.ResponseHeadersToAdd {
		out = append(out, h.Key+": "+h.Value)
	}
	return strings.Join(out, "; ")
}

// TestRLSShadowNeverSuppliesHeaders: a shadow descriptor (a shadow
// policy, shadow_mode, a shadow_mode block) over its limit beside an
// enforced one leaves the headers to the enforced one, and alone gets no
// headers at all, over gRPC and /json alike: a dry run changes nothing a
// client sees. Before, the shadow descriptor, closest to its limit, named
// the headers (X-RateLimit-Remaining: 0 on an admitted request).
func TestRLSShadowNeverSuppliesHeaders(t *testing.T) {
	srv := startServerConfig(t, `
policies:
  - name: shadowy
    limit: fixed_window 3/h
    strategy: shadow
    key: "{sh}"
  - name: api
    limit: fixed_window 10/h
    key: "{api_key}"
---
domain: edge
descriptors:
  - key: dry
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: gone
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	rls := dialRLS(t, srv.GRPCAddr())
	for _, tt := range []struct {
		name     string
		domain   string
		shadow   []*rlcommon.RateLimitDescriptor
		enforced *rlcommon.RateLimitDescriptor
		policy   string // the enforced descriptor's header name
	}{
		{"shadow policy", config.DefaultDomain, []*rlcommon.RateLimitDescriptor{desc("sh=a")}, desc("api_key=k"), "api"},
		{"shadow_mode", "edge", []*rlcommon.RateLimitDescriptor{desc("dry=a")}, desc("user=u"), "edge.user"},
		{"shadow_mode block", "edge", []*rlcommon.RateLimitDescriptor{desc("gone=a")}, desc("user=v"), "edge.user"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Four hits: the shadow descriptor is over its limit, or blocked.
			for range 4 {
				call(t, rls, rlsRequest(tt.domain, tt.shadow...))
			}
			resp := call(t, rls, rlsRequest(tt.domain, append(tt.shadow, tt.enforced)...))
			if resp.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("shadow and enforced: %s, want OK", render(resp))
			}
			if got, want := rlsHeader(resp, "RateLimit"), `"`+tt.policy+`";r=9;`; !strings.HasPrefix(got, want) {
				t.Errorf("shadow first, then enforced: RateLimit %q, want %s... (headers %s)", got, want, headerList(resp))
			}
			if got := rlsHeader(resp, "X-RateLimit-Limit"); got != "10" {
				t.Errorf("X-RateLimit-Limit %q, want 10, the enforced limit's", got)
			}
			// Enforced first: the same choice.
			resp = call(t, rls, rlsRequest(tt.domain, append([]*rlcommon.RateLimitDescriptor{tt.enforced}, tt.shadow...)...))
			if got, want := rlsHeader(resp, "RateLimit"), `"`+tt.policy+`";r=8;`; !strings.HasPrefix(got, want) {
				t.Errorf("enforced first: RateLimit %q, want %s... (headers %s)", got, want, headerList(resp))
			}
			// Shadow alone: admitted, and nothing to tell.
			resp = call(t, rls, rlsRequest(tt.domain, tt.shadow...))
			if resp.OverallCode != rlsv3.RateLimitResponse_OK || len(resp.ResponseHeadersToAdd) != 0 {
				t.Errorf("shadow alone: %s with headers %q, want OK and none", render(resp), headerList(resp))
			}
			// The JSON form answers the same.
			code, jr := postJSON(t, srv, rlsRequest(tt.domain, append(tt.shadow, tt.enforced)...))
			if got, want := rlsHeader(jr, "RateLimit"), `"`+tt.policy+`";r=7;`; code != http.StatusOK || !strings.HasPrefix(got, want) {
				t.Errorf("/json: %d with RateLimit %q, want 200 and %s...", code, got, want)
			}
			code, jr = postJSON(t, srv, rlsRequest(tt.domain, tt.shadow...))
			if code != http.StatusOK || len(jr.ResponseHeadersToAdd) != 0 {
				t.Errorf("/json shadow alone: %d with headers %q, want 200 and none", code, headerList(jr))
			}
		})
	}
}
