package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/redisstore"
)

// TestServerRefusesMisconfiguredRedis: each permanent misconfiguration
// stops the start with one sentence naming its cause.
func TestServerRefusesMisconfiguredRedis(t *testing.T) {
	t.Parallel()
	auth := redistest.StartServerOptions(t, &redistest.ServerOptions{Args: []string{"--requirepass", "secret"}})
	plain := redistest.StartServer(t)
	certs := testcert.New(t, "redis")
	tlsSrv := redistest.StartServerOptions(t, &redistest.ServerOptions{TLS: true, Args: []string{
		"--tls-cert-file", certs.CertFile, "--tls-key-file", certs.KeyFile, "--tls-ca-cert-file", certs.CAFile, "--tls-auth-clients", "no",
	}})
	sentinel := redistest.StartServerOptions(t, &redistest.ServerOptions{Sentinel: true, Args: []string{
		"sentinel monitor known " + strings.Replace(plain.Addr, ":", " ", 1) + " 1",
	}})
	node := redistest.StartServerOptions(t, &redistest.ServerOptions{Cluster: true})
	admin := plain.Client(t)
	if err := admin.Do(context.Background(), "acl", "setuser", "noscript", "on", ">pw", "~*", "+ping", "+info").Err(); err != nil {
		t.Fatal(err)
	}
	// Scripts allowed, but not the commands inside them.
	if err := admin.Do(context.Background(), "acl", "setuser", "evalonly", "on", ">pw", "~sluice:*", "+ping", "+info", "+evalsha", "+eval", "+script|load").Err(); err != nil {
		t.Fatal(err)
	}
	// Scripts and the clock, but not sluice's keys.
	if err := admin.Do(context.Background(), "acl", "setuser", "otherkeys", "on", ">pw", "~other:*", "-@all", "+@connection", "+info", "+evalsha", "+eval", "+script|load", "+time", "+@read", "+@write").Err(); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, url string
		kind      error
		says      string
	}{
		{"WRONGPASS", "redis://:wrong@" + auth.Addr, redisstore.ErrAuth, "password"},
		{"NOAUTH", "redis://" + auth.Addr, redisstore.ErrAuth, "password"},
		{"database out of range", "redis://" + plain.Addr + "/99", redisstore.ErrDatabase, "database"},
		{"TLS against plaintext", "rediss://" + plain.Addr, redisstore.ErrTLS, "TLS"},
		{"TLS handshake (unknown CA)", "rediss://" + tlsSrv.Addr, redisstore.ErrTLS, "certificate"},
		{"plaintext against TLS", "redis://" + tlsSrv.Addr, redisstore.ErrTLS, "rediss://"},
		{"unknown Sentinel master", "redis+sentinel://" + sentinel.Addr + "?master_name=typo", redisstore.ErrSentinelMaster, "master_name"},
		{"NOPERM", "redis://noscript:pw@" + plain.Addr, redisstore.ErrPermission, "grant"},
		{"NOPERM inside scripts", "redis://evalonly:pw@" + plain.Addr, redisstore.ErrPermission, "+time"},
		{"NOPERM on sluice's keys", "redis://otherkeys:pw@" + plain.Addr, redisstore.ErrPermission, "~sluice:*"},
		{"redis:// at a Cluster node", "redis://" + node.Addr, redisstore.ErrTopology, "redis+cluster://"},
		{"redis+cluster:// at a standalone server", "redis+cluster://" + plain.Addr, redisstore.ErrTopology, "redis://"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv, err := New(Options{ConfigFile: "testdata/envoy-example.yaml", RedisURL: tt.url, Logger: slog.New(slog.DiscardHandler)})
			if err == nil {
				srv.Shutdown(context.Background())
				t.Fatal("started")
			}
			if !errors.Is(err, tt.kind) || !errors.Is(err, redisstore.ErrMisconfigured) {
				t.Fatalf("err %v, want %v", err, tt.kind)
			}
			if msg := err.Error(); strings.Contains(msg, "\n") || !strings.Contains(msg, tt.says) || strings.Contains(msg, "secret") {
				t.Errorf("message %q: want one line naming %q, no password", msg, tt.says)
			}
		})
	}
}

// documentedACL is the README's ACL user (Deploy it), but for its name and
// password; TestDocumentedACLAgrees keeps the two and the start-up hint
// in step.
const documentedACL = "on >pw resetkeys ~sluice:* ~{sluice:fleet}:* resetchannels &{sluice:fleet}:slots -@all +@connection +info +evalsha +eval +script|load +time +@read +@write +publish +subscribe +cluster|slots"

