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
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ctxutil"
	"github.com/sluicehq/sluice/internal/tick"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/server/config"
	"github.com/sluicehq/sluice/server/dashboard"
)

// Options configures a Server. The zero value runs the demo configuration
// on the memory store, HTTP on 127.0.0.1:8080 and gRPC on 127.0.0.1:8081.
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
	// HTTPAddr is the JSON API, dashboard and metrics address. Default
	// ":8080", or "127.0.0.1:8080" for the demo (no ConfigFile).
	HTTPAddr string
	// GRPCAddr is the Envoy rate limit service address. Default ":8081",
	// or "127.0.0.1:8081" for the demo.
	GRPCAddr string
	// HTTPTLS and GRPCTLS serve TLS (mutual TLS with a client CA) on each
	// listener, following changes to the files. Default: plaintext.
	HTTPTLS, GRPCTLS TLSFiles
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
	// FleetSize is how many instances share Redis (with RedisURL). Under
	// the local failure policy each instance then admits a 1/FleetSize
	// share of every limit while Redis is away, so that the fleet as a
	// whole stays within the fallback bound (package resilient). Default:
	// discovered through Redis (resilient.Fleet); resilient.DefaultFleetSize,
	// with a warning, while Redis cannot be reached at start.
	FleetSize int
	// MaxKeys bounds the keys an in-process memory store holds
	// (memory.Options.MaxKeys): the embedded store without RedisURL, the
	// local failure policy's with it. Default: memory.DefaultMaxKeys.
	MaxKeys int
	// FleetShrink is resilient.FleetOptions.Shrink: how long the
	// discovered size must count fewer instances before it falls, and how
	// long (with the registration's 3s) an instance cut off from Redis
	// keeps its share. Default: resilient.DefaultFleetShrink.
	FleetShrink time.Duration
	// AdminToken guards admin endpoints; see HandlerOptions. Without one,
	// admin endpoints answer loopback clients while HTTPAddr is
	// loopback-only, and are disabled otherwise.
	AdminToken string
	// InsecureAdmin keeps admin endpoints open to loopback clients without
	// an admin token even when HTTPAddr is reachable from other hosts
	// (where a proxy on this host passes for loopback). Default false.
	InsecureAdmin bool
	// DecisionToken, if set, is the bearer token decisions require: HTTP
	// "Authorization: Bearer <token>", gRPC "authorization" metadata.
	// Default: none.
	DecisionToken string
	// StoreCheckInterval is how often Redis (or Ready) is checked, so that
	// losing and regaining it is logged and counted. Default 1s.
	StoreCheckInterval time.Duration
	// WatchInterval is how often the config file's modification time is
	// checked for changes. Default 2s; negative disables watching.
	WatchInterval time.Duration
	// Dashboard is served at "/" and every path the API does not take.
	// Default: the built-in dashboard, whose page paths (/, /index.html,
	// /static/...) take GET and HEAD alone, any other path being 404, both
	// as problems. Any other handler answers every request it is sent
	// itself, whatever the method, its 404s and 405s included, unchanged;
	// its writer supports Flush (http.Flusher, http.ResponseController).
	Dashboard http.Handler
	// ReadTimeout bounds how long the HTTP listener waits for a request,
	// headers and body: a body still arriving then is answered 408, so
	// that slow clients cannot hold connections. 0 or less: 20s.
	ReadTimeout time.Duration
	// MaxConnections caps the connections each listener (HTTP, gRPC) holds
	// open at once; a connection past it is closed as soon as accepted.
	// 0 or less: DefaultMaxConnections.
	MaxConnections int
	// Logger receives the service's log. Default: text to stderr.
	Logger *slog.Logger
	// KeyHashSecret keys the hash that stands for a key in the top-key
	// metrics' labels (ServiceOptions.KeyHashSecret), at least
	// MinKeyHashSecret bytes: give every instance of a fleet the same, so
	// that their labels agree. Default: $SLUICE_KEY_HASH_SECRET, else a
	// random secret per process (logged at start).
	KeyHashSecret string
}

