package server

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/server/config"
)

func startTLS(t *testing.T, httpTLS, grpcTLS TLSFiles, logs *syncBuffer) *Server {
	t.Helper()
	return runServer(t, Options{HTTPTLS: httpTLS, GRPCTLS: grpcTLS, Logger: slog.New(slog.NewTextHandler(logs, nil))})
}

// servedCN does one HTTPS request and returns the server certificate's
// common name.
func servedCN(t *testing.T, addr string, cfg *tls.Config) (string, error) {
	t.Helper()
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}, Timeout: 5 * time.Second}
	resp, err := c.Get("https://" + addr + "/healthz")
	if err != nil {
		return "", err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return "", errors.New(resp.Status)
	}
	return resp.TLS.PeerCertificates[0].Subject.CommonName, nil
}

// TestServerHTTPTLS: HTTPS with a real client; the certificate replaced on
// disk is served within a second, without a restart; a broken pair is
// logged and the previous one kept.
func TestServerHTTPTLS(t *testing.T) {
	t.Parallel()
	certs := testcert.New(t, "http")
	var logs syncBuffer
	srv := startTLS(t, TLSFiles{CertFile: certs.CertFile, KeyFile: certs.KeyFile}, TLSFiles{}, &logs)
	trust := &tls.Config{RootCAs: certs.Pool}
	if cn, err := servedCN(t, srv.HTTPAddr(), trust); err != nil || cn != "http server" {
		t.Fatalf("HTTPS: %q, %v", cn, err)
	}
	if resp, err := http.Get("http://" + srv.HTTPAddr() + "/healthz"); err == nil && resp.StatusCode == 200 {
		t.Error("plaintext HTTP answered on the TLS port")
	}

	certs.Issue(t, certs.CertFile, certs.KeyFile, "rotated server", true)
	waitCN(t, srv.HTTPAddr(), trust, "rotated server")
	logged(t, &logs, "TLS certificate reloaded")

	// A half-written pair (a key that does not match): keep serving.
	if err := os.WriteFile(certs.KeyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(certReloadInterval + 100*time.Millisecond)
	if cn, err := servedCN(t, srv.HTTPAddr(), trust); err != nil || cn != "rotated server" {
		t.Errorf("after a broken key: %q, %v; want the previous certificate", cn, err)
	}
	logged(t, &logs, "level=ERROR", "TLS certificate reload failed")
}

func waitCN(t *testing.T, addr string, cfg *tls.Config, want string) {
	t.Helper()
	var cn string
	var err error
	if !eventually(func() bool { cn, err = servedCN(t, addr, cfg); return err == nil && cn == want }) {
		t.Fatalf("served %q (%v), want %q", cn, err, want)
	}
}

// eventually polls cond for up to 10s: long past the second a reload or a
// check may take, so that only a failure, not a slow machine, times out.
func eventually(cond func() bool) bool {
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// TestServerMutualTLS: with a client CA, HTTP and gRPC refuse clients
// without a certificate it signed; a replaced client CA applies to new
// connections.
func TestServerMutualTLS(t *testing.T) {
	t.Parallel()
	certs := testcert.New(t, "mtls")
	files := TLSFiles{CertFile: certs.CertFile, KeyFile: certs.KeyFile, ClientCAFile: certs.CAFile}
	var logs syncBuffer
	srv := startTLS(t, files, files, &logs)

	if _, err := servedCN(t, srv.HTTPAddr(), &tls.Config{RootCAs: certs.Pool}); err == nil {
		t.Error("HTTPS without a client certificate was served")
	}
	if _, err := servedCN(t, srv.HTTPAddr(), certs.ClientConfig(t)); err != nil {
		t.Errorf("HTTPS with a client certificate: %v", err)
	}

	rls := func(cfg *tls.Config) (string, error) {
		conn, err := grpc.NewClient(srv.GRPCAddr(), grpc.WithTransportCredentials(credentials.NewTLS(cfg)))
		if err != nil {
			return "", err
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var p peer.Peer
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, rlsRequest(config.DefaultDomain, desc("api_key=k")), grpc.Peer(&p))
		if err != nil {
			return "", err
		}
		return p.AuthInfo.(credentials.TLSInfo).State.PeerCertificates[0].Subject.CommonName, nil
	}
	if _, err := rls(&tls.Config{RootCAs: certs.Pool}); err == nil {
		t.Error("gRPC without a client certificate was served")
	}
	if cn, err := rls(certs.ClientConfig(t)); err != nil || cn != "mtls server" {
		t.Errorf("gRPC with a client certificate: %q, %v", cn, err)
	}

	// Rotate the server certificate; gRPC picks it up too.
	certs.Issue(t, certs.CertFile, certs.KeyFile, "rotated mtls server", true)
	var cn string
	var err error
	if !eventually(func() bool { cn, err = rls(certs.ClientConfig(t)); return err == nil && cn == "rotated mtls server" }) {
		t.Fatalf("gRPC served %q (%v) after the rotation", cn, err)
	}

	// A new client CA: certificates of the old one are refused.
	other := testcert.New(t, "other")
	ca, err := os.ReadFile(other.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certs.CAFile+".tmp", ca, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(certs.CAFile+".tmp", certs.CAFile); err != nil {
		t.Fatal(err)
	}
	if !eventually(func() bool { _, err := servedCN(t, srv.HTTPAddr(), certs.ClientConfig(t)); return err != nil }) {
		t.Fatal("a client of the replaced CA is still served")
	}
	otherClient := other.ClientConfig(t)
	otherClient.RootCAs = certs.Pool // the server certificate is still the first CA's
	if _, err := servedCN(t, srv.HTTPAddr(), otherClient); err != nil {
		t.Errorf("a client of the new CA: %v", err)
	}
}

func TestServerTLSBadFiles(t *testing.T) {
	certs := testcert.New(t, "bad")
	for _, files := range []TLSFiles{
		{CertFile: certs.CertFile},
		{CertFile: certs.CertFile, KeyFile: certs.ClientKeyFile},
		{CertFile: certs.CertFile, KeyFile: certs.KeyFile, ClientCAFile: certs.KeyFile},
		{CertFile: "/nonexistent.pem", KeyFile: certs.KeyFile},
	} {
		srv, err := New(Options{HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", GRPCTLS: files, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		err = srv.Start()
		srv.Shutdown(context.Background())
		if !errors.Is(err, ErrTLS) || !strings.HasPrefix(err.Error(), "server: TLS: grpc: ") {
			t.Errorf("%+v: %v, want ErrTLS", files, err)
		}
	}
}