// TestDocumentedACLAgrees: the permission error's hint, the README's ACL
// line and the ACL the tests run with grant the same commands, keys and
// channels.
func TestDocumentedACLAgrees(t *testing.T) {
	readme, err := os.ReadFile("../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, line, ok := strings.Cut(string(readme), "ACL SETUSER sluice ")
	if !ok {
		t.Fatal("README has no ACL SETUSER line")
	}
	line, _, _ = strings.Cut(line, "\n")
	grants := func(s string) []string {
		var out []string
		for f := range strings.FieldsSeq(strings.NewReplacer("(", " ", ")", " ", ",", " ").Replace(s)) {
			if strings.ContainsAny(f[:1], "+~&") {
				out = append(out, f)
			}
		}
		slices.Sort(out)
		return out
	}
	hint := redisstore.Classify(errors.New("NOPERM this user has no permissions to run the 'evalsha' command")).Error()
	if got, want := grants(hint), grants(line); !slices.Equal(got, want) {
		t.Errorf("the permission hint grants\n%v\nthe README's ACL line\n%v", got, want)
	}
	if got, want := grants(documentedACL), grants(line); !slices.Equal(got, want) {
		t.Errorf("the tests' ACL grants\n%v\nthe README's ACL line\n%v", got, want)
	}
}

// TestServerRunsWithDocumentedACL: sluice serve, connected as the ACL user
// the README gives (Deploy it), decides from Redis, holds and releases
// slots, publishes fleet figures and slot notes: on a server of its own,
// through Sentinel and on the Cluster. Redis does not replicate ACL
// users, so the user is made on every node.
func TestServerRunsWithDocumentedACL(t *testing.T) {
	t.Parallel()
	acl := documentedACL
	user := fmt.Sprintf("sluiceacl%d", time.Now().UnixNano())
	setUser := func(t *testing.T, node redis.UniversalClient) {
		t.Helper()
		args := []any{"acl", "setuser", user}
		for _, f := range strings.Fields(acl) {
			args = append(args, f)
		}
		if err := node.Do(context.Background(), args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	delUser := func(node redis.UniversalClient) { node.Do(context.Background(), "acl", "deluser", user) }
	for _, tt := range []struct {
		name string
		url  func(t *testing.T) string // makes the user, returns the URL
	}{
		{"standalone", func(t *testing.T) string {
			r := redistest.StartServer(t)
			setUser(t, r.Client(t))
			return "redis://" + user + ":pw@" + r.Addr + "/0"
		}},
		{"sentinel", func(t *testing.T) string {
			c := redistest.Client(t) // the master the shared Sentinel watches
			setUser(t, c)
			t.Cleanup(func() { delUser(c) })
			return "redis+sentinel://" + user + ":pw@" + redistest.SentinelAddr(t) + "?master_name=" + redistest.SentinelMaster
		}},
		{"cluster", func(t *testing.T) string {
			c := redistest.ClusterClient(t)
			ctx := context.Background()
			if err := c.ForEachShard(ctx, func(ctx context.Context, node *redis.Client) error { setUser(t, node); return nil }); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				c.ForEachShard(ctx, func(_ context.Context, node *redis.Client) error { delUser(node); return nil })
			})
			addrs := redistest.ClusterAddrs(t)
			u := "redis+cluster://" + user + ":pw@" + addrs[0]
			if len(addrs) > 1 {
				u += "?addr=" + strings.Join(addrs[1:], "&addr=")
			}
			return u
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := writeConfig(t, slotsConfig)
			srv := runServer(t, Options{ConfigFile: cfg, RedisURL: tt.url(t), Logger: slog.New(slog.DiscardHandler)})
			ctx := context.Background()
			key := fmt.Sprint("ann-", time.Now().UnixNano()) // the servers may be shared
			for range 3 {
				res, err := srv.Service().Check(ctx, "api", key, 1)
				if err != nil || !res.Decision.Allowed || res.Decision.Source != sluice.SourceBackend {
					t.Fatalf("check: %+v, %v; want allowed by Redis itself", res.Decision, err)
				}
			}
			slot, err := srv.Service().Acquire(ctx, "exports", key, 1, sluice.PriorityCritical)
			if err != nil || !slot.Decision.Allowed {
				t.Fatalf("acquire: %+v, %v", slot.Decision, err)
			}
			if err := srv.Service().Release(ctx, slot.Token); err != nil {
				t.Fatalf("release: %v", err)
			}
			if err := srv.Service().Release(ctx, slot.Token); err != nil {
				t.Fatalf("second release: %v; want nil (released before)", err)
			}
			f := NewFleet(srv.redis, srv.Service(), &FleetOptions{Logger: slog.New(slog.DiscardHandler)})
			if err := f.Publish(ctx); err != nil {
				t.Fatalf("fleet figures: %v", err)
			}
			if err := srv.redis.Publish(ctx, f.noteChannel(), "r 0").Err(); err != nil {
				t.Fatalf("slot notes: %v", err)
			}
			ps := srv.redis.Subscribe(ctx, f.noteChannel())
			defer ps.Close()
			if _, err := ps.Receive(ctx); err != nil {
				t.Fatalf("slot notes' channel: %v", err)
			}
			if st := srv.health.Status(); st.FallbackActive || st.Degraded {
				t.Fatalf("status %+v: want healthy", st)
			}
		})
	}
}

// TestStatusNamesWhyTheBreakerOpened: a user whose writes are revoked
// after the start: every decision fails, the breaker opens, and the status
// says why, though the store's probe (a ping) still answers.
func TestStatusNamesWhyTheBreakerOpened(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	admin := r.Client(t)
	sluiceUser(t, admin, "nowrite")
	cfg := writeConfig(t, slotsConfig)
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://nowrite:pw@" + r.Addr + "/0", Logger: slog.New(slog.DiscardHandler)})
	ctx := context.Background()
	if err := admin.Do(ctx, "acl", "setuser", "nowrite", "-@write").Err(); err != nil {
		t.Fatal(err)
	}
	var st Status
	for range 100 {
		if _, err := srv.Service().Check(ctx, "api", "ann", 1); err != nil { // answered by the failure policy
			t.Fatal(err)
		}
		if st = srv.health.Status(); st.FallbackActive {
			break
		}
	}
	if !st.FallbackActive || len(st.Reasons) != 1 || !strings.Contains(st.Reasons[0], "permission") || !strings.Contains(st.Reasons[0], "can't run this command") {
		t.Fatalf("status %+v: want the breaker open, its reason naming the refused command", st)
	}
}

// TestServeRefusesWrongPassword: the command exits 1 with the cause.
func TestServeRefusesWrongPassword(t *testing.T) {
	t.Parallel()
	auth := redistest.StartServerOptions(t, &redistest.ServerOptions{Args: []string{"--requirepass", "secret"}})
	cmd := sluiceCmd(nil, "serve", "--redis", "redis://:wrong@"+auth.Addr, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	err := cmd.Run()
	if code := cmd.ProcessState.ExitCode(); code != 1 {
		t.Fatalf("exit %d (%v), want 1; stderr:\n%s", code, err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	last := lines[len(lines)-1]
	if !strings.Contains(last, "cannot start") || !strings.Contains(last, "redisstore: Redis authentication failed") || strings.Contains(stderr.String(), "wrong@") {
		t.Errorf("stderr %q: want the cause in one line, without the password", stderr.String())
	}
}

// TestServeRefusesSentinelMixUp: a Sentinel named where a data node
// belongs, or a data node where a Sentinel does, stops the start with one
// line naming the URL scheme that fits, rather than serving under the
// failure policy and retrying forever.
func TestServeRefusesSentinelMixUp(t *testing.T) {
	t.Parallel()
	node := redistest.StartServer(t)
	sentinel := redistest.StartServerOptions(t, &redistest.ServerOptions{Sentinel: true, Args: []string{
		"sentinel monitor m " + strings.Replace(node.Addr, ":", " ", 1) + " 1",
	}})
	for _, tc := range []struct{ url, want string }{
		{"redis+sentinel://" + node.Addr + "?master_name=m", "not a Sentinel: use redis://"},
		{"redis://" + sentinel.Addr, "is a Sentinel: use redis+sentinel://"},
		{"redis+cluster://" + sentinel.Addr, "is a Sentinel: use redis+sentinel://"},
		// A data node's credentials, which the Sentinel refuses: not an
		// authentication failure.
		{"redis://sluice:pw@" + sentinel.Addr, "is a Sentinel: use redis+sentinel://"},
		{"redis://:pw@" + sentinel.Addr, "is a Sentinel: use redis+sentinel://"},
		{"redis+cluster://sluice:pw@" + sentinel.Addr, "is a Sentinel: use redis+sentinel://"},
	} {
		t.Run(strings.SplitN(tc.url, "@", 2)[0], func(t *testing.T) {
			t.Parallel()
			cmd := sluiceCmd(nil, "serve", "--redis", tc.url, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
			var stderr syncBuffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// One that serves instead runs until killed.
			killer := time.AfterFunc(10*time.Second, func() { cmd.Process.Kill() })
			err := cmd.Wait()
			killer.Stop()
			if code := cmd.ProcessState.ExitCode(); code != 1 {
				t.Fatalf("exit %d (%v), want 1; stderr:\n%s", code, err, stderr.String())
			}
			lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
			last := lines[len(lines)-1]
			if !strings.Contains(last, "cannot start") || !strings.Contains(last, "redisstore: wrong Redis topology") || !strings.Contains(last, tc.want) {
				t.Errorf("last line %q: want the start refused, naming %q", last, tc.want)
			}
			if strings.Contains(stderr.String(), "Redis unreachable at start") {
				t.Errorf("stderr %q: a topology mistake taken for an outage", stderr.String())
			}
		})
	}
}

// logged waits until the log has a line with every word, and returns it.
func logged(t *testing.T, logs *syncBuffer, words ...string) string {
	t.Helper()
	var found string
	if !eventually(func() bool {
		for line := range strings.Lines(logs.String()) {
			all := true
			for _, w := range words {
				all = all && strings.Contains(line, w)
			}
			if all {
				found = line
				return true
			}
		}
		return false
	}) {
		t.Fatalf("no log line with %q in:\n%s", words, logs.String())
	}
	return found
}

func countLines(logs *syncBuffer, word string) int {
	return strings.Count(logs.String(), word)
}

// metricValue returns one exposition line's value, or "" if absent.
func scrapedMetric(t *testing.T, p *proc, series string) string {
	t.Helper()
	_, body := p.get(t, "/metrics")
	for line := range strings.Lines(body) {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			return strings.TrimSpace(rest)
		}
	}
	return ""
}

// runServer is startServer, shut down at cleanup.
func runServer(t *testing.T, opts Options) *Server {
	t.Helper()
	srv := startServer(t, opts)
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	return srv
}

func startOnRedis(t *testing.T, url, policy string, logs *syncBuffer) (*Server, *proc) {
	t.Helper()
	fp, ok, err := ParseFailurePolicy(policy)
	if err != nil {
		t.Fatal(err)
	}
	srv := runServer(t, Options{
		ConfigFile: "testdata/envoy-example.yaml", RedisURL: url,
		FailurePolicy: fp, NoFailurePolicy: !ok, StoreCheckInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
	})
	return srv, &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}
}

// sendCheck posts a check of key "k" under policy to p and drops the
// answer: load whose answers the test reads elsewhere (metrics, logs).
func sendCheck(p *proc, policy string) {
	resp, err := http.Post("http://"+p.http+"/v1/check", "application/json", strings.NewReader(`{"policy":"`+policy+`","key":"k"}`))
	if err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// keepCalling runs workers goroutines, each calling f with its number and
// then sleeping pause, until the returned stop, which waits for the calls
// in flight.
func keepCalling(workers int, pause time.Duration, f func(worker int)) (stop func()) {
	done := make(chan struct{})
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				f(i)
				time.Sleep(pause)
			}
		})
	}
	return func() { close(done); wg.Wait() }
}

func grpcHealth(t *testing.T, addr, service string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: service})
	if err != nil {
		t.Fatal(err)
	}
	return resp.Status
}

