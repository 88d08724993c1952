package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// ErrTLS is wrapped by errors about TLS certificate files.
var ErrTLS = errors.New("server: TLS")

// TLSFiles configures TLS for one listener. The zero value serves
// plaintext.
type TLSFiles struct {
	// CertFile and KeyFile are the PEM certificate (chain) and key. Both or
	// neither; default: plaintext.
	CertFile, KeyFile string
	// ClientCAFile, if set, is a PEM bundle of CAs: clients must present a
	// certificate one of them signed (mutual TLS). Default: no client
	// certificates asked for.
	ClientCAFile string
}

func (f TLSFiles) enabled() bool { return f.CertFile != "" || f.KeyFile != "" || f.ClientCAFile != "" }

// certReloadInterval bounds how often a handshake looks at the files:
// replaced certificates are served within this long of the change.
const certReloadInterval = time.Second

// certReloader serves the certificate files as they are now: a handshake
// that finds a file changed (modification time or size) reads them again.
// A bad new set is logged once and the one in force stays.
type certReloader struct {
	name       string // the listener: http or grpc
	files      TLSFiles
	nextProtos []string
	log        *slog.Logger

	mu       sync.Mutex
	cfg      *tls.Config
	stamp    string
	checked  time.Time
	badStamp string // a set that failed to load, not retried until it changes
}

// newTLSConfig loads files, failing when they do not make a valid set,
// and returns a config that follows later changes to them.
func newTLSConfig(name string, files TLSFiles, nextProtos []string, log *slog.Logger) (*tls.Config, error) {
	if files.CertFile == "" || files.KeyFile == "" {
		return nil, fmt.Errorf("%w: %s: a certificate needs both a certificate file and a key file", ErrTLS, name)
	}
	r := &certReloader{name: name, files: files, nextProtos: nextProtos, log: log}
	cfg, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cfg, r.stamp, r.checked = cfg, r.filesStamp(), time.Now()
	return &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: nextProtos, GetConfigForClient: r.config}, nil
}

func (r *certReloader) load() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(r.files.CertFile, r.files.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: certificate %s and key %s: %v", ErrTLS, r.name, r.files.CertFile, r.files.KeyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: r.nextProtos, Certificates: []tls.Certificate{cert}}
	if r.files.ClientCAFile != "" {
		pem, err := os.ReadFile(r.files.ClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: client CA: %v", ErrTLS, r.name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%w: %s: client CA %s: no PEM certificates", ErrTLS, r.name, r.files.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

func (r *certReloader) filesStamp() string {
	return configStamp([]string{r.files.CertFile, r.files.KeyFile, r.files.ClientCAFile})
}

func (r *certReloader) config(*tls.ClientHelloInfo) (*tls.Config, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if now := time.Now(); now.Sub(r.checked) >= certReloadInterval {
		r.checked = now
		if stamp := r.filesStamp(); stamp != r.stamp && stamp != r.badStamp {
			cfg, err := r.load()
			if err != nil {
				// Often a half-written pair: the next change retries.
				r.badStamp = stamp
				r.log.Error("TLS certificate reload failed; serving the previous certificate", "listener", r.name, "err", err)
			} else {
				r.cfg, r.stamp, r.badStamp = cfg, stamp, ""
				r.log.Info("TLS certificate reloaded", "listener", r.name, "cert", r.files.CertFile)
			}
		}
	}
	return r.cfg, nil
}

// listen opens both listeners, HTTP wrapped in TLS when configured, and
// returns the gRPC server's credentials option.
func (s *Server) listen() (grpc.ServerOption, error) {
	var httpTLS, grpcTLS *tls.Config
	var err error
	if s.opts.HTTPTLS.enabled() {
		if httpTLS, err = newTLSConfig("http", s.opts.HTTPTLS, []string{"h2", "http/1.1"}, s.log); err != nil {
			return nil, err
		}
	}
	if s.opts.GRPCTLS.enabled() {
		if grpcTLS, err = newTLSConfig("grpc", s.opts.GRPCTLS, []string{"h2"}, s.log); err != nil {
			return nil, err
		}
	}
	if s.httpLn, err = net.Listen("tcp", s.opts.HTTPAddr); err != nil {
		return nil, fmt.Errorf("server: http: %w", err)
	}
	if s.grpcLn, err = net.Listen("tcp", s.opts.GRPCAddr); err != nil {
		s.httpLn.Close()
		return nil, fmt.Errorf("server: grpc: %w", err)
	}
	// Capped beneath TLS: a handshake that never finishes holds a place
	// (until one is wanted: it is silent).
	n := s.opts.MaxConnections
	if n <= 0 {
		n = DefaultMaxConnections
	}
	s.httpCap = newCapListener(s.httpLn, "http", n, s.metrics, s.log)
	s.httpLn = s.httpCap
	s.grpcCap = newCapListener(s.grpcLn, "grpc", n, s.metrics, s.log)
	s.grpcLn = s.grpcCap
	if httpTLS != nil {
		s.httpLn = tls.NewListener(s.httpLn, httpTLS)
	}
	if grpcTLS != nil {
		return grpc.Creds(credentials.NewTLS(grpcTLS)), nil
	}
	return grpc.EmptyServerOption{}, nil
}