// Server runs the service. Build it with New, then Start; stop it with
// Shutdown.
type Server struct {
	opts    Options
	log     *slog.Logger
	svc     *Service
	metrics *Metrics
	health  *Health
	closers []func()
	redis   redis.UniversalClient // nil without --redis
	// evictions watches Redis's evicted_keys; nil without --redis.
	evictions *evictionWatch
	// memWatch watches the memory store's evictions; nil without one.
	memWatch *memoryWatch

	httpSrv    *http.Server
	grpcSrv    *grpc.Server
	grpcHealth *health.Server
	httpLn     net.Listener
	httpCap    *capListener // beneath httpLn's TLS, if any
	grpcCap    *capListener
	grpcLn     net.Listener
	stop       chan struct{}
	wg         sync.WaitGroup
	reloadMu   sync.Mutex
	stamp      string // config files' modification times and sizes
	fleet      *Fleet
	fleetSize  func() int       // the instances sharing Redis; nil without it
	registry   *resilient.Fleet // this instance's fleet registration; nil without Redis
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

// budgetUnary gives a call with a deadline a store budget that ends
// budgetMargin before it, and at most the decision timeout (see
// withBudget), so that the failure policy answers before the caller gives
// up.
func (s *Server) budgetUnary(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	dl, ok := ctx.Deadline()
	if !ok {
		return handler(ctx, req)
	}
	ctx, cancel := withBudget(ctx, dl.Add(-budgetMargin))
	defer cancel()
	return handler(ctx, req)
}

// New loads the configuration and connects the store. Nothing listens
// until Start.
func New(opts Options) (*Server, error) {
	// The demo listens on loopback only: its first command must be safe.
	host := ""
	if opts.ConfigFile == "" {
		host = "127.0.0.1"
	}
	if opts.HTTPAddr == "" {
		opts.HTTPAddr = host + ":8080"
	}
	if opts.GRPCAddr == "" {
		opts.GRPCAddr = host + ":8081"
	}
	if opts.StoreCheckInterval <= 0 {
		opts.StoreCheckInterval = DefaultStoreCheckInterval
	}
	if opts.WatchInterval == 0 {
		opts.WatchInterval = 2 * time.Second
	}
	if opts.MaxKeys <= 0 {
		opts.MaxKeys = memory.DefaultMaxKeys
	}
	if opts.Dashboard == nil {
		opts.Dashboard = dashboard.Handler()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	secret, err := keyHashSecret(opts.KeyHashSecret)
	if err != nil {
		return nil, err
	}
	s := &Server{opts: opts, log: opts.Logger, metrics: NewMetrics(), stop: make(chan struct{})}
	cfg, err := s.loadConfig()
	if err != nil {
		return nil, err
	}
	s.stamp = configStamp(cfg.Files)
	s.health = newHealth(healthOptions{
		log: s.log, policy: policyName(opts), withPolicy: !opts.NoFailurePolicy, store: "memory",
		// Until the service exists, the configuration loaded above counts.
		configured: func() bool { return s.svc == nil || s.svc.Config() != nil }, reg: s.metrics.Registry(),
		live: cmp.Or(opts.DecisionTimeout, resilient.DefaultTimeout),
	})
	s.health.setFallback = s.metrics.SetFallback
	s.health.setStalled = s.metrics.stalled.Store
	s.health.policyOf = s.policyOf
	s.metrics.health = s.health
	store, err := s.openStore()
	if err != nil {
		s.close()
		return nil, err
	}
	s.svc = NewService(store, cfg, &ServiceOptions{Metrics: s.metrics, Logger: s.log, FleetSize: s.fleetSize, KeyHashSecret: []byte(secret)})
	if secret == "" {
		s.log.Info("top-key metric labels are hashed with a random secret: they differ between instances and restarts; "+
			"set "+KeyHashSecretEnv+", the same on every instance, for labels that agree", "secret", "random")
	}
	s.metrics.loaded()
	s.watchFleet(store)
	if s.evictions != nil {
		s.evictions.lost = s.slotsLost
	}
	return s, nil
}

// slotsLost stops counting the in-flight slots that node lost, a restart
// or a flush (what) having erased the keys written before before
// (Service.storeLost): on a Cluster those of its keys, by the slot map;
// else every one.
func (s *Server) slotsLost(node, what string, before time.Time) int64 {
	on := func(string) bool { return true }
	if cc, ok := s.redis.(*redis.ClusterClient); ok {
		on = func(skey string) bool {
			ctx, cancel := context.WithTimeout(context.Background(), redisInfoTimeout)
			defer cancel()
			m, err := cc.MasterForKey(ctx, skey)
			return err == nil && m.Options().Addr == node
		}
	}
	return s.svc.storeLost(node, what, before, on)
}

func (s *Server) loadConfig() (*config.Config, error) {
	if s.opts.ConfigFile == "" {
		return DemoConfig(), nil
	}
	cfg, err := config.Load(s.opts.ConfigFile)
	if err != nil {
		return nil, err
	}
	return cfg, requirePolicies(cfg)
}

func (s *Server) openStore() (sluice.Store, error) {
	switch {
	case s.opts.Store != nil:
		s.health.store, s.health.probe = "custom", s.opts.Ready
		return s.opts.Store, nil
	case s.opts.RedisURL != "":
		redisURL, storeOpts, err := storeURLOptions(s.opts.RedisURL)
		if err != nil {
			return nil, err
		}
		// A Sentinel client follows every Sentinel's announcements
		// (redisstore.FollowSentinels): on a switch its connections to
		// the old master close, and once it reaches the new one the
		// breaker probes at once, as on a Cluster (probe, set below).
		replaced := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_redis_replaced_master_total",
			Help: "Sentinel only: times the client was on a master a Sentinel announced replaced (its replica promoted, +switch-master), how=closed: its connections closed, so that it dials the new one; how=redirected: its Sentinel still named the old one, and the client's dials went to the new one until the Sentinels agreed.",
		}, []string{"how"})
		failovers := prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_redis_failovers_total",
			Help: "Redis master changes seen: kind cluster (the masters of the slot map changed), sentinel (the promoted replica reporting master, +promoted-slave or +switch-master, once per change). Writes the old master had not replicated are lost with it: the limits they counted start partly afresh.",
		}, []string{"kind"})
		roleRefused := prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_redis_sentinel_role_refused_total",
			Help: "Sentinel only: times the replica a Sentinel was promoting refused INFO replication (an ACL user without +info), so the instance left the old master only at the Sentinel's +promoted-slave, most of a second later.",
		})
		staleSwitches := prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_redis_sentinel_stale_switches_total",
			Help: "Sentinel only: +switch-master announcements ignored as older (by config epoch) than the master change acted on: a failover's leader finishing late, or a Sentinel hearing of it late. Each is also an INFO line.",
		})
		var probe atomic.Pointer[func(context.Context) error]
		probeNow := func(ctx context.Context) error {
			if p := probe.Load(); p != nil {
				return (*p)(ctx)
			}
			return nil
		}
		var (
			client   redis.UniversalClient
			built    = make(chan struct{}) // client is set
			follower *redisstore.SentinelFollower
		)
		follow := func(o *redis.FailoverOptions) {
			switches := failovers.WithLabelValues("sentinel")
			follower = redisstore.FollowSentinels(o, &redisstore.FollowOptions{
				Logger:        s.log,
				OnDegraded:    s.health.setSentinel,
				OnReplaced:    func(how string) { replaced.WithLabelValues(how).Inc() },
				OnRoleRefused: func(string) { roleRefused.Inc() },
				OnStaleSwitch: func(string, string) { staleSwitches.Inc() },
				OnSwitch: func(ctx context.Context, from, to string) {
					switches.Inc()
					select {
					case <-built:
					case <-ctx.Done():
						return
					}
					probeAfterSwitch(ctx, func(ctx context.Context) error { return client.Ping(ctx).Err() }, probeNow)
				},
			})
		}
		client, err = newRedisClient(redisURL, s.opts.DecisionTimeout, follow)
		if err != nil {
			return nil, err
		}
		close(built)
		redisstore.DetectRefusals(client) // Redis at maxclients: its words, not a broken pipe
		s.closers = append(s.closers, func() { client.Close() })
		if follower != nil {
			replaced.WithLabelValues("closed")
			replaced.WithLabelValues("redirected")
			s.metrics.reg.MustRegister(replaced, roleRefused, staleSwitches)
			s.closers = append(s.closers, follower.Close)
		}
		// Before the start's check: its dials say whether a check that
		// timed out met a Redis that accepts connections (stalled) or
		// none (unreachable).
		dials := redisstore.WatchDials(client)
		s.health.connected = dials.Reached
		storeOpts.Dials = dials // the Store's own dials, asking, in one record
		if err := s.checkRedis(client); err != nil {
			return nil, err
		}
		// Under every policy: /readyz asks Redis only under error, but the
		// watch's checks tell a killed Redis (the store lost line,
		// /v1/status, sluice_store_up) at the first refused dial, not a
		// second later; the cost is one more connection per instance.
		var closeQuick func()
		s.health.quick, closeQuick = quickPing(client)
		s.health.refusals = refusedDials(client)
		s.closers = append(s.closers, closeQuick)
		s.checkWait(client, storeOpts)
		s.redis = client
		s.metrics.storeName = "redis"
		info := newRedisInfo(client, 0)
		info.evictions = newEvictionWatch(s.log, s.opts.StoreCheckInterval)
		s.evictions = info.evictions
		s.metrics.reg.MustRegister(info)
		s.metrics.timeout.Set(cmp.Or(s.opts.DecisionTimeout, resilient.DefaultTimeout).Seconds())
		storeOpts.Logger = s.log
		rs := redisstore.New(client, &storeOpts)
		if err := s.checkAccess(rs); err != nil {
			return nil, err
		}
		if !s.health.storeDown() {
			// Connections and scripts ready before the first decision: a
			// distant Redis's first calls would pay handshakes and
			// NOSCRIPT over the decision timeout, and open the breaker.
			ctx, cancel := context.WithTimeout(context.Background(), s.startTimeout())
			if err := rs.Warm(ctx); err != nil {
				s.log.Warn("Redis warm-up incomplete; the first decisions dial and load scripts themselves", "err", err)
			}
			cancel()
		}
		s.metrics.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_redis_cluster_reloads_total",
			Help: "Times the Redis store reloaded a cluster's slot map after a connection error or a timed-out call (a failover, usually).",
		}, func() float64 { return float64(rs.ClusterReloads()) }))
		s.metrics.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_redis_stalls_total",
			Help: "Times a Redis server (a Cluster master) stopped answering the store's calls: a send cut off unanswered after one was answered, and nothing answered for 50ms from its start (a send cut sooner by its caller's deadline, Redis answering, is none). While it lasts the store sends it one batch at a time.",
		}, func() float64 { return float64(rs.Stalls()) }))
		s.metrics.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_redis_round_trip_seconds",
			Help: "The Redis store's smoothed round trip (the slowest master's on a cluster). Over a quarter of the decision timeout decisions stop waiting to be batched; near it they time out.",
		}, func() float64 { return rs.RoundTrip().Seconds() }))
		// A failover is counted whatever the failure policy; with one, its
		// breaker probes the new master at once (probe, set below).
		s.metrics.reg.MustRegister(failovers)
		clusterFailovers := failovers.WithLabelValues("cluster")
		rs.OnFailover(func() { clusterFailovers.Inc(); probeNow(context.Background()) })
		fleet, err := s.startFleet(rs)
		if err != nil {
			return nil, err
		}
		s.closers = append(s.closers, func() { fleet.Close() })
		s.fleetSize, s.registry = fleet.Size, fleet
		if s.opts.NoFailurePolicy {
			// No policy answers for Redis, but a decision stays bounded:
			// the error reaches Envoy, which applies failure_mode_deny.
			return budgetStore{rs, cmp.Or(s.opts.DecisionTimeout, resilient.DefaultTimeout)}, nil
		}
		s.metrics.wrapped = true
		var local sluice.Store // resilient's own default unless bounded here
		if s.opts.FailurePolicy == resilient.FallbackLocal {
			local = s.memoryStore()
		}
		store, err := resilient.NewMulti(budgetStore{rs, 0}, &resilient.Options{
			Name: "redis", Policy: s.opts.FailurePolicy, Timeout: s.opts.DecisionTimeout, Observer: healthObserver{s.metrics, s.health},
			Fleet: fleet, Logger: s.log, Cause: s.metrics.cause, // a line per breaker transition and per failure policy switch
			DenyCacheFor: s.leaseFor, Fallback: local,
		})
		if err != nil {
			return nil, fmt.Errorf("server: failure policy: %w", err)
		}
		s.closers = append(s.closers, func() { store.Close() })
		s.health.breaker = func(ctx context.Context) { store.Probe(ctx) }
		s.health.breakerNow = func(ctx context.Context) { store.ProbeNow(ctx) }
		probeStore := store.ProbeNow
		probe.Store(&probeStore) // back on Redis soon after a promotion
		return store, nil
	}
	return s.memoryStore(), nil
}