// TestServerRedisUnreachableAtStart: a warning, decisions under the
// failure policy, and the service notices when Redis comes. The fleet
// cannot count an instance that never registered, so the local policy
// refuses (other instances' shares leave nothing for it) until it does.
func TestServerRedisUnreachableAtStart(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	r.Stop()
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "local", &logs)
	logged(t, &logs, "level=WARN", "Redis unreachable at start", "failure_policy=local")
	logged(t, &logs, "store lost", "cause=unreachable", "ready=true") // local answers
	if code, body := p.get(t, "/readyz"); code != 200 || !strings.Contains(body, "degraded") {
		t.Errorf("readyz under local with Redis down: %d %q, want 200 naming the degradation", code, body)
	}
	if _, st := p.getJSON(t, "/v1/status"); st["ready"] != true || st["degraded"] != true || st["store"].(map[string]any)["cause"] != "unreachable" {
		t.Errorf("status %v", st)
	}
	if got := scrapedMetric(t, p, "sluice_degraded"); got != "1" {
		t.Errorf("sluice_degraded %q, want 1", got)
	}
	if got := grpcHealth(t, p.grpc, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health %v under local with Redis down, want SERVING", got)
	}
	if code, _ := p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=a"}`); code != 429 {
		t.Errorf("check under local with Redis down, not counted by the fleet: %d, want 429", code)
	}
	if _, st := p.getJSON(t, "/v1/status"); !strings.Contains(fmt.Sprint(st["reasons"]), "never registered in the fleet") {
		t.Errorf("status %v: want a reason naming the fleet", st)
	}
	if got := scrapedMetric(t, p, "sluice_fleet_counted"); got != "0" {
		t.Errorf("sluice_fleet_counted %q, want 0", got)
	}
	r.Start(t)
	logged(t, &logs, "level=INFO", "store back", "store=redis")
	// Its own heartbeat, every second. Never counted before: not "again".
	logged(t, &logs, "resilient: fleet counts this process; FallbackLocal takes its share")
	if strings.Contains(logs.String(), "counts this process again") {
		t.Errorf("a process never counted before logged that the fleet counts it again:\n%s", logs.String())
	}
	if _, st := p.getJSON(t, "/v1/status"); st["degraded"] != false {
		t.Errorf("status after Redis came: %v", st)
	}
	if got := scrapedMetric(t, p, `sluice_store_transitions_total{cause="",to="up"}`); got != "1" {
		t.Errorf("transitions to up %q, want 1", got)
	}
	if got := scrapedMetric(t, p, "sluice_fleet_counted"); got != "1" {
		t.Errorf("sluice_fleet_counted %q once registered, want 1", got)
	}
}

// TestServerRedisPasswordRotated: an authentication failure after start
// is logged once per transition and counted; the process keeps serving.
func TestServerRedisPasswordRotated(t *testing.T) {
	t.Parallel()
	r := redistest.StartServerOptions(t, &redistest.ServerOptions{Args: []string{"--requirepass", "old"}})
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://:old@"+r.Addr, "local", &logs)
	admin := redis.NewClient(&redis.Options{Addr: r.Addr, Password: "old"})
	defer admin.Close()
	ctx := context.Background()
	// Rotate; existing connections stay authenticated until they are
	// dropped, as after a Redis restart.
	if err := admin.ConfigSet(ctx, "requirepass", "new").Err(); err != nil {
		t.Fatal(err)
	}
	admin.Do(ctx, "client", "kill", "type", "normal")
	line := logged(t, &logs, "level=ERROR", "store lost", "cause=auth")
	if !strings.Contains(line, "WRONGPASS") {
		t.Errorf("log line %q: want Redis's own words", line)
	}
	time.Sleep(300 * time.Millisecond) // several more failed checks
	if n := countLines(&logs, "store lost"); n != 1 {
		t.Errorf("%d 'store lost' lines, want 1 per transition:\n%s", n, logs.String())
	}
	if got := scrapedMetric(t, p, `sluice_store_transitions_total{cause="auth",to="down"}`); got != "1" {
		t.Errorf("transitions to down (auth) %q, want 1", got)
	}
	if code, _ := p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=a"}`); code != 200 {
		t.Errorf("check after the rotation (local fallback): %d", code)
	}
	// Back to the old password: back up, one line.
	restore := redis.NewClient(&redis.Options{Addr: r.Addr, Password: "new"})
	defer restore.Close()
	if err := restore.ConfigSet(ctx, "requirepass", "old").Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, &logs, "store back")
	if n := countLines(&logs, "store back"); n != 1 {
		t.Errorf("%d 'store back' lines, want 1", n)
	}
}

// TestServerHealthUnderErrorPolicy: without a failure policy, losing
// Redis makes the instance not ready, on HTTP and gRPC.
func TestServerHealthUnderErrorPolicy(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "error", &logs)
	if got := grpcHealth(t, p.grpc, rlsServiceName); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health with Redis up: %v", got)
	}
	r.Stop()
	logged(t, &logs, "store lost", "cause=unreachable", "ready=false")
	if code, body := p.get(t, "/readyz"); code != 503 || !strings.Contains(body, "no failure policy") {
		t.Errorf("readyz: %d %s", code, body)
	}
	if got := grpcHealth(t, p.grpc, ""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health with Redis down under error: %v, want NOT_SERVING", got)
	}
	if code, _ := p.get(t, "/healthz"); code != 200 {
		t.Errorf("healthz (liveness) %d", code)
	}
	r.Start(t)
	logged(t, &logs, "store back")
	if got := grpcHealth(t, p.grpc, ""); got != healthpb.HealthCheckResponse_SERVING {
		t.Errorf("gRPC health after Redis came back: %v", got)
	}
}

// TestServerRecoveryOnceUnderReadyz: under the error policy every /readyz
// and /v1/status request checks the store beside the watch. A check that
// started before Redis came back but ended after (its dial retried through
// the restart) must not undo the recovery: each outage is one "store
// lost", one "store back" and one count each way.
func TestServerRecoveryOnceUnderReadyz(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "error", &logs)
	stop := keepCalling(6, 10*time.Millisecond, func(i int) {
		if resp, err := http.Get("http://" + p.http + []string{"/readyz", "/v1/status"}[i%2]); err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
	})
	const outages = 3
	for i := 1; i <= outages; i++ {
		r.Stop()
		logged(t, &logs, "store lost")
		time.Sleep(time.Second) // long enough for go-redis to stop dialing for a while
		r.Start(t)
		for n := 0; countLines(&logs, "store back") < i; n++ {
			if n > 200 {
				t.Fatalf("outage %d: Redis back, no store back in:\n%s", i, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
		time.Sleep(1500 * time.Millisecond) // checks begun in the outage end, or retry, here
	}
	stop()
	if lost, back := countLines(&logs, "store lost"), countLines(&logs, "store back"); lost != outages || back != outages {
		t.Errorf("%d store lost and %d store back lines for %d outages, want one each per outage:\n%s", lost, back, outages, logs.String())
	}
	for _, series := range []string{`sluice_store_transitions_total{cause="",to="up"}`, `sluice_store_transitions_total{cause="unreachable",to="down"}`} {
		if got := scrapedMetric(t, p, series); got != strconv.Itoa(outages) {
			t.Errorf("%s %s, want %d", series, got, outages)
		}
	}
	if code, body := p.get(t, "/readyz"); code != 200 {
		t.Errorf("readyz with Redis back: %d %s", code, body)
	}
}

// TestServerRedisRefusesWrites: a Redis that answers PING but refuses
// sluice's scripts (here too few replicas for min-replicas-to-write) is a
// lost store, under the error policy not ready, and back when it accepts
// them again.
func TestServerRedisRefusesWrites(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "error", &logs)
	if code, _ := p.get(t, "/readyz"); code != 200 {
		t.Fatalf("readyz with Redis up: %d", code)
	}
	if got := scrapedMetric(t, p, "sluice_fleet_counted"); got != "" {
		t.Errorf("sluice_fleet_counted %q under the error policy, which takes no share: want none", got)
	}
	admin := r.Client(t)
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "min-replicas-to-write", "1").Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, &logs, "store lost", "cause=replicas", "ready=false")
	if code, body := p.get(t, "/readyz"); code != 503 {
		t.Errorf("readyz with Redis refusing writes: %d %s", code, body)
	}
	if got := grpcHealth(t, p.grpc, ""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health with Redis refusing writes: %v, want NOT_SERVING", got)
	}
	if err := admin.ConfigSet(ctx, "min-replicas-to-write", "0").Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, &logs, "store back")
	if code, _ := p.get(t, "/readyz"); code != 200 {
		t.Errorf("readyz after Redis accepts writes again: %d", code)
	}
}

