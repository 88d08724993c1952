package server

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sluicehq/sluice/internal/grpctest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/server/config"
)

// TestReloadRefusesEmptyConfiguration: emptying the file keeps the
// configuration in force, unless the file says allow_empty: true.
func TestReloadRefusesEmptyConfiguration(t *testing.T) {
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	write := func(s string) {
		t.Helper()
		if err := os.WriteFile(file, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("policies:\n  - name: p\n    limit: 5/s\n")
	srv := startServer(t, Options{ConfigFile: file, WatchInterval: -1})
	for _, empty := range []string{"policies: []\n", "domain: edge\ndescriptors: []\n"} {
		write(empty)
		if err := srv.Reload(); !errors.Is(err, ErrNoPolicies) || !strings.Contains(err.Error(), "allow_empty: true") {
			t.Errorf("reload of %q: %v, want ErrNoPolicies saying how to allow it", empty, err)
		}
		if n := len(srv.Service().Config().Policies); n != 1 {
			t.Errorf("after a refused reload: %d policies, want the 1 in force", n)
		}
	}
	write("allow_empty: true\npolicies: []\n")
	if err := srv.Reload(); err != nil {
		t.Fatalf("reload with allow_empty: %v", err)
	}
	if n := len(srv.Service().Config().Policies); n != 0 {
		t.Errorf("%d policies after an allowed empty reload", n)
	}
	write("allow_empty: maybe\npolicies: []\n")
	if err := srv.Reload(); !errors.Is(err, config.ErrConfig) {
		t.Errorf("allow_empty: maybe: %v, want a config error", err)
	}
}

func TestStartRefusesEmptyConfiguration(t *testing.T) {
	file := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(file, []byte("policies: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{ConfigFile: file, Logger: slog.New(slog.DiscardHandler)}); !errors.Is(err, ErrNoPolicies) {
		t.Errorf("New: %v, want ErrNoPolicies", err)
	}
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"check-config", file}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "allow_empty") {
		t.Errorf("check-config: exit %d, %q", code, stderr.String())
	}
}

// TestAPIInvalidUTF8Key: encoding/json would turn invalid UTF-8 into
// U+FFFD, so distinct keys would share a counter: a 400 instead.
func TestAPIInvalidUTF8Key(t *testing.T) {
	e := newAPI(t, nil)
	for _, tt := range []struct {
		name, body string
		code       int
	}{
		{"raw invalid byte", "{\"policy\":\"fw\",\"key\":\"a\xffb\"}", 400},
		{"raw invalid byte in another field", "{\"policy\":\"fw\xfe\",\"key\":\"a\"}", 400},
		{"lone high surrogate", `{"policy":"fw","key":"a\ud800b"}`, 400},
		{"lone low surrogate", `{"policy":"fw","key":"a\udc00"}`, 400},
		{"high surrogate at the end", `{"policy":"fw","key":"a\ud800"}`, 400},
		{"two high surrogates", `{"policy":"fw","key":"\ud800\ud800\udc00"}`, 400},
		{"surrogate pair", `{"policy":"fw","key":"\ud83d\ude00"}`, 200},
		{"escaped backslash before u", `{"policy":"fw","key":"a\\ud800"}`, 200},
		{"U+FFFD itself", `{"policy":"fw","key":"\ufffd"}`, 200},
		{"plain UTF-8", `{"policy":"fw","key":"клиент"}`, 200},
	} {
		for _, path := range []string{"/v1/check", "/v1/peek", "/v1/reset"} {
			w := e.do(t, "POST", path, tt.body, nil, "")
			want := tt.code
			if path == "/v1/reset" && want == 200 {
				want = 204
			}
			if w.Code != want {
				t.Errorf("%s %s: %d %s, want %d", path, tt.name, w.Code, w.Body.String(), want)
			}
			if want == 400 && !strings.Contains(w.Body.String(), "UTF-8") {
				t.Errorf("%s %s: %s, want it to name UTF-8", path, tt.name, w.Body.String())
			}
		}
	}
	// Envoy's JSON form: protojson refuses invalid UTF-8 too.
	if w := e.do(t, "POST", "/json", "{\"domain\":\"sluice\",\"descriptors\":[{\"entries\":[{\"key\":\"fw\",\"value\":\"a\xff\"}]}]}", nil, ""); w.Code != 400 {
		t.Errorf("/json with invalid UTF-8: %d %s", w.Code, w.Body.String())
	}
}

// rawCodec sends bytes as they are, so a test can send what a proto
// marshaller would refuse to build.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *(v.(*[]byte)), nil }
func (rawCodec) Unmarshal(b []byte, v any) error {
	*(v.(*[]byte)) = append([]byte(nil), b...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

var _ encoding.Codec = rawCodec{}

// TestRLSInvalidUTF8: proto3 strings must be UTF-8, so gRPC refuses the
// request before the service sees it: INTERNAL, "string field contains
// invalid UTF-8". Envoy applies failure_mode_deny as to any error.
func TestRLSInvalidUTF8(t *testing.T) {
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	srv := startServer(t, Options{Store: store})
	req, err := proto.Marshal(rlsRequest(config.DefaultDomain, desc("fw=XXXX")))
	if err != nil {
		t.Fatal(err)
	}
	bad := bytes.Replace(req, []byte("XXXX"), []byte("\xff\xfe\xfd\xfc"), 1)
	conn := grpctest.Dial(t, srv.GRPCAddr())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var out []byte
	err = conn.Invoke(ctx, "/"+rlsServiceName+"/ShouldRateLimit", &bad, &out, grpc.ForceCodec(rawCodec{}))
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "UTF-8") {
		t.Errorf("RLS with invalid UTF-8: %v, want INTERNAL naming UTF-8", err)
	}
	good := req
	if err := conn.Invoke(ctx, "/"+rlsServiceName+"/ShouldRateLimit", &good, &out, grpc.ForceCodec(rawCodec{})); err != nil {
		t.Errorf("the same request with valid UTF-8: %v", err)
	}
	var resp rlsv3.RateLimitResponse
	if err := proto.Unmarshal(out, &resp); err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Errorf("response %v, %v", &resp, err)
	}
}

// TestBlockOnlyConfiguration: an Envoy-format file whose only rules are
// blocks (requests_per_unit: 0) limits requests, so it is not empty.
func TestBlockOnlyConfiguration(t *testing.T) {
	file := filepath.Join(t.TempDir(), "block.yaml")
	cfg := "domain: d\ndescriptors:\n  - key: remote_address\n    value: 6.6.6.6\n    rate_limit:\n      unit: second\n      requests_per_unit: 0\n"
	if err := os.WriteFile(file, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"check-config", file}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "blocked (0 per 1s)") {
		t.Errorf("check-config: exit %d, stdout %q, stderr %q", code, stdout.String(), stderr.String())
	}
	p := startSluice(t, nil, "--config", file, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0")
	for value, want := range map[string]int{"6.6.6.6": 429, "1.2.3.4": 200} {
		body := `{"domain":"d","descriptors":[{"entries":[{"key":"remote_address","value":"` + value + `"}]}]}`
		if code, m := p.post(t, "/json", body); code != want {
			t.Errorf("/json for %s: %d %v, want %d", value, code, m, want)
		}
	}
	// Emptied to nothing, it is refused again.
	if err := os.WriteFile(file, []byte("domain: d\ndescriptors: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.signal(t, syscall.SIGHUP)
	p.expect(t, "config reload rejected; keeping the configuration in force")
	p.stop(t)
}