// memoryStore makes an in-process store of at most MaxKeys keys, closed
// with the server.
func (s *Server) memoryStore() *memory.Store {
	m := memory.New(&memory.Options{MaxKeys: s.opts.MaxKeys})
	s.closers = append(s.closers, func() { m.Close() })
	s.memWatch = newMemoryWatch(m, s.log, s.health, s.opts.StoreCheckInterval)
	s.health.memory = s.memWatch.status
	s.metrics.reg.MustRegister(s.memWatch)
	return m
}

// leaseFor is the Redis deny cache's DenyCacheFor: a leased policy's key
// keeps a denial at most its lease's D, so that a Reset through another
// instance reaches the requests its leases send to Redis within D, as
// docs/leases.md promises. s.svc is set before any decision.
func (s *Server) leaseFor(key string, limit sluice.Limit) time.Duration {
	if s.svc == nil {
		return 0
	}
	return s.svc.leaseFor(key, limit)
}

// policyOf is Health.policyOf: the policy whose store key key is.
func (s *Server) policyOf(key string) string {
	if s.svc == nil {
		return ""
	}
	return s.svc.policyOf(key)
}

// Service returns the decision service.
func (s *Server) Service() *Service { return s.svc }

// Metrics returns the Prometheus metrics.
func (s *Server) Metrics() *Metrics { return s.metrics }