// TestServerRedisOutOfMemory: a Redis whose used memory is over maxmemory
// under noeviction refuses every take (OOM). It is a lost store of cause
// oom, from the start-up check on (which must write to notice it): logged
// at ERROR, counted, store_up 0, in /v1/status with what to do; back when
// maxmemory is raised.
func TestServerRedisOutOfMemory(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
	// No watch check within the test: what the start found.
	var startLogs syncBuffer
	fp, _, _ := ParseFailurePolicy("local")
	first := runServer(t, Options{
		ConfigFile: "testdata/envoy-example.yaml", RedisURL: "redis://" + r.Addr,
		FailurePolicy: fp, StoreCheckInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(&startLogs, nil)),
	})
	if st := first.health.Status(); st.Store.Up || st.Store.Cause != "oom" {
		t.Errorf("status after the start: %+v, want the store down, cause oom", st.Store)
	}
	logged(t, &startLogs, "level=ERROR", "store lost", "cause=oom", "raise maxmemory")

	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "local", &logs)
	logged(t, &logs, "level=ERROR", "store lost", "cause=oom")
	if got := scrapedMetric(t, p, "sluice_store_up"); got != "0" {
		t.Errorf("sluice_store_up %q, want 0", got)
	}
	if got := scrapedMetric(t, p, `sluice_store_transitions_total{cause="oom",to="down"}`); got != "1" {
		t.Errorf(`sluice_store_transitions_total{cause="oom",to="down"} %q, want 1`, got)
	}
	_, st := p.getJSON(t, "/v1/status")
	store, _ := st["store"].(map[string]any)
	if store["up"] != false || store["cause"] != "oom" || !strings.Contains(fmt.Sprint(store["error"]), "raise maxmemory") {
		t.Errorf("/v1/status store %v: want down, cause oom, with what to do", store)
	}
	if reasons := fmt.Sprint(st["reasons"]); !strings.Contains(reasons, "out of memory") || strings.Contains(reasons, "unreachable") {
		t.Errorf("reasons %s: want out of memory, not unreachable", reasons)
	}
	if err := r.Client(t).ConfigSet(context.Background(), "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, &logs, "store back")
	if got := scrapedMetric(t, p, "sluice_store_up"); got != "1" {
		t.Errorf("sluice_store_up %q after maxmemory was raised, want 1", got)
	}
}

// TestServerEvictionSetAtRuntime: a maxmemory-policy that may evict
// sluice's keys, set after the start, is logged by a periodic full check
// and shown in /metrics; setting noeviction again is logged too.
func TestServerEvictionSetAtRuntime(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "local", &logs)
	logged(t, &logs, "Redis checked")
	if strings.Contains(logs.String(), "may evict") {
		t.Fatalf("an eviction warning before any was due:\n%s", logs.String())
	}
	admin := r.Client(t)
	ctx := context.Background()
	if err := admin.ConfigSet(ctx, "maxmemory", "1gb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "allkeys-lru").Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, &logs, "Redis check", "maxmemory-policy allkeys-lru may evict")
	if got := scrapedMetric(t, p, `sluice_redis_may_evict{node="`+r.Addr+`",policy="allkeys-lru"}`); got != "1" {
		t.Errorf("sluice_redis_may_evict under allkeys-lru = %q, want 1", got)
	}
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, &logs, "Redis check: warnings cleared", "allkeys-lru")
	if n := countLines(&logs, "allkeys-lru may evict"); n != 2 { // the warning and the line that clears it
		t.Errorf("%d lines name the warning, want 2 (logged once, cleared once):\n%s", n, logs.String())
	}
}

// TestServerEvictionWarningOnceAcrossOutages: a Redis whose
// maxmemory-policy may evict sluice's keys, lost and back three times,
// is warned of once: each store back runs the full check, which logged
// every warning again (3 times in 6 s while Redis flapped).
func TestServerEvictionWarningOnceAcrossOutages(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t, "--maxmemory", "1gb", "--maxmemory-policy", "allkeys-lru")
	var logs syncBuffer
	startOnRedis(t, "redis://"+r.Addr, "local", &logs)
	logged(t, &logs, "Redis check", "maxmemory-policy allkeys-lru may evict")
	const outages = 3
	for i := 1; i <= outages; i++ {
		r.Stop()
		if !eventually(func() bool { return countLines(&logs, `msg="store lost"`) == i }) {
			t.Fatalf("outage %d: no store lost line:\n%s", i, logs.String())
		}
		r.Start(t)
		if !eventually(func() bool { return countLines(&logs, `msg="store back"`) == i }) {
			t.Fatalf("outage %d: no store back line:\n%s", i, logs.String())
		}
	}
	if n := countLines(&logs, "allkeys-lru may evict"); n != 1 {
		t.Errorf("the eviction warning logged %d times over %d outages, want once:\n%s", n, outages, logs.String())
	}
}

