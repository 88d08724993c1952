package server

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/server/config"
)

const usage = `sluice: distributed rate limiting

Usage:
  sluice serve [flags]          run the service (no flags: demo policies on the memory store)
  sluice check-config FILE      validate a configuration and print what it holds
  sluice version                print the version and VCS revision (also --version)

Run "sluice serve -h" for the serve flags.
`

// Main runs the sluice command line (args without the program name) and
// returns the process exit code. After serve, SIGINT, SIGTERM and SIGHUP
// stay caught (and are dropped): the caller is to exit with the code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stderr)
	case "check-config":
		return checkConfig(args[1:], stdout, stderr)
	case "version", "-version", "--version":
		fmt.Fprintln(stdout, ReadBuildInfo())
		return 0
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "sluice: unknown command %q\n\n%s", args[0], usage)
	return 2
}

const checkConfigUsage = `Usage: sluice check-config FILE|DIR

Validates a configuration (sluice's format or envoyproxy/ratelimit's; a
directory loads every .yaml and .yml file in it), prints every error as
file:line:column, or what the configuration holds.
`

func checkConfig(args []string, stdout, stderr io.Writer) int {
	if len(args) == 1 {
		switch args[0] {
		case "-h", "-help", "--help", "help":
			fmt.Fprint(stdout, checkConfigUsage)
			return 0
		}
	}
	if len(args) != 1 {
		fmt.Fprint(stderr, checkConfigUsage)
		return 2
	}
	cfg, err := config.Load(args[0])
	if err == nil {
		err = requirePolicies(cfg)
	}
	if err != nil {
		printErrors(stderr, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: OK\n", args[0])
	cfg.Describe(stdout)
	return 0
}

// printErrors prints one configuration error per line.
func printErrors(w io.Writer, err error) {
	var joined interface{ Unwrap() []error }
	if errors.As(err, &joined) {
		for _, e := range joined.Unwrap() {
			fmt.Fprintf(w, "sluice: %v\n", e)
		}
		return
	}
	fmt.Fprintf(w, "sluice: %v\n", err)
}

// lookupEnv reads one environment variable: os.LookupEnv, or a map in
// tests.
type lookupEnv func(name string) (string, bool)

func (look lookupEnv) env(name, def string) string {
	if v, ok := look(name); ok {
		return v
	}
	return def
}

// envParse reads a value from the environment with parse; a bad value is
// reported once the flags are parsed (a flag given on the command line
// wins over it).
func envParse[T any](look lookupEnv, name string, def T, parse func(string) (T, error), want string, bad *error) T {
	v, ok := look(name)
	if !ok {
		return def
	}
	x, err := parse(v)
	if err != nil {
		*bad = fmt.Errorf("%s=%q: want %s", name, v, want)
		return def
	}
	return x
}

// source names where a setting came from, for its error: the flag when it
// was given, else its variable (a flag wins over the environment).
func (look lookupEnv) source(fs *flag.FlagSet, flagName, envName string) (msg, name string) {
	if _, ok := look(envName); ok && !flagSet(fs, flagName) {
		return "bad environment", envName
	}
	return "bad flag", "--" + flagName
}

// wholeValue is an int flag in base 10, as its variable is read: flag.Int
// reads 010 as 8 and takes 0x10 and 1_000, which the variable refused.
type wholeValue int

func (v *wholeValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil {
		return errors.New("want a whole number")
	}
	*v = wholeValue(n)
	return nil
}

func (v *wholeValue) String() string { return strconv.Itoa(int(*v)) }

// wholeFlag defines a wholeValue flag.
func wholeFlag(fs *flag.FlagSet, name string, def int, usage string) *int {
	p := new(int)
	*p = def
	fs.Var((*wholeValue)(p), name, usage)
	return p
}

// secretValue is a string flag whose default, often from the environment
// (a token, a Redis URL with its password), -h must not print: show gives
// what it may print of it ("" prints no default).
type secretValue struct {
	p    *string
	show func(string) string
}

func (v secretValue) Set(s string) error { *v.p = s; return nil }

func (v secretValue) Get() any { return *v.p }

func (v secretValue) String() string {
	if v.p == nil || *v.p == "" {
		return ""
	}
	return v.show(*v.p)
}

// secretFlag defines a secretValue flag.
func secretFlag(fs *flag.FlagSet, name, def string, show func(string) string, usage string) *string {
	p := new(string)
	*p = def
	fs.Var(secretValue{p, show}, name, usage)
	return p
}

// hidden shows nothing of a token.
func hidden(string) string { return "" }

// minWatchInterval bounds how often the config files are stat'ed: a
// microsecond interval would spin a core.
const minWatchInterval = 100 * time.Millisecond

// serveSettings are serve's settings, from its flags and the environment.
type serveSettings struct {
	configFile, redisURL, httpAddr, grpcAddr string
	failure                                  resilient.Policy
	withPolicy                               bool // failure is set: not "error"
	timeout, fleetShrink, watch              time.Duration
	fleetSize, maxConns, maxKeys             int
	adminToken, decToken                     string
	insecure                                 bool
	httpTLS, grpcTLS                         TLSFiles
	logFormat, logLevel                      string
}

// settingError is a bad setting: msg is "bad flag", "bad environment" or
// "unexpected argument", and err names the flag or the variable; attr is
// the log attribute for err.
type settingError struct {
	msg, attr string
	err       error
}

func (e *settingError) Error() string { return e.msg + ": " + e.err.Error() }

// parseServe reads serve's settings from args and the environment. Its
// errors: flag.ErrHelp, another of package flag's (which it wrote to out),
// or a *settingError. On a settingError the log format and level are
// those asked for, for the logger that reports it.
func parseServe(args []string, look lookupEnv, out io.Writer) (serveSettings, error) {
	fs := flag.NewFlagSet("sluice serve", flag.ContinueOnError)
	fs.SetOutput(out)
	var envErr, fleetErr, shrinkErr, connErr, keysErr error
	var (
		configFile  = fs.String("config", look.env("SLUICE_CONFIG", ""), "configuration `file` or directory (env SLUICE_CONFIG); default: the built-in demo")
		redisURL    = secretFlag(fs, "redis", look.env("SLUICE_REDIS_URL", ""), redactURL, "Redis `URL` (env SLUICE_REDIS_URL): redis://, rediss://, redis+cluster://, redis+sentinel://; default: the embedded memory store")
		httpAddr    = fs.String("http", look.env("SLUICE_HTTP_ADDR", ""), "JSON API, dashboard and metrics `address` (env SLUICE_HTTP_ADDR); default :8080, 127.0.0.1:8080 for the demo")
		grpcAddr    = fs.String("grpc", look.env("SLUICE_GRPC_ADDR", ""), "Envoy rate limit service `address` (env SLUICE_GRPC_ADDR); default :8081, 127.0.0.1:8081 for the demo")
		failure     = fs.String("failure-policy", look.env("SLUICE_FAILURE_POLICY", "local"), "when Redis fails: local (enforce in this process), open, closed, or error (report it; Envoy decides) (env SLUICE_FAILURE_POLICY)")
		timeout     = fs.Duration("decision-timeout", envParse(look, "SLUICE_DECISION_TIMEOUT", 0, time.ParseDuration, "a duration such as 50ms", &envErr), "longest wait for Redis before the failure policy answers (env SLUICE_DECISION_TIMEOUT); default 50ms. Above 5s it raises the Redis client's dial, read and write timeouts too, except those --redis sets (dial_timeout=, read_timeout=, write_timeout=), which still cut a call short")
		fleetSize   = wholeFlag(fs, "fleet-size", envParse(look, "SLUICE_FLEET_SIZE", 0, strconv.Atoi, "a whole number", &fleetErr), "how many `instances` share Redis: under --failure-policy local each admits 1/N of every limit while Redis is away (env SLUICE_FLEET_SIZE); default: discovered through Redis")
		fleetShrink = fs.Duration("fleet-shrink", envParse(look, "SLUICE_FLEET_SHRINK", 0, time.ParseDuration, "a duration such as 5m", &shrinkErr), "how long the discovered fleet size must count fewer instances before it falls, and how long an instance cut off from Redis keeps its share under --failure-policy local after its last registration (plus 3s); every instance of a fleet must use the same (env SLUICE_FLEET_SHRINK); default 5m")
		adminToken  = secretFlag(fs, "admin-token", look.env("SLUICE_ADMIN_TOKEN", ""), hidden, "bearer `token` for admin endpoints (env SLUICE_ADMIN_TOKEN); default: loopback clients only, and none when --http is reachable from other hosts")
		insecure    = fs.Bool("insecure-admin", false, "without --admin-token, keep admin endpoints open to loopback clients even when --http is reachable from other hosts")
		decToken    = secretFlag(fs, "decision-token", look.env("SLUICE_DECISION_TOKEN", ""), hidden, "bearer `token` decisions require: HTTP Authorization, gRPC authorization metadata (env SLUICE_DECISION_TOKEN); default: none")
		httpCert    = fs.String("http-tls-cert", "", "PEM certificate `file` to serve HTTPS (with --http-tls-key); reloaded when it changes")
		httpKey     = fs.String("http-tls-key", "", "PEM key `file` for --http-tls-cert")
		httpCA      = fs.String("http-tls-client-ca", "", "PEM CA `file`: HTTP clients must present a certificate it signed (mutual TLS)")
		grpcCert    = fs.String("grpc-tls-cert", "", "PEM certificate `file` to serve gRPC over TLS (with --grpc-tls-key); reloaded when it changes")
		grpcKey     = fs.String("grpc-tls-key", "", "PEM key `file` for --grpc-tls-cert")
		grpcCA      = fs.String("grpc-tls-client-ca", "", "PEM CA `file`: gRPC clients (Envoy) must present a certificate it signed (mutual TLS)")
		maxConns    = wholeFlag(fs, "max-connections", envParse(look, "SLUICE_MAX_CONNECTIONS", DefaultMaxConnections, strconv.Atoi, "a whole number", &connErr), "most `connections` each listener (HTTP, gRPC) holds open at once; one more takes the place of the oldest silent one (no request yet, 1s after it was accepted), else of the one stalled longest (no request arrived whole: an HTTP body still coming 1s after its headers, a gRPC call without its message 10ms after), else of the one idle longest (one idle under 100ms only when no probe place is free), else takes one of 8 places kept for health probes (HTTP), else is closed as soon as accepted (env SLUICE_MAX_CONNECTIONS)")
		maxKeys     = wholeFlag(fs, "max-keys", envParse(look, "SLUICE_MAX_KEYS", memory.DefaultMaxKeys, strconv.Atoi, "a whole number", &keysErr), "most `keys` the memory store holds, to bound its memory (without --redis; with it, the local failure policy's store): past it a new key takes the place of one that had taken little of its limit, which starts afresh (env SLUICE_MAX_KEYS)")
		watch       = fs.Duration("watch-interval", 2*time.Second, "how often to check the config file for changes: 0 never, otherwise at least "+minWatchInterval.String())
		logFormat   = fs.String("log-format", look.env("SLUICE_LOG_FORMAT", "text"), "log `format`: text or json (env SLUICE_LOG_FORMAT)")
		logLevel    = fs.String("log-level", look.env("SLUICE_LOG_LEVEL", "info"), "least `level` logged: debug, info, warn or error (env SLUICE_LOG_LEVEL)")
	)
	if err := fs.Parse(args); err != nil {
		return serveSettings{}, err
	}
	st := serveSettings{
		configFile: *configFile, redisURL: *redisURL, httpAddr: *httpAddr, grpcAddr: *grpcAddr,
		timeout: *timeout, fleetShrink: *fleetShrink, watch: *watch,
		fleetSize: *fleetSize, maxConns: *maxConns, maxKeys: *maxKeys,
		adminToken: *adminToken, decToken: *decToken, insecure: *insecure,
		httpTLS:   TLSFiles{CertFile: *httpCert, KeyFile: *httpKey, ClientCAFile: *httpCA},
		grpcTLS:   TLSFiles{CertFile: *grpcCert, KeyFile: *grpcKey, ClientCAFile: *grpcCA},
		logFormat: *logFormat, logLevel: *logLevel,
	}
	bad := func(msg string, format string, args ...any) (serveSettings, error) {
		return st, &settingError{msg, "err", fmt.Errorf(format, args...)}
	}
	if _, err := NewLogger(io.Discard, *logFormat, *logLevel); err != nil {
		flagName, envName := "log-level", "SLUICE_LOG_LEVEL"
		if _, ferr := NewLogger(io.Discard, *logFormat, ""); ferr != nil {
			flagName, envName = "log-format", "SLUICE_LOG_FORMAT"
		}
		msg, name := look.source(fs, flagName, envName)
		return bad(msg, "%s: %v", name, err)
	}
	if msg, err := emptySetting(fs, look); err != nil {
		return st, &settingError{msg, "err", err}
	}
	for _, e := range []struct {
		flag string
		err  error
	}{{"decision-timeout", envErr}, {"fleet-size", fleetErr}, {"fleet-shrink", shrinkErr}, {"max-connections", connErr}, {"max-keys", keysErr}} {
		if e.err != nil && !flagSet(fs, e.flag) { // flags win over the environment
			return st, &settingError{"bad environment", "err", e.err}
		}
	}
	if *timeout < 0 {
		msg, name := look.source(fs, "decision-timeout", "SLUICE_DECISION_TIMEOUT")
		return bad(msg, "%s %v: want a positive duration (0 or unset: 50ms)", name, *timeout)
	}
	if *watch < 0 || (*watch > 0 && *watch < minWatchInterval) {
		return bad("bad flag", "--watch-interval %v: want 0 (never) or at least %v", *watch, minWatchInterval)
	}
	for _, l := range []struct {
		name  string
		files TLSFiles
	}{{"http", st.httpTLS}, {"grpc", st.grpcTLS}} {
		if f := l.files; f.enabled() && (f.CertFile == "" || f.KeyFile == "") {
			var given []string
			for _, g := range []struct{ flag, file string }{{"cert", f.CertFile}, {"key", f.KeyFile}, {"client-ca", f.ClientCAFile}} {
				if g.file != "" {
					given = append(given, "--"+l.name+"-tls-"+g.flag)
				}
			}
			missing := "key"
			if f.CertFile == "" {
				missing = "cert"
			}
			return bad("bad flag", "%s without --%s-tls-%s: TLS needs both --%[2]s-tls-cert and --%[2]s-tls-key (and --%[2]s-tls-client-ca beside them asks clients for certificates)",
				strings.Join(given, " and "), l.name, missing)
		}
	}
	if *fleetShrink < 0 {
		msg, name := look.source(fs, "fleet-shrink", "SLUICE_FLEET_SHRINK")
		return bad(msg, "%s %v: want a positive duration (0 or unset: %v)", name, *fleetShrink, resilient.DefaultFleetShrink)
	}
	if *fleetSize < 0 {
		msg, name := look.source(fs, "fleet-size", "SLUICE_FLEET_SIZE")
		return bad(msg, "%s %d: want 1 or more (0 or unset: discovered through Redis)", name, *fleetSize)
	}
	if *maxConns < 1 {
		msg, name := look.source(fs, "max-connections", "SLUICE_MAX_CONNECTIONS")
		return bad(msg, "%s %d: want 1 or more", name, *maxConns)
	}
	if *maxKeys < 1 {
		msg, name := look.source(fs, "max-keys", "SLUICE_MAX_KEYS")
		return bad(msg, "%s %d: want 1 or more", name, *maxKeys)
	}
	if fs.NArg() > 0 {
		return st, &settingError{"unexpected argument", "arg", errors.New(fs.Arg(0))}
	}
	fp, withPolicy, err := ParseFailurePolicy(*failure)
	if err != nil {
		msg, name := look.source(fs, "failure-policy", "SLUICE_FAILURE_POLICY")
		return bad(msg, "%s: %v", name, err)
	}
	st.failure, st.withPolicy = fp, withPolicy
	if *redisURL != "" {
		// A URL go-redis would take and then fail on is a flag error too.
		if err := checkRedisURL(*redisURL); err != nil {
			msg, name := look.source(fs, "redis", "SLUICE_REDIS_URL")
			return bad(msg, "%s: %v", name, err)
		}
	}
	return st, nil
}

// serve runs the service; its every line is a log record on stderr.
func serve(args []string, stderr io.Writer) int {
	st, err := parseServe(args, os.LookupEnv, stderr)
	var bad *settingError
	if errors.Is(err, flag.ErrHelp) {
		return 0
	} else if err != nil && !errors.As(err, &bad) {
		return 2 // package flag wrote it
	}
	// Every line from here on is a log record, go-redis's and grpc-go's too,
	// a bad setting's in the format asked for when that is good.
	log, lerr := NewLogger(stderr, st.logFormat, st.logLevel)
	if lerr != nil {
		log, lerr = NewLogger(stderr, st.logFormat, "")
	}
	if lerr != nil {
		log = slog.New(slog.NewTextHandler(stderr, nil))
	}
	if bad != nil {
		log.Error(bad.msg, bad.attr, bad.err)
		return 2
	}
	RouteLogs(log)
	watch := st.watch
	if watch == 0 {
		watch = -1
	}
	// Catch signals before anything can be sent one: a SIGHUP that arrived
	// between Start and Notify would kill the process (its default action).
	// Never stopped: the caller exits with serve's code, and a signal after
	// the stop (GNU timeout's second SIGTERM, to the process group) would
	// otherwise kill the process with its own status instead.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	srv, err := New(Options{
		ConfigFile: st.configFile, RedisURL: st.redisURL, HTTPAddr: st.httpAddr, GRPCAddr: st.grpcAddr,
		FailurePolicy: st.failure, NoFailurePolicy: !st.withPolicy, DecisionTimeout: st.timeout, FleetSize: st.fleetSize, FleetShrink: st.fleetShrink, AdminToken: st.adminToken, WatchInterval: watch, Logger: log,
		InsecureAdmin: st.insecure, DecisionToken: st.decToken, MaxConnections: st.maxConns, MaxKeys: st.maxKeys,
		HTTPTLS: st.httpTLS, GRPCTLS: st.grpcTLS,
	})
	if err != nil {
		log.Error("cannot start", "err", err)
		return 1
	}
	if err := srv.Start(); err != nil {
		log.Error("cannot start", "err", err)
		srv.Shutdown(context.Background())
		return 1
	}
	config := "built-in demo"
	if st.configFile != "" {
		config = st.configFile
	}
	bi := ReadBuildInfo()
	log.Info("sluice started", "version", bi.Version, "revision", bi.Revision, "config", config,
		"policies", len(srv.Service().Config().Policies), srv.storeAttr())
	scheme := "http"
	if st.httpTLS.CertFile != "" {
		scheme = "https"
	}
	log.Info("http", "addr", srv.HTTPAddr(), "dashboard", scheme+"://"+browsable(srv.HTTPAddr())+"/")
	log.Info("grpc", "addr", srv.GRPCAddr(), "service", "envoy.service.ratelimit.v3.RateLimitService")

	for sig := range sigs {
		if sig == syscall.SIGHUP {
			srv.Reload() // logs "config reloaded" or the errors, once
			continue
		}
		log.Info("shutting down", "signal", sig.String())
		first, at := sig, time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		done := make(chan error, 1)
		go func() { done <- srv.Shutdown(ctx) }()
		var err error
	wait:
		for {
			select {
			case err = <-done:
				break wait
			case sig := <-sigs:
				if sig == syscall.SIGTERM && sig == first && time.Since(at) < repeatWindow {
					log.Info("signal repeated: the same stop, still graceful; to force it, send another signal, or this one again after the window",
						"signal", sig.String(), "window", repeatWindow)
					continue
				}
				if sig != syscall.SIGHUP { // a second interrupt: wait for nothing, Redis included
					log.Warn("forced stop", "signal", sig.String())
					cancel()
					select {
					case <-done:
					case <-time.After(forcedStopWait): // a Shutdown stuck all the same must not hold the exit
					}
					log.Info("stopped", "forced", true)
					return 1
				}
			}
		}
		cancel()
		if err != nil {
			log.Error("shutdown", "err", err)
			return 1
		}
		log.Info("stopped", "forced", false)
		return 0
	}
	return 0
}