// Start listens on the HTTP and gRPC addresses and serves in the
// background. The bound addresses are then available from HTTPAddr and
// GRPCAddr (useful with port 0).
func (s *Server) Start() error {
	// Its listeners, metrics and store are set up once: a second Start
	// would register them again, and one after Shutdown use a closed store.
	select {
	case <-s.stop:
		return fmt.Errorf("server: Start after Shutdown: %w", http.ErrServerClosed)
	default:
	}
	grpcCreds, err := s.listen()
	if err != nil {
		return err
	}
	admin := adminMode(s.opts.AdminToken, s.opts.HTTPAddr, s.opts.InsecureAdmin)
	if admin == AdminDisabled {
		s.log.Warn("admin endpoints disabled: HTTP listens beyond loopback without an admin token; set --admin-token, or --insecure-admin to allow loopback clients",
			"http", s.opts.HTTPAddr)
	}
	readTimeout := httpReadTimeout
	if s.opts.ReadTimeout > 0 {
		readTimeout = s.opts.ReadTimeout
	}
	s.httpSrv = &http.Server{
		Handler: s.svc.Handler(&HandlerOptions{
			AdminToken: s.opts.AdminToken, AdminDisabled: admin == AdminDisabled, InsecureAdmin: admin == AdminInsecure, DecisionToken: s.opts.DecisionToken,
			Health: s.health, Metrics: s.metrics, Dashboard: s.opts.Dashboard,
		}),
		ReadHeaderTimeout: min(httpReadHeaderTimeout, readTimeout),
		ReadTimeout:       readTimeout,
		WriteTimeout:      httpWriteTimeout + s.opts.DecisionTimeout,
		IdleTimeout:       httpIdleTimeout,
		ErrorLog:          slog.NewLogLogger(quietOwnCloses{s.log.Handler()}, slog.LevelWarn),
		ConnState:         s.httpCap.httpConnState,
		ConnContext:       s.httpCap.httpConnContext,
	}
	s.httpSrv.Handler = s.httpCap.httpRequests(s.metrics.instrumentHTTP(s.httpCap.probesOnly(s.httpSrv.Handler)))
	// The gate refuses calls without the decision token on their headers;
	// grpcToken below still guards the handlers.
	conns := grpcConns{s.grpcCap}
	gate := newGRPCGate(conns, s.opts.DecisionToken, s.metrics, s.log)
	// Workers keep their grown stacks between requests: a new goroutine
	// per request would grow its stack through the Redis client every time.
	s.grpcSrv = grpc.NewServer(grpc.NumStreamWorkers(uint32(64*runtime.GOMAXPROCS(0))), grpcCreds,
		grpc.ConnectionTimeout(grpcHandshake), grpc.StatsHandler(conns), grpc.InTapHandle(gate.tap),
		grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionIdle: grpcMaxIdle, Time: grpcPing, Timeout: grpcPingTimeout}),
		// Envoy's connection keepalive, if configured, pings at most this
		// often; a client pinging faster is sent away (grpc-go's default
		// allows one ping in 5 minutes, and none without a call).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(s.metrics.instrumentGRPC, s.recoverUnary, grpcToken(s.opts.DecisionToken), s.budgetUnary))
	s.svc.RegisterRLS(s.grpcSrv)
	s.grpcHealth = health.NewServer()
	healthpb.RegisterHealthServer(s.grpcSrv, s.grpcHealth)
	gate.serving(s.grpcSrv)
	s.health.setGRPC(s.grpcHealth)
	s.wg.Add(3)
	go func() {
		defer s.wg.Done()
		s.health.watch(s.stop, s.opts.StoreCheckInterval)
	}()
	if s.evictions != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.evictions.watch(s.stop, s.opts.StoreCheckInterval, s.redis, s.health.storeDown)
		}()
	}
	if s.memWatch != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.memWatch.watch(s.stop, s.opts.StoreCheckInterval)
		}()
	}
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
	if s.fleet != nil {
		s.fleet.Start()
	}
	if s.registry != nil {
		s.registry.Start()
	}
	return nil
}

