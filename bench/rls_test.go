package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/redistest"
)

// ratelimitVersion is the envoyproxy/ratelimit service compared with.
const ratelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"

// rlsConfig is one fixed-window limit per user, in envoyproxy/ratelimit's
// format, which both services load unchanged. The rate is high enough that
// the benchmark measures decisions, not denials.
const rlsConfig = `domain: bench
descriptors:
  - key: user
    rate_limit:
      unit: second
      requests_per_unit: 1000
`

// redisPool is both services' Redis connection pool size.
const redisPool = 20

// BenchmarkRLS compares Envoy rate limit service decisions per second:
// envoyproxy/ratelimit's service and sluice serve, each its own process on
// the same Redis, with the same fixed-window config and the same gRPC
// client (Goroutines goroutines, one descriptor per request over NumKeys
// users). For sluice it also reports x-envoy: its ops/s divided by
// envoyproxy/ratelimit's in this run.
//
// sluice runs with --failure-policy error, which behaves as
// envoyproxy/ratelimit does when Redis fails (the error goes to Envoy). Its
// default local fallback would answer from memory whenever a saturated
// Redis call passes the decision timeout, and so measure something else.
func BenchmarkRLS(b *testing.B) {
	// A private server: its CPU per call (redis-cpu-us/op) then counts only
	// this benchmark's calls.
	srv := redistest.StartServer(b)
	addr := srv.Addr
	client := redis.NewClient(&redis.Options{Addr: addr})
	defer client.Close()
	dir := b.TempDir()
	keys, err := Keys(NumKeys)
	if err != nil {
		b.Fatal(err)
	}
	servers := []struct {
		name  string
		start func(b *testing.B) (string, *os.Process) // the gRPC address
	}{
		{"envoyproxy-ratelimit", func(b *testing.B) (string, *os.Process) { return startEnvoyRatelimit(b, dir, addr) }},
		// Like envoyproxy/ratelimit, report a Redis failure to Envoy.
		{"sluice", func(b *testing.B) (string, *os.Process) { return startSluice(b, dir, addr, "error") }},
	}
	type target struct {
		name string
		take TakeFunc
		pid  int
	}
	var targets []target
	for _, s := range servers {
		grpcAddr, proc := s.start(b)
		conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		rls := rlsv3.NewRateLimitServiceClient(conn)
		take := func(ctx context.Context, key string) (bool, error) {
			resp, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
				Domain: "bench",
				Descriptors: []*rlcommon.RateLimitDescriptor{{
					Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: key}},
				}},
			})
			if err != nil {
				return false, err
			}
			return resp.OverallCode == rlsv3.RateLimitResponse_OK, nil
		}
		if err := waitRLS(take); err != nil {
			b.Fatalf("%s: %v", s.name, err)
		}
		targets = append(targets, target{s.name, take, proc.Pid})
	}
	// Rounds alternate the two services, so that load from elsewhere on the
	// machine falls on both alike; the summary is the median ratio.
	var ratios []float64
	for round := range rlsRounds {
		var envoyOps float64
		for _, t := range targets {
			var ops float64 // of the last (full) run: b.Run may probe with b.N = 1 first
			b.Run(fmt.Sprintf("round=%d/%s", round, t.name), func(b *testing.B) {
				cpu0, cpuOK := processCPU(t.pid)
				ops = runParallel(b, client, t.take, keys)
				if cpu1, ok := processCPU(t.pid); ok && cpuOK {
					b.ReportMetric(float64((cpu1-cpu0).Microseconds())/float64(b.N), "server-cpu-us/op")
				}
				if !strings.HasPrefix(t.name, "envoyproxy") && envoyOps > 0 {
					b.ReportMetric(ops/envoyOps, "x-envoy")
				}
			})
			if strings.HasPrefix(t.name, "envoyproxy") {
				envoyOps = ops
			} else if envoyOps > 0 {
				ratios = append(ratios, ops/envoyOps)
			}
		}
	}
	if len(ratios) > 0 {
		slices.Sort(ratios)
		b.Logf("sluice / envoyproxy-ratelimit decisions per second, per round: %.2f; median %.2f", ratios, ratios[len(ratios)/2])
	}
}

// rlsRounds is how many times BenchmarkRLS alternates the two services.
const rlsRounds = 5

// waitRLS retries until the service answers (it may still be starting).
func waitRLS(take TakeFunc) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err := take(ctx, "warmup")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func freePort(b *testing.B) string {
	return fmt.Sprint(redistest.FreePort(b))
}