// emptyRefused are the settings that refuse an empty value, as a flag or
// in the environment. Set but empty is a templating mistake (a secret or
// variable that came out empty), not a request for the default, and the
// default may be far less safe: the demo's policies, the memory store
// (limits per instance), no token, every interface.
var emptyRefused = []struct{ flag, env, def string }{
	{"config", "SLUICE_CONFIG", "the built-in demo"},
	{"redis", "SLUICE_REDIS_URL", "the memory store, limits counted per instance"},
	{"http", "SLUICE_HTTP_ADDR", ":8080, every interface"},
	{"grpc", "SLUICE_GRPC_ADDR", ":8081, every interface"},
	{"failure-policy", "SLUICE_FAILURE_POLICY", "local"},
	{"decision-timeout", "SLUICE_DECISION_TIMEOUT", "50ms"},
	{"fleet-size", "SLUICE_FLEET_SIZE", "discovered through Redis"},
	{"fleet-shrink", "SLUICE_FLEET_SHRINK", resilient.DefaultFleetShrink.String()},
	{"admin-token", "SLUICE_ADMIN_TOKEN", "no admin token"},
	{"decision-token", "SLUICE_DECISION_TOKEN", "no decision token: every client is answered"},
	{"max-connections", "SLUICE_MAX_CONNECTIONS", strconv.Itoa(DefaultMaxConnections)},
	{"max-keys", "SLUICE_MAX_KEYS", strconv.Itoa(memory.DefaultMaxKeys)},
	{"log-format", "SLUICE_LOG_FORMAT", "text"},
	{"log-level", "SLUICE_LOG_LEVEL", "info"},
	// No variable: an empty file name from a template would serve plain
	// text where TLS was meant.
	{"http-tls-cert", "", "plain HTTP"},
	{"http-tls-key", "", "plain HTTP"},
	{"grpc-tls-cert", "", "plain gRPC"},
	{"grpc-tls-key", "", "plain gRPC"},
	// An empty client CA would serve TLS without asking for a client
	// certificate: mutual TLS silently off.
	{"http-tls-client-ca", "", "no client certificate asked for"},
	{"grpc-tls-client-ca", "", "no client certificate asked for"},
}