// HTTPAddr returns the HTTP listener's address once started ("" before).
func (s *Server) HTTPAddr() string {
	if s == nil || s.httpLn == nil {
		return ""
	}
	return s.httpLn.Addr().String()
}

// GRPCAddr returns the gRPC listener's address once started ("" before).
func (s *Server) GRPCAddr() string {
	if s == nil || s.grpcLn == nil {
		return ""
	}
	return s.grpcLn.Addr().String()
}

// Reload reads the configuration file again and swaps it in. A bad
// configuration is rejected and the one in force stays. Requests in flight
// finish under the configuration they started with. Either way the result
// is logged once, here, and the error also returned.
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
	if err == nil {
		err = requirePolicies(cfg)
	}
	if err != nil {
		s.metrics.reload(false)
		s.svc.rejectConfig(s.opts.ConfigFile, err)
		s.log.Error("config reload rejected; keeping the configuration in force", "err", err)
		return err
	}
	s.svc.SetConfig(cfg)
	s.metrics.reload(true)
	s.log.Info("config reloaded", "policies", len(cfg.Policies), "files", len(cfg.Files))
	return nil
}

// watch reloads when the config files' modification times or sizes change.
// A file that goes missing (or a directory that cannot be listed) is a
// failed reload, logged and counted once until it is back.
func (s *Server) watch() {
	defer s.wg.Done()
	var listErr string // the error being reported, "" while listing works
	tick.Every(s.stop, s.opts.WatchInterval, func() {
		files, err := config.Files(s.opts.ConfigFile)
		if err != nil {
			if err.Error() != listErr {
				listErr = err.Error()
				s.metrics.reload(false)
				s.svc.rejectConfig(s.opts.ConfigFile, err)
				s.log.Error("config reload rejected; keeping the configuration in force", "file", s.opts.ConfigFile, "err", err)
			}
			return
		}
		s.reloadMu.Lock()
		changed := configStamp(files) != s.stamp
		s.reloadMu.Unlock()
		if changed || listErr != "" {
			listErr = ""
			s.Reload() // logs its result
		}
	})
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
// ends), then for the releases being sent again in the background (until
// ctx ends, at most maxReleaseWait: their count is logged if any are
// left), withdraws the fleet report, returns unused lease units (bounded
// by leaseReturnTimeout, even when ctx's deadline cut the wait short) and
// releases the store. A ctx canceled (a second signal: stop now) makes it
// return at once: the rest goes on in the background, and unused lease
// units are not returned but expire.
func (s *Server) Shutdown(ctx context.Context) error {
	ctx = ctxutil.OrBackground(ctx)
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	var err error
	if s.httpSrv != nil {
		s.grpcHealth.Shutdown()
		err = s.httpSrv.Shutdown(ctx)
		done := make(chan struct{})
		go func() { s.grpcSrv.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			s.grpcSrv.Stop()
		}
	}
	waited := make(chan struct{})
	go func() { s.wg.Wait(); close(waited) }()
	select {
	case <-waited:
	case <-ctx.Done():
	}
	s.waitReleases(ctx)
	if errors.Is(ctx.Err(), context.Canceled) {
		go func() {
			<-waited // the health check may still be using the store
			if s.fleet != nil {
				s.fleet.Stop()
			}
			s.svc.Close(ctx) // ctx has ended: stops the leases, returns nothing
			s.close()
		}()
		return cmp.Or(err, ctx.Err())
	}
	if s.fleet != nil {
		s.fleet.Stop()
	}
	s.leaveFleet(ctx)
	// Unused lease units go back while the store is still open; a Redis
	// that does not answer in time keeps them, which only lowers what the
	// fleet admits until they expire.
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseReturnTimeout)
	if lerr := s.svc.Close(lctx); lerr != nil {
		s.log.Warn("lease units not returned at shutdown", "err", lerr)
	}
	cancel()
	s.close()
	return err
}

