// Package server is sluice's rate-limit service: one configuration of
// named policies (sluice's own YAML, or envoyproxy/ratelimit's format
// unchanged) served over Envoy's rate limit service API (gRPC), a JSON API
// over HTTP, a live dashboard, health endpoints and Prometheus metrics.
//
// A request visits each file once, in this order:
//
//	rls.go or api.go      the transport: the request becomes engine checks, and
//	                      when they come back decided, statuses, headers, a body
//	config/match.go       which policy answers each descriptor (Envoy) or name (JSON)
//	service.go            each check's store keys, under the configuration in force
//	internal/enforce      the engine: all-or-nothing, strategies, shadow runs
//	store.go              sluice.Store: memory, or Redis behind the failure policy
//	metrics.go, stats.go  the decisions counted, through the engine's observer
//
// The configuration (both formats, matching, check-config's Describe) is
// package config, which imports no store, transport or metrics.
//
// cmd/sluice is a thin main over Main; embedders use New, Start and
// Shutdown.
package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/server/config"
	"github.com/sluicehq/sluice/server/dashboard"
)

// Options configures a Server. The zero value runs the demo configuration
// on the memory store, HTTP on :8080 and gRPC on :8081.
type Options struct {
	// ConfigFile is a configuration file or directory. Default: the
	// built-in demo configuration.
	ConfigFile string
	// RedisURL selects the Redis store (see NewRedisClient). Default: the
	// embedded memory store.
	RedisURL string
	// Store, if set, is used instead of RedisURL or the memory store.
	Store sluice.Store
	// Ready, with Store, reports the store's health for /readyz.
	Ready func(context.Context) error
	// HTTPAddr is the JSON API, dashboard and metrics address. Default ":8080".
	HTTPAddr string
	// GRPCAddr is the Envoy rate limit service address. Default ":8081".
	GRPCAddr string
	// FailurePolicy applies when Redis fails (package resilient): the
	// local fallback by default.
	FailurePolicy resilient.Policy
	// NoFailurePolicy reports Redis failures as errors instead (gRPC
	// UNAVAILABLE, HTTP 503), leaving the choice to Envoy's
	// failure_mode_deny.
	NoFailurePolicy bool
	// DecisionTimeout bounds one Redis call (with or without a failure
	// policy). Default: resilient.DefaultTimeout (50ms).
	DecisionTimeout time.Duration
	// AdminToken guards admin endpoints; see HandlerOptions.
	AdminToken string
	// WatchInterval is how often the config file's modification time is
	// checked for changes. Default 2s; negative disables watching.
	WatchInterval time.Duration
	// Dashboard is served at "/". Default: a placeholder page.
	Dashboard http.Handler
	// Logger receives the service's log. Default: text to stderr.
	Logger *slog.Logger
}

// Server runs the service. Build it with New, then Start; stop it with
// Shutdown.
type Server struct {
	opts    Options
	log     *slog.Logger
	svc     *Service
	metrics *Metrics
	closers []func()
	ready   func(context.Context) error

	httpSrv  *http.Server
	grpcSrv  *grpc.Server
	health   *health.Server
	httpLn   net.Listener
	grpcLn   net.Listener
	stop     chan struct{}
	wg       sync.WaitGroup
	reloadMu sync.Mutex
	stamp    string // config files' modification times and sizes
}

// recoverUnary turns a panic in a handler into an Internal error, logged
// with its stack, as net/http does for HTTP: one bad request must not take
// the service down.
func (s *Server) recoverUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (resp any, err error) {
	defer func() {
		if v := recover(); v != nil {
			s.log.Error("panic serving gRPC", "method", info.FullMethod, "panic", v, "stack", string(debug.Stack()))
			resp, err = nil, status.Error(codes.Internal, "sluice: internal error")
		}
	}()
	return handler(ctx, req)
}

// New loads the configuration and connects the store. Nothing listens
// until Start.
func New(opts Options) (*Server, error) {
	if opts.HTTPAddr == "" {
		opts.HTTPAddr = ":8080"
	}
	if opts.GRPCAddr == "" {
		opts.GRPCAddr = ":8081"
	}
	if opts.WatchInterval == 0 {
		opts.WatchInterval = 2 * time.Second
	}
	if opts.Dashboard == nil {
		opts.Dashboard = dashboard.Handler()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	s := &Server{opts: opts, log: opts.Logger, metrics: NewMetrics(), stop: make(chan struct{})}
	cfg, err := s.loadConfig()
	if err != nil {
		return nil, err
	}
	s.stamp = configStamp(cfg.Files)
	store, err := s.openStore()
	if err != nil {
		s.close()
		return nil, err
	}
	s.svc = NewService(store, cfg, &ServiceOptions{Metrics: s.metrics, Logger: s.log})
	s.metrics.reload(true)
	return s, nil
}

func (s *Server) loadConfig() (*config.Config, error) {
	if s.opts.ConfigFile == "" {
		return DemoConfig(), nil
	}
	return config.Load(s.opts.ConfigFile)
}

func (s *Server) openStore() (sluice.Store, error) {
	switch {
	case s.opts.Store != nil:
		s.ready = s.opts.Ready
		return s.opts.Store, nil
	case s.opts.RedisURL != "":
		client, err := NewRedisClient(s.opts.RedisURL)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { client.Close() })
		s.ready = redisPing(client)
		s.metrics.storeName = "redis"
		rs := redisstore.New(client, nil)
		if s.opts.NoFailurePolicy {
			// No policy answers for Redis, but a decision stays bounded:
			// the error reaches Envoy, which applies failure_mode_deny.
			return deadlineStore{rs, cmp.Or(s.opts.DecisionTimeout, resilient.DefaultTimeout)}, nil
		}
		s.metrics.wrapped = true
		store, err := resilient.NewMulti(rs, &resilient.Options{
			Name: "redis", Policy: s.opts.FailurePolicy, Timeout: s.opts.DecisionTimeout, Observer: s.metrics,
		})
		if err != nil {
			return nil, fmt.Errorf("server: failure policy: %w", err)
		}
		s.closers = append(s.closers, func() { store.Close() })
		return store, nil
	}
	m := memory.New(nil)
	s.closers = append(s.closers, func() { m.Close() })
	return m, nil
}