// emptySetting reports the first setting of emptyRefused given an empty
// (or blank) value: the log message and the error, or a nil error. A flag
// on the command line wins over its variable, which is then not read.
func emptySetting(fs *flag.FlagSet, look lookupEnv) (string, error) {
	for _, s := range emptyRefused {
		if flagSet(fs, s.flag) {
			if strings.TrimSpace(flagText(fs, s.flag)) == "" {
				return "bad flag", fmt.Errorf("--%s is empty: give it a value, or leave the flag out for the default (%s)", s.flag, s.def)
			}
			continue
		}
		if v, ok := look(s.env); s.env != "" && ok && strings.TrimSpace(v) == "" {
			return "bad environment", fmt.Errorf("%s is set but empty: give it a value, or unset it for the default (%s)", s.env, s.def)
		}
	}
	return "", nil
}

// flagText is a flag's value as given: through flag.Getter, since a
// secret's String hides it.
func flagText(fs *flag.FlagSet, name string) string {
	v := fs.Lookup(name).Value
	if g, ok := v.(flag.Getter); ok {
		if s, ok := g.Get().(string); ok {
			return s
		}
	}
	return v.String()
}

// forcedStopWait bounds the wait for Shutdown after a second signal, which
// has told it to stop waiting.
const forcedStopWait = 200 * time.Millisecond

// repeatWindow: SIGTERM again within this long of the first is not a
// second signal. GNU timeout, and supervisors like it, send SIGTERM to the
// process and then to its process group, a millisecond apart. Not SIGINT:
// a person pressing Ctrl-C twice means to force the stop.
const repeatWindow = time.Second

// flagSet reports whether the named flag was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

// browsable turns a listener address into one a browser can open.
func browsable(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	return host + ":" + port
}