// run starts cmd and stops it when the benchmark ends.
func run(b *testing.B, cmd *exec.Cmd) {
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
}

// startEnvoyRatelimit builds envoyproxy/ratelimit's service from the Go
// module proxy (cached per machine) and runs it on redisAddr.
func startEnvoyRatelimit(b *testing.B, dir, redisAddr string) (string, *os.Process) {
	bin := goInstall(b, "github.com/envoyproxy/ratelimit/src/service_cmd@"+ratelimitVersion)
	cfgDir := filepath.Join(dir, "runtime", "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cfgDir, "bench.yaml"), []byte(rlsConfig), 0o644); err != nil {
		b.Fatal(err)
	}
	grpcPort := freePort(b)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(),
		"HOST=127.0.0.1", "PORT="+freePort(b),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT="+grpcPort,
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT="+freePort(b),
		"USE_STATSD=false", "LOG_LEVEL=error",
		"RUNTIME_ROOT="+filepath.Join(dir, "runtime"), "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_WATCH_ROOT=false",
		"REDIS_SOCKET_TYPE=tcp", "REDIS_URL="+redisAddr, fmt.Sprintf("REDIS_POOL_SIZE=%d", redisPool),
		fmt.Sprintf("CACHE_KEY_PREFIX=bench:%d:", os.Getpid()),
	)
	// Its stats sink logs every flush: keep its output out of the results.
	logf, err := os.Create(filepath.Join(dir, "ratelimit.log"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { logf.Close() })
	cmd.Stdout, cmd.Stderr = logf, logf
	run(b, cmd)
	return "127.0.0.1:" + grpcPort, cmd.Process
}

// startSluice builds ../cmd/sluice (once per run) and runs `sluice serve`
// on redisAddr with the given failure policy.
func startSluice(b *testing.B, dir, redisAddr, failurePolicy string) (string, *os.Process) {
	bin := filepath.Join(dir, "sluice")
	if _, err := os.Stat(bin); err != nil {
		build := exec.Command("go", "build", "-o", bin, "./cmd/sluice")
		build.Dir = ".."
		if out, err := build.CombinedOutput(); err != nil {
			b.Fatalf("building sluice: %v\n%s", err, out)
		}
	}
	cfg := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(cfg, []byte(rlsConfig), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "serve", "--config", cfg,
		"--redis", fmt.Sprintf("redis://%s/0?pool_size=%d", redisAddr, redisPool),
		"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0", "--failure-policy", failurePolicy,
		"--log-format", "json")
	out, err := cmd.StderrPipe()
	if err != nil {
		b.Fatal(err)
	}
	run(b, cmd)
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		var rec struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &rec) == nil && rec.Msg == "grpc" {
			go func() {
				for sc.Scan() {
					os.Stderr.Write(append(sc.Bytes(), '\n'))
				}
			}()
			return rec.Addr, cmd.Process
		}
		os.Stderr.Write(append(sc.Bytes(), '\n'))
	}
	b.Fatal("sluice serve printed no gRPC address")
	return "", nil
}

// goInstall builds a command from the Go module proxy into a per-machine
// cache and returns its path. Without the proxy the benchmark is skipped,
// saying why.
func goInstall(b *testing.B, pkgAtVersion string) string {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	pkg, version, _ := strings.Cut(pkgAtVersion, "@")
	gobin := filepath.Join(cache, "sluice-bench", version)
	bin := filepath.Join(gobin, filepath.Base(pkg))
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", pkgAtVersion)
	cmd.Dir = b.TempDir() // outside any module
	cmd.Env = append(os.Environ(), "GOBIN="+gobin, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Skipf("cannot build %s: %v\n%s", pkgAtVersion, err, out)
	}
	return bin
}

// processCPU returns the user and system CPU time a process has used, from
// /proc (Linux); ok is false elsewhere.
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// Fields after the command name, which is in parentheses and may hold
	// spaces: utime and stime are the 12th and 13th of them.
	rest := string(b[strings.LastIndexByte(string(b), ')')+2:])
	f := strings.Fields(rest)
	if len(f) < 13 {
		return 0, false
	}
	var ut, st int64
	if _, err := fmt.Sscan(f[11], &ut); err != nil {
		return 0, false
	}
	if _, err := fmt.Sscan(f[12], &st); err != nil {
		return 0, false
	}
	const ticks = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / ticks, true
}