// waitReleases gives the releases sent again in the background (a
// client's that failed with Redis away: sluice.RetryRelease) what is left
// of ctx, while the store and the fleet's channel are still open: once the
// process is gone, their slots stay held to their hold timeout. Requests
// have stopped, so no more start but those forwarded by the fleet. It
// waits at most maxReleaseWait, within ctx, and no longer than their
// slots' holds: past its hold's end a slot is free anyway.
func (s *Server) waitReleases(ctx context.Context) {
	if s.svc == nil {
		return
	}
	// This service's own: the process's (sluice.WaitReleases) may be
	// another service's in the same process, which its stop waits for.
	n, _ := s.svc.pendingReleases()
	if n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, maxReleaseWait)
	defer cancel()
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	ended := 0
	for left := n; left > 0; {
		select {
		case <-ctx.Done():
			s.log.Warn("in-flight releases not sent before stop; their slots free at their hold timeout", "releases", left, "waited", time.Since(start))
			return
		case <-tick.C:
		}
		var e int
		left, e = s.svc.pendingReleases()
		ended += e
	}
	if ended > 0 {
		s.log.Info("in-flight releases not sent before stop, their holds ended: Redis freed their slots", "releases", ended, "waited", time.Since(start))
	}
	if sent := n - ended; sent > 0 {
		s.log.Info("in-flight releases sent before stop", "releases", sent, "waited", time.Since(start))
	}
}

// maxReleaseWait bounds waitReleases: time for a retry or two once Redis
// is back (they are at most 3s apart). A Redis still down at the stop
// would otherwise hold every stop for the whole grace period, for
// releases that cannot be sent.
const maxReleaseWait = 5 * time.Second

// leaveFleet withdraws the fleet registration once every request has
// finished, so that the others' shares grow at once: a graceful restart
// would otherwise count twice for --fleet-shrink. After a drain that ran
// out a request may still be deciding: the registration then lapses.
func (s *Server) leaveFleet(ctx context.Context) {
	if s.registry == nil || ctx.Err() != nil {
		return
	}
	lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), leaseReturnTimeout)
	defer cancel()
	if err := s.registry.Leave(lctx); err != nil {
		s.log.Warn("fleet registration not withdrawn; the others count this instance until --fleet-shrink after it lapses", "err", err)
	}
}

// leaseReturnTimeout bounds the return of unused lease units at shutdown.
const leaseReturnTimeout = 2 * time.Second

func (s *Server) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
	s.closers = nil
}