// TestServerPermissionRevoked: a Redis user that loses EVALSHA (or TIME,
// which every script calls) at runtime is a lost store with its cause, and
// under the error policy not ready: the watch checks what decisions use.
func TestServerPermissionRevoked(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	admin := r.Client(t)
	ctx := context.Background()
	sluiceUser(t, admin, "revoked")
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://revoked:pw@"+r.Addr, "error", &logs)
	if code, _ := p.get(t, "/readyz"); code != 200 {
		t.Fatalf("readyz with Redis up: %d", code)
	}
	for _, cmd := range []string{"evalsha", "time"} {
		if err := admin.Do(ctx, "acl", "setuser", "revoked", "-"+cmd).Err(); err != nil {
			t.Fatal(err)
		}
		logged(t, &logs, "store lost", "cause=permission", "ready=false")
		if code, body := p.get(t, "/readyz"); code != 503 {
			t.Errorf("readyz without %s: %d %s", cmd, code, body)
		}
		if err := admin.Do(ctx, "acl", "setuser", "revoked", "+"+cmd).Err(); err != nil {
			t.Fatal(err)
		}
		for i := 0; countLines(&logs, "store back") < 1 || countLines(&logs, "store lost") > countLines(&logs, "store back"); i++ {
			if i > 200 {
				t.Fatalf("%s granted again: no store back in:\n%s", cmd, logs.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestServerBreakerTransitionsLogged: the failure policy switching on and
// off is told on the breaker's opening and closing lines (package
// resilient's), naming the policy, and counted once each.
func TestServerBreakerTransitionsLogged(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "local", &logs)
	r.Stop()
	eventually(func() bool {
		p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=b"}`)
		return countLines(&logs, "breaker open") > 0
	})
	logged(t, &logs, "level=WARN", "resilient: breaker open", "from=closed", "policy=local")
	if got := scrapedMetric(t, p, `sluice_fallback_transitions_total{to="on"}`); got != "1" {
		t.Errorf("fallback transitions on %q, want 1", got)
	}
	if _, st := p.getJSON(t, "/v1/status"); st["fallback_active"] != true {
		t.Errorf("status %v", st)
	}
	r.Start(t)
	// The breaker probes after its interval (1s); decisions bring it back.
	eventually(func() bool {
		p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=b"}`)
		return countLines(&logs, "breaker closed") > 0
	})
	logged(t, &logs, "level=INFO", "resilient: breaker closed", "policy=local")
	if n := countLines(&logs, "from=closed"); n != 1 {
		t.Errorf("%d lines of the breaker leaving closed, want 1 for one outage:\n%s", n, logs.String())
	}
	if got := scrapedMetric(t, p, `sluice_fallback_transitions_total{to="off"}`); got != "1" {
		t.Errorf("fallback transitions off %q, want 1", got)
	}
}

func (p *proc) getJSON(t *testing.T, path string) (int, map[string]any) {
	t.Helper()
	code, body := p.get(t, path)
	var m map[string]any
	if err := json.Unmarshal([]byte(body), &m); err != nil {
		t.Fatalf("%s: %v: %s", path, err, body)
	}
	return code, m
}

// TestHealthRules: readiness under each failure policy and without a
// configuration, as a table over Health itself.
func TestHealthRules(t *testing.T) {
	down := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	for _, tt := range []struct {
		name                 string
		withPolicy, loaded   bool
		storeErr             error
		fallback             bool
		wantReady, wantDegra bool
	}{
		{"local, Redis up", true, true, nil, false, true, false},
		{"local, Redis down", true, true, down, false, true, true},
		{"local, breaker open", true, true, nil, true, true, true},
		{"error, Redis up", false, true, nil, false, true, false},
		{"error, Redis down", false, true, down, false, false, true},
		{"no configuration", true, false, nil, false, false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			policy := "local"
			if !tt.withPolicy {
				policy = "error"
			}
			h := newHealth(healthOptions{policy: policy, withPolicy: tt.withPolicy, store: "redis",
				configured: func() bool { return tt.loaded }})
			h.storeResult(tt.storeErr)
			h.fallbackActive(tt.fallback, nil)
			st := h.Status()
			if st.Ready != tt.wantReady || st.Degraded != tt.wantDegra {
				t.Errorf("ready %v degraded %v (%q), want %v %v", st.Ready, st.Degraded, st.Reasons, tt.wantReady, tt.wantDegra)
			}
			if (!st.Ready || st.Degraded) && len(st.Reasons) == 0 {
				t.Error("no reason given")
			}
		})
	}
	var nilHealth *Health
	if st := nilHealth.Status(); !st.Ready || st.Degraded {
		t.Errorf("nil Health: %+v, want ready", st)
	}
}

// TestIdleBreakerCloses: once Redis serves again, the breaker of an
// instance that gets no more requests closes on the health watch's probes,
// and the status says so; it does not wait for the next request.
func TestIdleBreakerCloses(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	admin := r.Client(t)
	ctx := context.Background()
	sluiceUser(t, admin, "flaky")
	cfg := writeConfig(t, slotsConfig)
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://flaky:pw@" + r.Addr + "/0", StoreCheckInterval: 100 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err := admin.Do(ctx, "acl", "setuser", "flaky", "-@write").Err(); err != nil {
		t.Fatal(err)
	}
	for i := 0; !srv.health.Status().FallbackActive; i++ {
		if i == 100 {
			t.Fatal("the breaker never opened")
		}
		if _, err := srv.Service().Check(ctx, "api", "ann", 1); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.Do(ctx, "acl", "setuser", "flaky", "+@write").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for srv.health.Status().FallbackActive {
		if time.Now().After(deadline) {
			t.Fatalf("no request for 10s: status %+v, want the breaker closed by the watch's probes", srv.health.Status())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestHealthDownForFromFirstEvidence: an outage counts from its first
// failed call or check, not from the check that declared the store lost;
// a failure from before the store last passed a check is not part of it.
// /v1/status's since agrees.
func TestHealthDownForFromFirstEvidence(t *testing.T) {
	var logs syncBuffer
	h := newHealth(healthOptions{log: slog.New(slog.NewTextHandler(&logs, nil)), policy: "local", withPolicy: true, store: "redis"})
	now := time.Now()
	refused := errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")
	h.callFailed(now.Add(-3 * time.Second))
	h.checked(h.startCheck(), now.Add(-2*time.Second), nil) // answered since: not this outage
	h.callFailed(now.Add(-time.Second))
	h.checked(h.startCheck(), now.Add(-500*time.Millisecond), refused)
	if got := h.Status().Store.Since; !got.Equal(now.Add(-time.Second)) {
		t.Errorf("since %v, want the first failed call's start %v", got, now.Add(-time.Second))
	}
	h.storeResult(nil)
	line := logged(t, &logs, "store back")
	d, err := time.ParseDuration(strings.TrimPrefix(strings.Fields(line[strings.Index(line, "down_for="):])[0], "down_for="))
	if err != nil || d < time.Second || d >= 2*time.Second {
		t.Errorf("down_for in %q: %v, %v; want from the first failed call after the last passed check (1s ago)", line, d, err)
	}
}

// TestHealthCauseChange: an outage whose cause changes (unreachable, then
// a restarted Redis without the ACL user) is one outage: one down count,
// a line for the new cause, and down_for from its start.
func TestHealthCauseChange(t *testing.T) {
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	h := newHealth(healthOptions{log: slog.New(slog.NewTextHandler(&logs, nil)), policy: "local", withPolicy: true, store: "redis", reg: reg})
	h.storeResult(errors.New("dial tcp 127.0.0.1:6379: connect: connection refused"))
	time.Sleep(100 * time.Millisecond)
	h.storeResult(errors.New("WRONGPASS invalid username-password pair"))
	h.storeResult(nil)
	if n := countLines(&logs, "store lost"); n != 1 {
		t.Errorf("%d store lost lines, want 1:\n%s", n, logs.String())
	}
	if n := countLines(&logs, "store still lost, another cause"); n != 1 || !strings.Contains(logs.String(), "cause=auth") {
		t.Errorf("the new cause: %d lines, want 1 naming auth:\n%s", n, logs.String())
	}
	line := logged(t, &logs, "store back")
	if d, err := time.ParseDuration(strings.TrimPrefix(strings.Fields(line[strings.Index(line, "down_for="):])[0], "down_for=")); err != nil || d < 100*time.Millisecond {
		t.Errorf("down_for in %q: %v, %v; want from the outage's start", line, d, err)
	}
	downs := 0.0
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "sluice_store_transitions_total" {
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "to" && l.GetValue() == "down" {
						downs += m.GetCounter().GetValue()
					}
				}
			}
		}
	}
	if downs != 1 {
		t.Errorf("%v down transitions, want 1", downs)
	}
}

// TestHealthPartialFailure: decisions the failure policy answers for failed
// store calls while the breaker stays closed (a Cluster node down among
// live ones) make the service degraded once they have gone on for
// partialAfter with no pause of partialGap; logged once each way.
// Isolated failures (two stalls 2.6s apart), a run broken by a pause, and
// failures from before the breaker opened and closed say nothing.
func TestHealthPartialFailure(t *testing.T) {
	var logs syncBuffer
	reg := prometheus.NewRegistry()
	h := newHealth(healthOptions{log: slog.New(slog.NewTextHandler(&logs, nil)), policy: "local", withPolicy: true, store: "redis", reg: reg})
	t0 := time.Now()
	fail := func(from, to time.Duration) {
		for d := from; d <= to; d += 100 * time.Millisecond {
			h.failedCall(t0.Add(d), "", errors.New("i/o timeout"))
		}
	}
	// Two stalls of two failed calls each, 2.6s apart.
	fail(0, 100*time.Millisecond)
	fail(2600*time.Millisecond, 2700*time.Millisecond)
	// A run that pauses for partialGap before its 2s are up.
	fail(3*time.Second, 4500*time.Millisecond)
	fail(4500*time.Millisecond+partialGap, 6*time.Second)
	if st := h.Status(); st.Degraded {
		t.Fatalf("after failures never sustained for %v: %+v, want not degraded", partialAfter, st)
	}
	// A run the breaker interrupts: what failed before it opened does not
	// add to what fails after it closed.
	fail(7*time.Second, 8500*time.Millisecond)
	h.fallbackActive(true, errors.New("i/o timeout"))
	h.fallbackActive(false, nil)
	fail(8600*time.Millisecond, 9500*time.Millisecond)
	if st := h.Status(); st.Degraded {
		t.Fatalf("1.5s of failures before the breaker opened, 0.9s after it closed: %+v, want not degraded", st)
	}
	fail(9600*time.Millisecond, 10600*time.Millisecond) // 2s since the run began, after the breaker closed
	st := h.Status()
	if !st.Degraded || len(st.Reasons) != 1 || !strings.Contains(st.Reasons[0], "answered 21 decisions") || !st.Ready {
		t.Fatalf("after %v of failed calls: %+v, want degraded, ready, the reason counted", partialAfter, st)
	}
	last := 10600 * time.Millisecond
	h.refresh(t0.Add(last + partialWindow - time.Second))
	if !h.Status().Degraded {
		t.Fatal("degraded ended before partialWindow")
	}
	h.refresh(t0.Add(last + partialWindow))
	if st := h.Status(); st.Degraded {
		t.Fatalf("after partialWindow without a failed call: %+v", st)
	}
	if n, m := countLines(&logs, "breaker is closed"), countLines(&logs, "store calls no longer failing"); n != 1 || m != 1 {
		t.Errorf("%d and %d lines, want one each way:\n%s", n, m, logs.String())
	}
}

// TestFaultPartialIgnoresIsolatedStalls: two stalls of Redis 2.6s apart
// (DEBUG SLEEP 100ms, each failing a call or two under the 50ms decision
// timeout) are not a partial failure of the store: not degraded, no line.
func TestFaultPartialIgnoresIsolatedStalls(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t, "--enable-debug-command", "local")
	cfg := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: fixed_window 1000000000/1h\n")
	var logs syncBuffer
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr, StoreCheckInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	p := &proc{http: srv.HTTPAddr()}
	stop := keepCalling(1, 0, func(int) { sendCheck(p, "api") })
	admin := r.Client(t)
	ctx := context.Background()
	time.Sleep(300 * time.Millisecond)
	for i := range 2 {
		if i > 0 {
			time.Sleep(2600 * time.Millisecond)
		}
		if err := admin.Do(ctx, "DEBUG", "SLEEP", "0.1").Err(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(300 * time.Millisecond)
	stop()
	// Timeouts on established connections: the stall named as such.
	if _, body := p.get(t, "/metrics"); !strings.Contains(body, `sluice_store_errors_total{cause="stalled",op="take",store="redis"}`) ||
		strings.Contains(body, `sluice_store_errors_total{cause="unreachable"`) {
		t.Fatalf("want the failed takes during the stalls, all with cause stalled:\n%s", logs.String())
	}
	if got := scrapedMetric(t, p, `sluice_fallback_transitions_total{to="on"}`); got != "0" {
		t.Fatalf("the breaker opened (%s): not the case under test", got)
	}
	if got := scrapedMetric(t, p, "sluice_degraded"); got != "0" {
		t.Errorf("sluice_degraded %s after two isolated stalls, want 0", got)
	}
	if strings.Contains(logs.String(), "breaker is closed") {
		t.Errorf("a partial failure logged for two isolated stalls:\n%s", logs.String())
	}
}

// TestFaultPartialFailureNamesCause: a Redis user refused one policy's
// keys (ACL) fails every decision of that policy while the others pass and
// the breaker stays closed: the partial failure's line and /v1/status
// name the cause and Redis's error.
func TestFaultPartialFailureNamesCause(t *testing.T) {
	race.SkipTiming(t)
	p, logs, _ := otherRefused(t, "partial")
	deadline := time.Now().Add(10 * time.Second)
	var st map[string]any
	for {
		sendCheck(p, "api")
		sendCheck(p, "api")
		sendCheck(p, "other")
		if _, st = p.getJSON(t, "/v1/status"); st["degraded"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("one policy's keys refused for 10s: status %v, want degraded", st)
		}
	}
	if st["fallback_active"] == true {
		t.Fatalf("status %v: the breaker opened; want it closed, policy api passing", st)
	}
	if reasons := fmt.Sprint(st["reasons"]); !strings.Contains(reasons, "permission: ") || !strings.Contains(reasons, "NOPERM") {
		t.Errorf("reasons %s: want the cause (permission) and Redis's error", reasons)
	}
	if got := scrapedMetric(t, p, `sluice_store_errors_total{cause="permission",op="take",store="redis"}`); got == "" || got == "0" {
		t.Errorf(`sluice_store_errors_total{cause="permission",op="take"} %q, want the refused takes`, got)
	}
	line := logged(t, logs, "store calls failing while the breaker is closed")
	if !strings.Contains(line, "cause=permission") || !strings.Contains(line, "NOPERM") || !strings.Contains(line, "level=ERROR") {
		t.Errorf("log line %q: want level ERROR, cause=permission and Redis's error", line)
	}
}

// TestFaultPartialFailureTransitions: a partial failure (a Redis user
// refused one policy's keys, the other policy passing) counts its start in
// sluice_partial_failure_transitions_total{to="on"} with its cause, beside
// its line. Its cause is permanent, so it lasts while the refused policy
// gets no calls, past the 10 s that end a transient one (it ended then,
// and started again at the next call: sluice_degraded flapped for a policy
// used less often); it ends when Redis answers that policy again, once
// the ACL is fixed, counted in to="off" beside its line.
func TestFaultPartialFailureTransitions(t *testing.T) {
	race.SkipTiming(t)
	p, logs, admin := otherRefused(t, "episode")
	on, off := `sluice_partial_failure_transitions_total{cause="permission",to="on"}`, `sluice_partial_failure_transitions_total{cause="",to="off"}`
	if got := scrapedMetric(t, p, off); got != "0" {
		t.Errorf("%s %q at start, want 0", off, got)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		p.post(t, "/v1/check", `{"policy":"api","key":"k"}`)
		p.post(t, "/v1/check", `{"policy":"other","key":"k"}`)
		if _, st := p.getJSON(t, "/v1/status"); st["degraded"] == true {
			if st["fallback_active"] == true {
				t.Fatalf("status %v: the breaker opened; not the case under test", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("policy other's keys refused for 10s: not degraded")
		}
	}
	logged(t, logs, "store calls failing while the breaker is closed", "cause=permission")
	if got := scrapedMetric(t, p, on); got != "1" {
		t.Errorf("%s %q once the partial failure started, want 1", on, got)
	}
	if got := scrapedMetric(t, p, off); got != "0" {
		t.Errorf("%s %q while it lasts, want 0", off, got)
	}
	// No more calls of policy other, policy api passing: still refused,
	// so still degraded past partialWindow.
	for until := time.Now().Add(partialWindow + 1500*time.Millisecond); time.Now().Before(until); time.Sleep(200 * time.Millisecond) {
		p.post(t, "/v1/check", `{"policy":"api","key":"k"}`)
		if _, st := p.getJSON(t, "/v1/status"); st["degraded"] != true {
			t.Fatalf("status %v with policy other still refused, only unused; want degraded", st)
		}
	}
	if got := scrapedMetric(t, p, off); got != "0" {
		t.Errorf("%s %q with policy other still refused, want 0", off, got)
	}
	// The ACL fixed, the next call of policy other is answered by Redis:
	// that ends it.
	if err := admin.Do(context.Background(), "acl", "setuser", "episode", "allkeys").Err(); err != nil {
		t.Fatal(err)
	}
	if code, body := p.post(t, "/v1/check", `{"policy":"other","key":"k"}`); code != 200 {
		t.Fatalf("check of policy other once allowed: %d %v", code, body)
	}
	if _, st := p.getJSON(t, "/v1/status"); st["degraded"] != false {
		t.Errorf("status %v once Redis answered policy other, want not degraded", st)
	}
	logged(t, logs, "store calls answered again", "cause=permission")
	if n := countLines(logs, "store calls failing while the breaker is closed"); n != 1 {
		t.Errorf("%d partial failure lines, want 1:\n%s", n, logs.String())
	}
	if got := scrapedMetric(t, p, off); got != "1" {
		t.Errorf("%s %q once the partial failure ended, want 1", off, got)
	}
	if got := scrapedMetric(t, p, on); got != "1" {
		t.Errorf("%s %q after the end, want 1", on, got)
	}
	if got := scrapedMetric(t, p, "sluice_degraded"); got != "0" {
		t.Errorf("sluice_degraded %s after the end, want 0", got)
	}
}

// TestHealthPartialPermanentAtOnce: a permanent cause (NOPERM, OOM) will
// not pass on its own, so its first failed call is a partial failure,
// logged once at ERROR, however seldom the failing policy is used; a
// transient cause as seldom says nothing.
func TestHealthPartialPermanentAtOnce(t *testing.T) {
	for _, tc := range []struct {
		err     error
		partial bool
	}{
		{errors.New("NOPERM No permissions to access a key"), true},
		{errors.New("OOM command not allowed when used memory > 'maxmemory'."), true},
		{errors.New("i/o timeout"), false},
	} {
		var logs syncBuffer
		h := newHealth(healthOptions{log: slog.New(slog.NewTextHandler(&logs, nil)), policy: "local", withPolicy: true, store: "redis", reg: prometheus.NewRegistry()})
		t0 := time.Now()
		h.failedCall(t0, "", tc.err)
		if got := h.Status().Degraded; got != tc.partial {
			t.Errorf("%v: degraded %v after one failed call, want %v", tc.err, got, tc.partial)
		}
		// Every 550ms for 8s: never a run, but the same cause.
		for d := 550 * time.Millisecond; d < 8*time.Second; d += 550 * time.Millisecond {
			h.failedCall(t0.Add(d), "", tc.err)
			h.refresh(t0.Add(d))
		}
		n := countLines(&logs, "breaker is closed")
		if got := h.Status().Degraded; got != tc.partial || n != map[bool]int{true: 1, false: 0}[tc.partial] {
			t.Errorf("%v every 550ms for 8s: degraded %v, %d lines; want %v and %d:\n%s", tc.err, got, n, tc.partial, map[bool]int{true: 1, false: 0}[tc.partial], logs.String())
		}
		if tc.partial && countLines(&logs, "level=ERROR") != 1 {
			t.Errorf("%v: want the line at ERROR:\n%s", tc.err, logs.String())
		}
	}
}

// TestFaultPartialPermanentLowTraffic: a Redis user refused one policy's
// keys, while another passes busily; that policy asked every 550ms (never a run of 2s without a 0.5s
// pause): the first refused call makes the service degraded, with one
// ERROR line naming the cause; before, nothing but the error counter.
func TestFaultPartialPermanentLowTraffic(t *testing.T) {
	race.SkipTiming(t)
	p, logs, _ := otherRefused(t, "seldom")
	// Policy api busy and passing keeps the breaker closed.
	stop := keepCalling(1, 10*time.Millisecond, func(int) { sendCheck(p, "api") })
	defer stop()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	var st map[string]any
	for i := 0; ; i++ {
		sendCheck(p, "other")
		if _, st = p.getJSON(t, "/v1/status"); st["degraded"] == true {
			break
		}
		if i == 3 {
			t.Fatalf("%d refused calls of policy other, 550ms apart, over %v: status %v, metrics errors %q; want degraded at the first",
				i+1, time.Since(start).Round(time.Millisecond), st, scrapedMetric(t, p, `sluice_store_errors_total{cause="permission",op="take",store="redis"}`))
		}
		time.Sleep(550 * time.Millisecond)
	}
	if st["fallback_active"] == true {
		t.Fatalf("status %v: the breaker opened; not the case under test", st)
	}
	if got := scrapedMetric(t, p, "sluice_degraded"); got != "1" {
		t.Errorf("sluice_degraded %s, want 1", got)
	}
	if reasons := fmt.Sprint(st["reasons"]); !strings.Contains(reasons, "permission: ") {
		t.Errorf("reasons %s: want the cause (permission)", reasons)
	}
	line := logged(t, logs, "store calls failing while the breaker is closed")
	if !strings.Contains(line, "cause=permission") || !strings.Contains(line, "level=ERROR") {
		t.Errorf("log line %q: want level ERROR and cause=permission", line)
	}
	// Still refused, still seldom: degraded throughout, one line.
	for range 4 {
		time.Sleep(550 * time.Millisecond)
		sendCheck(p, "other")
	}
	if _, st = p.getJSON(t, "/v1/status"); st["degraded"] != true {
		t.Errorf("status %v after more refused calls, want degraded", st)
	}
	if n := countLines(logs, "breaker is closed"); n != 1 {
		t.Errorf("%d partial-failure lines, want 1:\n%s", n, logs.String())
	}
}

// TestFaultReadyzAtOnceRedisSilent: under the error policy a Redis that
// holds its replies makes /readyz a 503 naming why, once the watch has
// found it silent; each request's own check waits only the decision
// timeout, never a probe's 1 s timeout. /v1/status agrees. A real sluice
// serve, through a proxy that holds Redis's replies.
func TestFaultReadyzAtOnceRedisSilent(t *testing.T) {
	race.SkipTiming(t)
	cut := newStallProxy(t, redistest.Addr(t))
	p := startSluice(t, nil, "--config", "testdata/envoy-example.yaml", "--redis", "redis://"+cut.addr(),
		"--failure-policy", "error", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0")
	if code, body := p.get(t, "/readyz"); code != 200 {
		t.Fatalf("readyz with Redis up: %d %s", code, body)
	}
	cut.stall()
	client := &http.Client{Timeout: 5 * time.Second}
	timed := func(path string) (int, string, time.Duration) {
		start := time.Now()
		resp, err := client.Get("http://" + p.http + path)
		if err != nil {
			t.Fatalf("%s with Redis silent: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), time.Since(start)
	}
	var took []time.Duration
	deadline := time.Now().Add(6 * time.Second) // the watch's check: its interval and 1 s timeout
	code, body, d := timed("/readyz")
	for took = append(took, d); code != 503; took = append(took, d) {
		if time.Now().After(deadline) {
			t.Fatalf("readyz still %d %q 6s into Redis's silence, want 503", code, body)
		}
		time.Sleep(50 * time.Millisecond)
		code, body, d = timed("/readyz")
	}
	if !strings.Contains(body, "the store does not answer") || !strings.Contains(body, "no failure policy") {
		t.Errorf("readyz 503 body %q: want the reason", body)
	}
	for range 10 {
		path := "/readyz"
		code, body, d = timed(path)
		if code != 503 {
			t.Errorf("readyz %d %q, want 503", code, body)
		}
		took = append(took, d)
		code, body, d = timed("/v1/status")
		if code != 200 || !strings.Contains(body, `"ready":false`) {
			t.Errorf("status %d %s, want not ready", code, body)
		}
		took = append(took, d)
		time.Sleep(50 * time.Millisecond)
	}
	slices.Sort(took)
	if p90, worst := took[len(took)*9/10], took[len(took)-1]; p90 > 200*time.Millisecond || worst > 800*time.Millisecond {
		t.Errorf("readyz and status with Redis silent: p90 %v, max %v over %d; want within 200ms and 800ms (a probe times out at 1s)", p90, worst, len(took))
	}
	if got := grpcHealth(t, p.grpc, ""); got != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Errorf("gRPC health with Redis silent: %v, want NOT_SERVING", got)
	}
}

// TestFaultRedisWritesPaused: a Redis whose writes are paused (CLIENT PAUSE
// WRITE) still answers PING and INFO: the store is lost as stalled, not
// unreachable, at WARN (nothing to reconfigure), in the transitions, in
// /v1/status and in the store errors' cause; unpaused, it is back once.
// Paused at start, it does not stop the start (the check waits 5 s).
func TestFaultRedisWritesPaused(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	var logs, errLogs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "local", &logs)
	_, pe := startOnRedis(t, "redis://"+r.Addr, "error", &errLogs) // its decisions reach Redis
	logged(t, &logs, "Redis checked")
	logged(t, &errLogs, "Redis checked")
	admin := r.Client(t)
	ctx := context.Background()
	if err := admin.Do(ctx, "client", "pause", 12000, "write").Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { admin.Do(ctx, "client", "unpause") })
	var startLogs syncBuffer
	startOnRedis(t, "redis://"+r.Addr, "local", &startLogs)
	logged(t, &startLogs, "level=WARN", "Redis stalled at start", "failure_policy=local")
	logged(t, &startLogs, "level=WARN", "store lost", "cause=stalled")
	line := logged(t, &logs, "store lost")
	if !strings.Contains(line, "level=WARN") || !strings.Contains(line, "cause=stalled") || !strings.Contains(line, "ready=true") {
		t.Errorf("log line %q: want WARN, cause=stalled, ready", line)
	}
	if got := scrapedMetric(t, p, `sluice_store_transitions_total{cause="stalled",to="down"}`); got != "1" {
		t.Errorf(`sluice_store_transitions_total{cause="stalled",to="down"} %q, want 1`, got)
	}
	if got := scrapedMetric(t, p, `sluice_redis_up{node="`+r.Addr+`"}`); got != "1" {
		t.Errorf("sluice_redis_up %q: Redis answers INFO, want 1", got)
	}
	if _, st := p.getJSON(t, "/v1/status"); st["store"].(map[string]any)["cause"] != "stalled" {
		t.Errorf("status %v: want the store's cause stalled", st)
	}

	logged(t, &errLogs, "store lost", "cause=stalled", "ready=false")
	if code, _ := pe.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=a"}`); code != 503 {
		t.Errorf("check under the error policy with writes paused: %d, want 503", code)
	}
	if got := scrapedMetric(t, pe, `sluice_store_errors_total{cause="stalled",op="take",store="redis"}`); got != "1" {
		t.Errorf(`sluice_store_errors_total{cause="stalled",op="take"} %q, want 1`, got)
	}

	if err := admin.Do(ctx, "client", "unpause").Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, &logs, "store back")
	logged(t, &errLogs, "store back")
	time.Sleep(300 * time.Millisecond) // more checks, all passing
	logged(t, &startLogs, "store back")
	for _, l := range []*syncBuffer{&logs, &errLogs, &startLogs} {
		if lost, back := countLines(l, "store lost"), countLines(l, "store back"); lost != 1 || back != 1 {
			t.Errorf("%d store lost and %d store back lines, want one each:\n%s", lost, back, l.String())
		}
		if strings.Contains(l.String(), "cause=unreachable") || strings.Contains(l.String(), "Redis unreachable") {
			t.Errorf("a Redis that answers called unreachable:\n%s", l.String())
		}
	}
	if got := scrapedMetric(t, p, `sluice_store_transitions_total{cause="",to="up"}`); got != "1" {
		t.Errorf("transitions to up %q, want 1", got)
	}
}

// sluiceUser makes the ACL user name (password pw) with every permission
// sluice serve needs, for tests that take some away.
func sluiceUser(t *testing.T, admin *redis.Client, name string) {
	t.Helper()
	if err := admin.Do(context.Background(), "acl", "setuser", name, "on", ">pw", "~*", "&*", "-@all", "+@connection", "+info",
		"+evalsha", "+eval", "+script|load", "+time", "+@read", "+@write", "+publish", "+subscribe").Err(); err != nil {
		t.Fatal(err)
	}
}

// allowKeys makes the keys user may use those of patterns, and the keys
// every policy shares (the fleet's, the checks', the breaker's probe).
func allowKeys(t *testing.T, admin *redis.Client, user string, patterns ...string) {
	t.Helper()
	args := []any{"acl", "setuser", user, "resetkeys", "~sluice:check", "~sluice:{fleet}*", "~{sluice:fleet}*", "~sluice:{v*:sluice-breaker-probe*"}
	for _, p := range patterns {
		args = append(args, p)
	}
	if err := admin.Do(context.Background(), args...).Err(); err != nil {
		t.Fatal(err)
	}
}

// otherRefused runs a service, policies api and other, as Redis user
// user, whom an ACL then refuses every key of policy other's; it returns
// the service, its log and an admin client of Redis.
func otherRefused(t *testing.T, user string) (*proc, *syncBuffer, *redis.Client) {
	t.Helper()
	r := redistest.StartServer(t)
	admin := r.Client(t)
	sluiceUser(t, admin, user)
	cfg := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: fixed_window 1000000000/1h\n  - name: other\n    limit: fixed_window 1000000000/1h\n")
	logs := &syncBuffer{}
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + user + ":pw@" + r.Addr, StoreCheckInterval: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	// Every key sluice uses but policy other's.
	allowKeys(t, admin, user, "~sluice:{v*:api@*")
	return &proc{http: srv.HTTPAddr()}, logs, admin
}

// TestHealthPartialLeaseCallsEnd: a partial failure started by a lease's
// failed return (and a slot's failed release: no decision answered for
// its policy, though its event names the failure policy) ends on
// evidence, as one started by decisions does: a later lease call of that
// policy Redis answered, then partialWindow without a failed call. Another
// policy's answers are none. Before, it lasted until the breaker opened or
// Redis was lost.
func TestHealthPartialLeaseCallsEnd(t *testing.T) {
	var logs syncBuffer
	h := newHealth(healthOptions{log: slog.New(slog.NewTextHandler(&logs, nil)), policy: "local", withPolicy: true, store: "redis", reg: prometheus.NewRegistry()})
	h.policyOf = func(key string) string {
		name, _, _ := strings.Cut(key, ":")
		return name
	}
	m := NewMetrics()
	m.storeName, m.health = "redis", h
	o := healthObserver{m, h}
	refused := errors.New("NOPERM this user has no permissions to access one of the keys used as arguments")
	o.ObserveStore(sluice.StoreEvent{Store: "redis", Op: "return", Key: "hot:k", Source: sluice.SourceBackend, Err: refused})
	// A slot's failed release answers no decision either.
	o.ObserveStore(sluice.StoreEvent{Store: "redis", Op: "release", Key: "hot:k", Source: sluice.SourceFallback, Err: refused})
	if st := h.Status(); !st.Degraded || len(st.Reasons) != 1 || !strings.Contains(st.Reasons[0], "answered 0 decisions") {
		t.Fatalf("a refused return and release: %+v, want degraded, no decision answered by the policy", st)
	}
	o.ObserveStore(sluice.StoreEvent{Store: "redis", Op: "grant", Key: "cold:k", Source: sluice.SourceBackend})
	h.refresh(time.Now().Add(partialWindow + time.Second))
	if !h.Status().Degraded {
		t.Fatal("ended by another policy's grant")
	}
	o.ObserveStore(sluice.StoreEvent{Store: "redis", Op: "grant", Key: "hot:k", Source: sluice.SourceBackend})
	h.refresh(time.Now().Add(partialWindow + time.Second))
	if h.Status().Degraded || countLines(&logs, "store calls answered again") != 1 {
		t.Errorf("policy hot's grant answered, then %v without a failure: degraded %v; want ended, one line:\n%s", partialWindow, h.Status().Degraded, logs.String())
	}
	promtest.Expect(t, m.reg, "sluice_store_errors_total", map[string]string{"store": "redis", "op": "return", "cause": "permission"}, 1)
}

// TestHealthLiveCheckCutShort: a request's check of the store that its own
// bound cuts short learned nothing, also when the probe returns at the
// deadline before the context's timer has fired (go-redis ends a read at
// the deadline; redisstore then says context.DeadlineExceeded): it was
// recorded as a lost store, unreachable, with Redis up, an extra
// "store lost" and "store back" on a loaded machine.
func TestHealthLiveCheckCutShort(t *testing.T) {
	var logs syncBuffer
	h := newHealth(healthOptions{log: slog.New(slog.NewTextHandler(&logs, nil)), policy: "error", store: "redis", live: 5 * time.Millisecond,
		probe: func(ctx context.Context) error {
			dl, _ := ctx.Deadline()
			time.Sleep(time.Until(dl) - time.Millisecond)
			for time.Now().Before(dl) {
			}
			return fmt.Errorf("redisstore: %w", context.DeadlineExceeded)
		}})
	for range 50 {
		h.ready(context.Background())
	}
	if st := h.Status(); !st.Store.Up || countLines(&logs, "store lost") != 0 {
		t.Errorf("50 live checks cut short by their bound: store %+v; want up, nothing learned:\n%s", st.Store, logs.String())
	}
}

// TestFaultServeRedisStoppedAtStart: a Redis stopped (SIGSTOP) before
// `sluice serve` starts accepts its connections and answers nothing: the
// start says so, and the store is lost as stalled in the line, the
// metric and /v1/status, as after the start. Before, no dial was watched
// before the start's check, and the timeout read as unreachable: "Redis
// unreachable at start", cause=unreachable. A killed one is still
// unreachable (TestServerRedisUnreachableAtStart).
func TestFaultServeRedisStoppedAtStart(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	r.Pause(t)
	t.Cleanup(func() { r.Resume(t) })
	p := startSluice(t, nil, "--redis", "redis://"+r.Addr, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "200ms")
	log := p.stderr.String()
	if !strings.Contains(log, "Redis not answering at start") || strings.Contains(log, "Redis unreachable at start") {
		t.Errorf("start with Redis stopped: want it told as not answering, log:\n%s", log)
	}
	if !strings.Contains(log, "cause=stalled") || strings.Contains(log, "cause=unreachable") {
		t.Errorf("start with Redis stopped: want cause=stalled only, log:\n%s", log)
	}
	if _, st := p.getJSON(t, "/v1/status"); st["store"].(map[string]any)["cause"] != "stalled" {
		t.Errorf("status with Redis stopped at start: %v, want the store's cause stalled", st["store"])
	}
	if got := scrapedMetric(t, p, `sluice_store_transitions_total{cause="stalled",to="down"}`); got != "1" {
		t.Errorf(`sluice_store_transitions_total{cause="stalled",to="down"} %q, want 1; metrics:\n%s`, got, metricsBody(t, p))
	}
}

func metricsBody(t *testing.T, p *proc) string {
	t.Helper()
	_, body := p.get(t, "/metrics")
	return grepLines(body, "sluice_store")
}
