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
)

func startTLS(t *testing.T, httpTLS, grpcTLS TLSFiles, logs *syncBuffer) *Server {
	t.Helper()
	srv, err := New(Options{
		HTTPAddr: "127.0.0.1:0", GRPCAddr: "127.0.0.1:0", HTTPTLS: httpTLS, GRPCTLS: grpcTLS,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return srv
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
	deadline := time.Now().Add(5 * time.Second)
	for {
		cn, err := servedCN(t, addr, cfg)
		if err == nil && cn == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("served %q (%v), want %q", cn, err, want)
		}
		time.Sleep(50 * time.Millisecond)
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
		_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, rlsRequest(DefaultDomain, desc("api_key=k")), grpc.Peer(&p))
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
	deadline := time.Now().Add(5 * time.Second)
	for {
		cn, err := rls(certs.ClientConfig(t))
		if err == nil && cn == "rotated mtls server" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("gRPC served %q (%v) after the rotation", cn, err)
		}
		time.Sleep(50 * time.Millisecond)
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
	deadline = time.Now().Add(5 * time.Second)
	for {
		_, err := servedCN(t, srv.HTTPAddr(), certs.ClientConfig(t))
		if err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("a client of the replaced CA is still served")
		}
		time.Sleep(50 * time.Millisecond)
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
