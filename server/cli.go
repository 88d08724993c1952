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
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/server/config"
)

const usage = `sluice: distributed rate limiting

Usage:
  sluice serve [flags]          run the service (no flags: demo policies on the memory store)
  sluice check-config FILE      validate a configuration and print what it holds

Run "sluice serve -h" for the serve flags.
`

// Main runs the sluice command line (args without the program name) and
// returns the process exit code.
func Main(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	switch args[0] {
	case "serve":
		return serve(args[1:], stdout, stderr)
	case "check-config":
		return checkConfig(args[1:], stdout, stderr)
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

func env(name, def string) string {
	if v, ok := os.LookupEnv(name); ok {
		return v
	}
	return def
}

// envDuration reads a duration from the environment; a bad value is
// reported once the flags are parsed.
func envDuration(name string, def time.Duration, bad *error) time.Duration {
	v, ok := os.LookupEnv(name)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		*bad = fmt.Errorf("%s: %w", name, err)
		return def
	}
	return d
}

func serve(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sluice serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var envErr error
	var (
		configFile = fs.String("config", env("SLUICE_CONFIG", ""), "configuration `file` or directory (env SLUICE_CONFIG); default: the built-in demo")
		redisURL   = fs.String("redis", env("SLUICE_REDIS_URL", ""), "Redis `URL` (env SLUICE_REDIS_URL): redis://, rediss://, redis+cluster://, redis+sentinel://; default: the embedded memory store")
		httpAddr   = fs.String("http", env("SLUICE_HTTP_ADDR", ":8080"), "JSON API, dashboard and metrics `address` (env SLUICE_HTTP_ADDR)")
		grpcAddr   = fs.String("grpc", env("SLUICE_GRPC_ADDR", ":8081"), "Envoy rate limit service `address` (env SLUICE_GRPC_ADDR)")
		failure    = fs.String("failure-policy", env("SLUICE_FAILURE_POLICY", "local"), "when Redis fails: local (enforce in this process), open, closed, or error (report it; Envoy decides) (env SLUICE_FAILURE_POLICY)")
		timeout    = fs.Duration("decision-timeout", envDuration("SLUICE_DECISION_TIMEOUT", 0, &envErr), "longest wait for Redis before the failure policy answers (env SLUICE_DECISION_TIMEOUT); default 50ms")
		adminToken = fs.String("admin-token", env("SLUICE_ADMIN_TOKEN", ""), "bearer `token` for admin endpoints (env SLUICE_ADMIN_TOKEN); default: loopback clients only")
		watch      = fs.Duration("watch-interval", 2*time.Second, "how often to check the config file for changes (0: never)")
	)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if envErr != nil && !flagSet(fs, "decision-timeout") { // flags win over the environment
		fmt.Fprintln(stderr, "sluice serve:", envErr)
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sluice serve: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	fp, withPolicy, err := ParseFailurePolicy(*failure)
	if err != nil {
		fmt.Fprintln(stderr, "sluice serve:", err)
		return 2
	}
	if *watch == 0 {
		*watch = -1
	}
	log := slog.New(slog.NewTextHandler(stderr, nil))
	// Catch signals before anything can be sent one: a SIGHUP that arrived
	// between Start and Notify would kill the process (its default action).
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	srv, err := New(Options{
		ConfigFile: *configFile, RedisURL: *redisURL, HTTPAddr: *httpAddr, GRPCAddr: *grpcAddr,
		FailurePolicy: fp, NoFailurePolicy: !withPolicy, DecisionTimeout: *timeout, AdminToken: *adminToken, WatchInterval: *watch, Logger: log,
	})
	if err != nil {
		printErrors(stderr, err)
		return 1
	}
	if err := srv.Start(); err != nil {
		fmt.Fprintln(stderr, "sluice serve:", err)
		srv.Shutdown(context.Background())
		return 1
	}
	store := "memory"
	if *redisURL != "" {
		store = "redis"
	}
	config := "built-in demo"
	if *configFile != "" {
		config = *configFile
	}
	fmt.Fprintf(stdout, "sluice serve: config %s, store %s, %d policies\n", config, store, len(srv.Service().Config().Policies))
	fmt.Fprintf(stdout, "sluice serve: http %s (dashboard http://%s/)\n", srv.HTTPAddr(), browsable(srv.HTTPAddr()))
	fmt.Fprintf(stdout, "sluice serve: grpc %s (envoy.service.ratelimit.v3.RateLimitService)\n", srv.GRPCAddr())

	for sig := range sigs {
		if sig == syscall.SIGHUP {
			// Errors go to stderr a line each, with file and line; stdout
			// gets one line a script can wait for.
			switch err := srv.Reload(); {
			case err != nil:
				fmt.Fprintln(stderr, "sluice serve: config reload rejected; keeping the configuration in force:")
				printErrors(stderr, err)
			case *configFile != "":
				fmt.Fprintln(stdout, "sluice serve: config reloaded")
			}
			continue
		}
		log.Info("shutting down", "signal", sig.String())
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
				if sig != syscall.SIGHUP { // a second interrupt: stop waiting for requests to finish
					log.Warn("forced stop", "signal", sig.String())
					cancel()
					err = <-done
					break wait
				}
			}
		}
		cancel()
		if err != nil {
			fmt.Fprintln(stderr, "sluice serve: shutdown:", err)
			return 1
		}
		fmt.Fprintln(stdout, "sluice serve: stopped")
		return 0
	}
	return 0
}

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