// Service returns the decision service.
func (s *Server) Service() *Service { return s.svc }

// Metrics returns the Prometheus metrics.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Start listens on the HTTP and gRPC addresses and serves in the
// background. The bound addresses are then available from HTTPAddr and
// GRPCAddr (useful with port 0).
func (s *Server) Start() error {
	var err error
	if s.httpLn, err = net.Listen("tcp", s.opts.HTTPAddr); err != nil {
		return fmt.Errorf("server: http: %w", err)
	}
	if s.grpcLn, err = net.Listen("tcp", s.opts.GRPCAddr); err != nil {
		s.httpLn.Close()
		return fmt.Errorf("server: grpc: %w", err)
	}
	s.httpSrv = &http.Server{
		Handler: s.svc.Handler(&HandlerOptions{
			AdminToken: s.opts.AdminToken, Ready: s.ready, Metrics: s.metrics, Dashboard: s.opts.Dashboard,
		}),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
	}
	// Workers keep their grown stacks between requests: a new goroutine
	// per request would grow its stack through the Redis client every time.
	s.grpcSrv = grpc.NewServer(grpc.NumStreamWorkers(uint32(64*runtime.GOMAXPROCS(0))), grpc.ChainUnaryInterceptor(s.recoverUnary))
	s.svc.RegisterRLS(s.grpcSrv)
	s.health = health.NewServer()
	healthpb.RegisterHealthServer(s.grpcSrv, s.health)
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := s.httpSrv.Serve(s.httpLn); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http server", "err", err)
		}
	}()
	go func() {
		defer s.wg.Done()
		if err := s.grpcSrv.Serve(s.grpcLn); err != nil {
			s.log.Error("grpc server", "err", err)
		}
	}()
	if s.opts.ConfigFile != "" && s.opts.WatchInterval > 0 {
		s.wg.Add(1)
		go s.watch()
	}
	return nil
}

// HTTPAddr returns the HTTP listener's address once started.
func (s *Server) HTTPAddr() string { return s.httpLn.Addr().String() }

// GRPCAddr returns the gRPC listener's address once started.
func (s *Server) GRPCAddr() string { return s.grpcLn.Addr().String() }

// Reload reads the configuration file again and swaps it in. A bad
// configuration is rejected and the one in force stays. Requests in flight
// finish under the configuration they started with.
func (s *Server) Reload() error {
	s.reloadMu.Lock()
	defer s.reloadMu.Unlock()
	if s.opts.ConfigFile == "" {
		s.log.Info("no config file to reload: serving the built-in demo")
		return nil
	}
	// Stamp before reading: a change made while loading is seen next time,
	// and a bad file is not retried until it changes again.
	if files, err := config.Files(s.opts.ConfigFile); err == nil {
		s.stamp = configStamp(files)
	}
	cfg, err := config.Load(s.opts.ConfigFile)
	if err != nil {
		s.metrics.reload(false)
		return err // the caller reports it: the watcher logs, the CLI prints file:line lines
	}
	s.svc.SetConfig(cfg)
	s.metrics.reload(true)
	s.log.Info("config reloaded", "policies", len(cfg.Policies), "files", len(cfg.Files))
	return nil
}

// watch reloads when the config files' modification times or sizes change.
func (s *Server) watch() {
	defer s.wg.Done()
	t := time.NewTicker(s.opts.WatchInterval)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-t.C:
			files, err := config.Files(s.opts.ConfigFile)
			if err != nil {
				continue
			}
			s.reloadMu.Lock()
			changed := configStamp(files) != s.stamp
			s.reloadMu.Unlock()
			if changed {
				if err := s.Reload(); err != nil {
					s.log.Error("config reload rejected; keeping the configuration in force", "err", err)
				}
			}
		}
	}
}

func configStamp(files []string) string {
	var b []byte
	for _, f := range files {
		st, err := os.Stat(f)
		if err != nil {
			b = fmt.Appendf(b, "%s:missing;", filepath.Base(f))
			continue
		}
		b = fmt.Appendf(b, "%s:%d:%d;", f, st.ModTime().UnixNano(), st.Size())
	}
	return string(b)
}

// Shutdown stops accepting requests, waits for those in flight (until ctx
// ends) and releases the store.
func (s *Server) Shutdown(ctx context.Context) error {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	var err error
	if s.httpSrv != nil {
		s.health.Shutdown()
		err = s.httpSrv.Shutdown(ctx)
		done := make(chan struct{})
		go func() { s.grpcSrv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			s.grpcSrv.Stop()
		}
	}
	s.wg.Wait()
	s.close()
	return err
}

func (s *Server) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}

func redisPing(c redis.UniversalClient) func(context.Context) error {
	return func(ctx context.Context) error { return c.Ping(ctx).Err() }
}
