package redisstore_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testcert"
	"github.com/sluicehq/sluice/redisstore"
)

func checkCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func newClient(t *testing.T, o *redis.Options) *redis.Client {
	o.MaxRetries = -1
	c := redis.NewClient(o)
	t.Cleanup(func() { c.Close() })
	return c
}

// wantKind checks err's kind, that it is (or is not) permanent, and that
// its message names the cause in one line.
func wantKind(t *testing.T, err, kind error, words string) {
	t.Helper()
	if !errors.Is(err, kind) {
		t.Fatalf("Check = %v, want %v", err, kind)
	}
	transient := kind == redisstore.ErrUnreachable || kind == redisstore.ErrStalled || kind == redisstore.ErrMaxClients
	if got, want := errors.Is(err, redisstore.ErrMisconfigured), !transient; got != want {
		t.Errorf("errors.Is(%v, ErrMisconfigured) = %v, want %v", err, got, want)
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "redisstore: ") || strings.Contains(msg, "\n") || !strings.Contains(msg, words) {
		t.Errorf("message %q: want one line starting redisstore: and naming %q", msg, words)
	}
}

func TestCheckHealthy(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServerOptions(t, &redistest.ServerOptions{Args: []string{"--appendonly", "yes"}})
	rep, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: srv.Addr}))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Cluster || len(rep.Warnings) != 0 || !strings.HasPrefix(rep.Version, "7.") && !strings.HasPrefix(rep.Version, "8.") {
		t.Errorf("report %+v: want a standalone server of 7.0 or later without warnings", rep)
	}
}

// TestCheckPersistenceWarning: a server without appendonly loses decisions
// when it restarts; Check says so, naming the node and the setting, as a
// warning that does not refuse the start.
func TestCheckPersistenceWarning(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t) // --appendonly no
	rep, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: srv.Addr}))
	if err != nil {
		t.Fatalf("Check = %v: a server without appendonly warns, it does not refuse", err)
	}
	if len(rep.Warnings) != 1 || !errors.Is(rep.Warnings[0], redisstore.ErrNoPersistence) || errors.Is(rep.Warnings[0], redisstore.ErrMisconfigured) {
		t.Fatalf("warnings %v, want one ErrNoPersistence", rep.Warnings)
	}
	if msg := rep.Warnings[0].Error(); !strings.Contains(msg, "node "+srv.Addr+": appendonly no,") || !strings.Contains(msg, "appendonly yes") {
		t.Errorf("warning %q: want the node, the setting and the fix", msg)
	}
}

// others drops ErrNoPersistence from ws: the test servers run without
// appendonly.
func others(ws []error) []error {
	var out []error
	for _, w := range ws {
		if !errors.Is(w, redisstore.ErrNoPersistence) {
			out = append(out, w)
		}
	}
	return out
}

func TestCheckAuthentication(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServerOptions(t, &redistest.ServerOptions{Args: []string{"--requirepass", "secret"}})
	for _, tc := range []struct {
		name, user, password string
	}{
		{"WRONGPASS", "", "wrong"},
		{"NOAUTH", "", ""},
		{"unknown user", "nobody", "secret"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: srv.Addr, Username: tc.user, Password: tc.password}))
			wantKind(t, err, redisstore.ErrAuth, "password")
		})
	}
	t.Run("right password", func(t *testing.T) {
		if _, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: srv.Addr, Password: "secret"})); err != nil {
			t.Fatal(err)
		}
	})
}

func TestCheckDatabaseOutOfRange(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: srv.Addr, DB: 99}))
	wantKind(t, err, redisstore.ErrDatabase, "database")
}

func TestCheckTLS(t *testing.T) {
	t.Parallel()
	certs := testcert.New(t, "redis")
	other := testcert.New(t, "other")
	tlsSrv := redistest.StartServerOptions(t, &redistest.ServerOptions{TLS: true, Args: []string{
		"--tls-cert-file", certs.CertFile, "--tls-key-file", certs.KeyFile, "--tls-ca-cert-file", certs.CAFile,
	}})
	plain := redistest.StartServer(t)
	t.Run("trusted", func(t *testing.T) {
		if _, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: tlsSrv.Addr, TLSConfig: certs.ClientConfig(t)})); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("untrusted server certificate", func(t *testing.T) {
		cfg := certs.ClientConfig(t)
		cfg.RootCAs = other.Pool
		_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: tlsSrv.Addr, TLSConfig: cfg}))
		wantKind(t, err, redisstore.ErrTLS, "certificate")
	})
	t.Run("no client certificate", func(t *testing.T) {
		_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: tlsSrv.Addr, TLSConfig: &tls.Config{RootCAs: certs.Pool}}))
		wantKind(t, err, redisstore.ErrTLS, "TLS")
	})
	t.Run("TLS against a plaintext server", func(t *testing.T) {
		_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: plain.Addr, TLSConfig: certs.ClientConfig(t)}))
		wantKind(t, err, redisstore.ErrTLS, "does not speak TLS")
	})
	t.Run("plaintext against a TLS server", func(t *testing.T) {
		_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: tlsSrv.Addr}))
		wantKind(t, err, redisstore.ErrTLS, "rediss://")
	})
}

func TestCheckSentinelUnknownMaster(t *testing.T) {
	t.Parallel()
	master := redistest.StartServer(t)
	sentinel := redistest.StartServerOptions(t, &redistest.ServerOptions{Sentinel: true, Args: []string{
		"sentinel monitor known " + strings.Replace(master.Addr, ":", " ", 1) + " 1",
	}})
	failover := func(name string) *redis.Client {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: name, SentinelAddrs: []string{sentinel.Addr}, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		return c
	}
	_, err := redisstore.Check(checkCtx(t), failover("typo"))
	wantKind(t, err, redisstore.ErrSentinelMaster, "master_name")
	if _, err := redisstore.Check(checkCtx(t), failover("known")); err != nil {
		t.Fatal(err)
	}
}

func TestCheckPermission(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	admin := newClient(t, &redis.Options{Addr: srv.Addr})
	ctx := checkCtx(t)
	for _, rules := range [][]any{
		{"limited", "on", ">pw", "~*", "+ping", "+info", "+script|load"}, // no evalsha
		{"noscript", "on", ">pw", "~*", "+ping", "+info", "+evalsha"},    // no script load
		// Scripts, but not the clock every sluice script reads: Redis
		// checks the commands inside a script against the user too.
		{"notime", "on", ">pw", "~*", "+ping", "+info", "+evalsha", "+eval", "+script|load"},
	} {
		if err := admin.Do(ctx, append([]any{"acl", "setuser"}, rules...)...).Err(); err != nil {
			t.Fatal(err)
		}
		t.Run(rules[0].(string), func(t *testing.T) {
			_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: srv.Addr, Username: rules[0].(string), Password: "pw"}))
			wantKind(t, err, redisstore.ErrPermission, "grant")
		})
	}
	t.Run("enough", func(t *testing.T) {
		if err := admin.Do(ctx, "acl", "setuser", "enough", "on", ">pw", "~*", "+ping", "+info", "+evalsha", "+eval", "+script|load", "+time").Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: srv.Addr, Username: "enough", Password: "pw"})); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("INFO denied is a warning", func(t *testing.T) {
		if err := admin.Do(ctx, "acl", "setuser", "noinfo", "on", ">pw", "~*", "+ping", "+evalsha", "+eval", "+script|load", "+time").Err(); err != nil {
			t.Fatal(err)
		}
		rep, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: srv.Addr, Username: "noinfo", Password: "pw"}))
		if err != nil {
			t.Fatal(err)
		}
		if ws := others(rep.Warnings); len(ws) != 1 || !errors.Is(ws[0], redisstore.ErrPermission) {
			t.Errorf("warnings %v, want one ErrPermission", rep.Warnings)
		}
	})
}

func TestCheckTopology(t *testing.T) {
	t.Parallel()
	node := redistest.StartServerOptions(t, &redistest.ServerOptions{Cluster: true})
	standalone := redistest.StartServer(t)
	t.Run("standalone client on a Cluster node", func(t *testing.T) {
		_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: node.Addr}))
		wantKind(t, err, redisstore.ErrTopology, "redis+cluster://")
	})
	t.Run("standalone client on a replica", func(t *testing.T) {
		replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strings.Split(standalone.Addr, ":")[1])
		_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: replica.Addr}))
		wantKind(t, err, redisstore.ErrTopology, "a replica, read-only: it refuses every write")
		if got := redisstore.Classify(errors.New("READONLY You can't write against a read only replica.")); !errors.Is(got, redisstore.ErrTopology) {
			t.Errorf("Classify(READONLY) = %v, want ErrTopology", got)
		}
	})
	t.Run("standalone client on a writable replica", func(t *testing.T) {
		replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strings.Split(standalone.Addr, ":")[1], "--replica-read-only", "no")
		_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: replica.Addr}))
		wantKind(t, err, redisstore.ErrTopology, "a replica that accepts writes (replica-read-only no)")
		if strings.Contains(err.Error(), "read-only") && !strings.Contains(err.Error(), "replica-read-only") {
			t.Errorf("a writable replica called read-only: %v", err)
		}
	})
	t.Run("Cluster client on a standalone server", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{standalone.Addr}, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		_, err := redisstore.Check(checkCtx(t), c)
		wantKind(t, err, redisstore.ErrTopology, "redis://")
	})
	// A Sentinel and a data node taken one for the other answer with an
	// unknown command: a configuration to fix, not an outage.
	sentinel := redistest.StartServerOptions(t, &redistest.ServerOptions{Sentinel: true, Args: []string{
		"sentinel monitor m " + strings.Replace(standalone.Addr, ":", " ", 1) + " 1",
	}})
	t.Run("standalone client on a Sentinel", func(t *testing.T) {
		_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: sentinel.Addr}))
		wantKind(t, err, redisstore.ErrTopology, "redis+sentinel://")
	})
	t.Run("Cluster client on a Sentinel", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{sentinel.Addr}, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		_, err := redisstore.Check(checkCtx(t), c)
		wantKind(t, err, redisstore.ErrTopology, "redis+sentinel://")
	})
	// With a data node's credentials, which the Sentinel refuses
	// (WRONGPASS): the address is wrong, not the password.
	t.Run("standalone client with credentials on a Sentinel", func(t *testing.T) {
		_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: sentinel.Addr, Username: "sluice", Password: "pw"}))
		wantKind(t, err, redisstore.ErrTopology, "redis+sentinel://")
	})
	t.Run("Cluster client with credentials on a Sentinel", func(t *testing.T) {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{sentinel.Addr}, Username: "sluice", Password: "pw", MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		_, err := redisstore.Check(checkCtx(t), c)
		wantKind(t, err, redisstore.ErrTopology, "redis+sentinel://")
	})
	t.Run("wrong password on a data node", func(t *testing.T) {
		_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: standalone.Addr, Username: "sluice", Password: "pw"}))
		wantKind(t, err, redisstore.ErrAuth, "user and password")
	})
	t.Run("Sentinel client on a data node", func(t *testing.T) {
		c := redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{standalone.Addr}, MaxRetries: -1})
		t.Cleanup(func() { c.Close() })
		_, err := redisstore.Check(checkCtx(t), c)
		wantKind(t, err, redisstore.ErrTopology, "not a Sentinel: use redis://")
	})
	t.Run("standalone client on a Sentinel, INFO denied", func(t *testing.T) {
		// Without INFO, the script Check loads names the Sentinel.
		err := redisstore.Classify(errors.New("ERR unknown command 'script', with args beginning with: 'load' "))
		wantKind(t, err, redisstore.ErrTopology, "redis+sentinel://")
	})
}

// TestClassifyDecisionTopology: a decision's error carries the Store's
// context before Redis's reply ("redisstore: gcra take: READONLY ..."),
// and Classify still names the topology: a take, a grant and an atomic
// TakeAll on a master turned replica (READONLY), a take on a Cluster node
// through a standalone client (MOVED).
func TestClassifyDecisionTopology(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	master := redistest.StartServer(t)
	node := redistest.StartServer(t)
	s := redisstore.New(newClient(t, &redis.Options{Addr: node.Addr}), nil)
	l := sluice.PerMinute(10)
	if _, err := s.Take(ctx, "k", l, 1); err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(master.Addr)
	if err := newClient(t, &redis.Options{Addr: node.Addr}).ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	_, takeErr := s.Take(ctx, "k", l, 1)
	_, grantErr := s.Grant(ctx, "k", l, 2)
	_, allErr := s.TakeAll(ctx, []sluice.Request{{Key: "a", Limit: l, Cost: 1}, {Key: "b", Limit: l, Cost: 1}})
	for _, err := range []error{takeErr, grantErr, allErr} {
		if got := redisstore.Classify(err); !errors.Is(got, redisstore.ErrTopology) || !strings.Contains(got.Error(), "replica") {
			t.Errorf("Classify(%v) = %v, want ErrTopology naming the replica", err, got)
		}
	}

	// A key another node serves: the node answers MOVED.
	addr := redistest.ClusterAddrs(t)[0]
	onNode := redisstore.New(newClient(t, &redis.Options{Addr: addr}), &redisstore.Options{Prefix: redistest.Prefix(t)})
	for i := 0; ; i++ {
		_, err := onNode.Take(ctx, fmt.Sprint("moved-", i), l, 1)
		if err == nil {
			continue // a key of this node's slots
		}
		if got := redisstore.Classify(err); !errors.Is(got, redisstore.ErrTopology) || !strings.Contains(got.Error(), "redis+cluster://") {
			t.Errorf("Classify(%v) = %v, want ErrTopology naming redis+cluster://", err, got)
		}
		break
	}
}

// TestMaxClients: a Redis with maxclients connections open refuses a new
// one as it accepts it ("ERR max number of clients reached"). Through a
// client hooked by DetectRefusals, Check and the decisions that need a new
// connection fail with ErrMaxClients, transient, and Redis's words; once a
// connection closes, both pass.
func TestMaxClients(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	r := redistest.StartServer(t, "--maxclients", "1")
	holder := newClient(t, &redis.Options{Addr: r.Addr})
	if err := holder.Ping(ctx).Err(); err != nil { // the only connection Redis takes
		t.Fatal(err)
	}
	c := newClient(t, &redis.Options{Addr: r.Addr})
	redisstore.DetectRefusals(c)
	_, err := redisstore.Check(checkCtx(t), c)
	wantKind(t, err, redisstore.ErrMaxClients, "ERR max number of clients reached")
	if !strings.Contains(err.Error(), "raise maxclients") {
		t.Errorf("Check = %v: want what to do", err)
	}
	s := redisstore.New(c, nil)
	l := sluice.PerMinute(10)
	_, takeErr := s.Take(ctx, "k", l, 1)
	_, grantErr := s.Grant(ctx, "k", l, 2)
	for _, err := range []error{takeErr, grantErr} {
		if got := redisstore.Classify(err); !errors.Is(got, redisstore.ErrMaxClients) || !strings.Contains(got.Error(), "ERR max number of clients reached") {
			t.Errorf("Classify(%v) = %v, want ErrMaxClients with Redis's words", err, got)
		}
	}
	holder.Close()
	var checkErr error
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, checkErr = redisstore.Check(checkCtx(t), c); checkErr == nil {
			break
		}
	}
	if checkErr != nil {
		t.Fatalf("Check after the other connection closed: %v", checkErr)
	}
	if _, err := s.Take(ctx, "k", l, 1); err != nil {
		t.Errorf("take after the other connection closed: %v", err)
	}
}

func TestCheckClusterHealthy(t *testing.T) {
	t.Parallel()
	rep, err := redisstore.Check(checkCtx(t), redistest.ClusterClient(t))
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Cluster {
		t.Errorf("report %+v: want Cluster", rep)
	}
}

func TestCheckEvictionWarning(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServerOptions(t, &redistest.ServerOptions{Args: []string{"--maxmemory", "100mb", "--maxmemory-policy", "allkeys-lru"}})
	rep, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: srv.Addr}))
	if err != nil {
		t.Fatalf("Check = %v: an eviction policy warns, it does not refuse", err)
	}
	ws := others(rep.Warnings)
	if len(ws) != 1 || !errors.Is(ws[0], redisstore.ErrEviction) || errors.Is(ws[0], redisstore.ErrMisconfigured) {
		t.Fatalf("warnings %v, want one ErrEviction", rep.Warnings)
	}
	if msg := ws[0].Error(); !strings.Contains(msg, "allkeys-lru") || !strings.Contains(msg, "noeviction") || !strings.Contains(msg, "node "+srv.Addr) {
		t.Errorf("warning %q: want the node, the policy and the fix", msg)
	}
}

// TestCheckEvictionWarningCluster: on a Cluster the warning names the
// master whose policy may evict, the one to change.
func TestCheckEvictionWarningCluster(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, nil)
	node := cl.MasterOf(t, "k")
	admin := newClient(t, &redis.Options{Addr: node.Addr})
	ctx := checkCtx(t)
	if err := admin.ConfigSet(ctx, "maxmemory", "100mb").Err(); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigSet(ctx, "maxmemory-policy", "volatile-lru").Err(); err != nil {
		t.Fatal(err)
	}
	rep, err := redisstore.Check(ctx, cl.Client(t))
	if err != nil {
		t.Fatal(err)
	}
	if ws := others(rep.Warnings); len(ws) != 1 || !strings.Contains(ws[0].Error(), "node "+node.Addr+": maxmemory-policy volatile-lru") {
		t.Fatalf("warnings %v, want one naming node %s", rep.Warnings, node.Addr)
	}
}

func TestCheckUnreachable(t *testing.T) {
	t.Parallel()
	_, err := redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: redistest.DeadAddr(t), DialTimeout: time.Second}))
	wantKind(t, err, redisstore.ErrUnreachable, "retrying")
}

// TestCheckStalled: a Redis whose writes are paused answers PING and INFO
// but holds every script: Check and CheckAccess call it stalled, which is
// not a misconfiguration, and pass once it resumes. A server that answers
// nothing (stopped) is unreachable, not stalled.
func TestCheckStalled(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	c := newClient(t, &redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true}) // as sluice serve's
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	short := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		t.Cleanup(cancel)
		return ctx
	}
	admin := newClient(t, &redis.Options{Addr: srv.Addr})
	if err := admin.Do(checkCtx(t), "client", "pause", 10000, "write").Err(); err != nil {
		t.Fatal(err)
	}
	_, err := redisstore.Check(short(), c)
	wantKind(t, err, redisstore.ErrStalled, "write did not complete")
	wantKind(t, s.CheckAccess(short()), redisstore.ErrStalled, "write did not complete")
	if err := admin.Do(checkCtx(t), "client", "unpause").Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := redisstore.Check(checkCtx(t), c); err != nil {
		t.Errorf("Check after unpause: %v", err)
	}
	if err := s.CheckAccess(checkCtx(t)); err != nil {
		t.Errorf("CheckAccess after unpause: %v", err)
	}

	srv.Pause(t) // SIGSTOP: no answer at all
	defer srv.Resume(t)
	_, err = redisstore.Check(short(), c)
	wantKind(t, err, redisstore.ErrUnreachable, "retrying")
	wantKind(t, s.CheckAccess(short()), redisstore.ErrUnreachable, "retrying")
}

func TestCheckNilClient(t *testing.T) {
	if _, err := redisstore.Check(context.Background(), nil); !errors.Is(err, redisstore.ErrNoClient) {
		t.Fatalf("Check(nil) = %v, want ErrNoClient", err)
	}
}

func TestClassifyNil(t *testing.T) {
	if err := redisstore.Classify(nil); err != nil {
		t.Fatalf("Classify(nil) = %v", err)
	}
	if err := redisstore.Classify(fmt.Errorf("wrapped: %w", errors.New("WRONGPASS x"))); !errors.Is(err, redisstore.ErrAuth) {
		t.Fatalf("Classify = %v, want ErrAuth", err)
	}
	// Redis 7's words for a command an ACL user may not run inside a script.
	inScript := errors.New("ERR The user executing the script can't run this command or subcommand script: db74a6df, on @user_script:1.")
	if err := redisstore.Classify(inScript); !errors.Is(err, redisstore.ErrPermission) || !errors.Is(err, redisstore.ErrMisconfigured) {
		t.Fatalf("Classify(%v) = %v, want ErrPermission", inScript, err)
	}
	// A Cluster without a master for some slots (a failover under way) is
	// down for now, not a client pointed at the wrong topology.
	down := errors.New("CLUSTERDOWN The cluster is down")
	if err := redisstore.Classify(down); !errors.Is(err, redisstore.ErrUnreachable) || errors.Is(err, redisstore.ErrMisconfigured) {
		t.Fatalf("Classify(%v) = %v, want ErrUnreachable", down, err)
	}
}

// TestCheckAccess: a user that may run scripts but not read and write the
// store's keys is ErrPermission before any decision; one that may is not.
func TestCheckAccess(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	admin := newClient(t, &redis.Options{Addr: srv.Addr})
	ctx := checkCtx(t)
	base := []any{"on", ">pw", "-@all", "+@connection", "+evalsha", "+eval", "+script|load", "+time"}
	for _, tt := range []struct {
		user string
		more []any
		ok   bool
	}{
		{"full", []any{"~sluice:*", "+@read", "+@write"}, true},
		{"otherkeys", []any{"~other:*", "+@read", "+@write"}, false},
		{"readonly", []any{"~sluice:*", "+@read"}, false},
		{"noevalsha", []any{"~sluice:*", "+@read", "+@write", "-evalsha"}, false}, // decisions run EVALSHA
		{"notime", []any{"~sluice:*", "+@read", "+@write", "-time"}, false},       // and TIME inside
	} {
		if err := admin.Do(ctx, append(append([]any{"acl", "setuser", tt.user}, base...), tt.more...)...).Err(); err != nil {
			t.Fatal(err)
		}
		t.Run(tt.user, func(t *testing.T) {
			s := redisstore.New(newClient(t, &redis.Options{Addr: srv.Addr, Username: tt.user, Password: "pw"}), nil)
			err := s.CheckAccess(checkCtx(t))
			if tt.ok && err != nil {
				t.Fatalf("CheckAccess = %v, want nil", err)
			}
			if !tt.ok {
				wantKind(t, err, redisstore.ErrPermission, "grant")
			}
		})
	}
	if err := (&redisstore.Store{}).CheckAccess(ctx); !errors.Is(err, redisstore.ErrNoClient) {
		t.Errorf("zero Store: %v, want ErrNoClient", err)
	}
}

// TestCheckVersion: a real server that reports an older version is
// refused. Only Redis 7 is installed, so a proxy in front of it rewrites
// the version INFO reports (to one of the same length, so the reply's
// framing stays right); everything else is the real server's.
func TestCheckVersion(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t)
	c := newClient(t, &redis.Options{Addr: srv.Addr})
	real, err := c.InfoMap(checkCtx(t), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	v := real["Server"]["redis_version"]
	old := "6." + strings.Repeat("9", len(v)-2) // below 7.0, as long as v
	if len(v) < 3 {
		t.Fatalf("cannot make an old version as long as %q", v)
	}
	addr := rewritingProxy(t, srv.Addr, []byte("redis_version:"+v), []byte("redis_version:"+old))
	_, err = redisstore.Check(checkCtx(t), newClient(t, &redis.Options{Addr: addr}))
	wantKind(t, err, redisstore.ErrVersion, old)
}

// rewritingProxy forwards connections to addr, replacing from with to (of
// the same length) in what the server sends back.
func rewritingProxy(t *testing.T, addr string, from, to []byte) string {
	t.Helper()
	ln := redistest.Listen(t)
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", addr)
			if err != nil {
				in.Close()
				continue
			}
			go func() { io.Copy(out, in); out.Close() }()
			go func() {
				defer in.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := out.Read(buf)
					if n > 0 {
						if _, werr := in.Write(bytes.ReplaceAll(buf[:n], from, to)); werr != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// TestCheckAccessOutOfMemory: a Redis over maxmemory under noeviction
// answers reads and refuses takes (OOM): CheckAccess, which writes, says
// so as ErrOOM, not a misconfiguration, and so does a take's error.
func TestCheckAccessOutOfMemory(t *testing.T) {
	t.Parallel()
	srv := redistest.StartServer(t, "--maxmemory", "1", "--maxmemory-policy", "noeviction")
	c := newClient(t, &redis.Options{Addr: srv.Addr})
	ctx := checkCtx(t)
	s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
	err := s.CheckAccess(ctx)
	if !errors.Is(err, redisstore.ErrOOM) || errors.Is(err, redisstore.ErrMisconfigured) || !strings.Contains(err.Error(), "raise maxmemory") {
		t.Fatalf("CheckAccess = %v, want ErrOOM, not misconfigured, saying what to do", err)
	}
	_, err = s.Take(ctx, "k", sluice.PerSecond(10), 1)
	if err := redisstore.Classify(err); !errors.Is(err, redisstore.ErrOOM) {
		t.Errorf("Classify(a take's error) = %v, want ErrOOM", err)
	}
	// Every algorithm's take is refused whole, before any write: a script
	// whose first write cannot grow memory (a window's DEL) went on, under
	// OOM, to create keys past maxmemory.
	before, err := c.DBSize(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range sluice.Algorithms() {
		l := sluice.PerSecond(10).WithAlgorithm(a)
		if _, err := s.Take(ctx, "oom-"+a.String(), l, 1); !errors.Is(redisstore.Classify(err), redisstore.ErrOOM) {
			t.Errorf("%v take under OOM: %v, want ErrOOM", a, err)
		}
		if a != sluice.SlidingWindowLog {
			if _, err := s.Grant(ctx, "oom-grant-"+a.String(), l, 5); !errors.Is(redisstore.Classify(err), redisstore.ErrOOM) {
				t.Errorf("%v grant under OOM: %v, want ErrOOM", a, err)
			}
		}
	}
	if _, err := s.TakeAll(ctx, []sluice.Request{{Key: "oom-a", Limit: sluice.PerSecond(1), Cost: 1}, {Key: "oom-b", Limit: sluice.PerSecond(1), Cost: 1}}); !errors.Is(redisstore.Classify(err), redisstore.ErrOOM) {
		t.Errorf("TakeAll under OOM: %v, want ErrOOM", err)
	}
	if after, err := c.DBSize(ctx).Result(); err != nil || after != before {
		t.Errorf("keys under OOM: %d before, %d after (%v); want none made", before, after, err)
	}
	if err := c.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckAccess(ctx); err != nil {
		t.Errorf("CheckAccess with memory to spare: %v", err)
	}
}

// A master shutting down holds writes while its replicas catch up, and
// answers PING and INFO meanwhile: a stall, named as the shutdown (INFO's
// shutdown_in_milliseconds), not as CLIENT PAUSE or a long script.
func TestCheckShuttingDown(t *testing.T) {
	t.Parallel()
	master := redistest.StartServer(t, "--repl-diskless-sync-delay", "0") // the replica online at once
	replica := redistest.StartServer(t, "--replicaof", "127.0.0.1", strings.Split(master.Addr, ":")[1])
	admin := newClient(t, &redis.Options{Addr: master.Addr})
	ctx := context.Background()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, _ := admin.Info(ctx, "replication").Result()
		if strings.Contains(info, "state=online") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica never came online:\n%s", info)
		}
	}
	if err := admin.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	replica.Pause(t) // its acknowledgement never comes
	t.Cleanup(func() { replica.Resume(t) })
	go admin.Shutdown(context.Background()) // answers when it stops
	c := newClient(t, &redis.Options{Addr: master.Addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, _ := c.Info(ctx, "server").Result()
		if strings.Contains(info, "shutdown_in_milliseconds") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the master never said it was shutting down")
		}
	}
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	_, err := redisstore.Check(short, c)
	wantKind(t, err, redisstore.ErrStalled, "shutting down")
	if strings.Contains(err.Error(), "CLIENT PAUSE") {
		t.Errorf("message %q: a shutdown named as something else", err)
	}
	// The access check, which the service runs every second, too.
	short, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	err = redisstore.New(c, nil).CheckAccess(short)
	wantKind(t, err, redisstore.ErrStalled, "shutting down")
}

// A take the replicas did not acknowledge in time is named so, not "Redis
// unreachable": Redis answered.
func TestClassifyNotReplicated(t *testing.T) {
	err := redisstore.Classify(fmt.Errorf("%w: 0 of 1 replicas acknowledged within 20 ms", redisstore.ErrNotReplicated))
	if !errors.Is(err, redisstore.ErrNotReplicated) || errors.Is(err, redisstore.ErrUnreachable) || errors.Is(err, redisstore.ErrMisconfigured) {
		t.Fatalf("Classify = %v: want ErrNotReplicated, transient", err)
	}
	if msg := err.Error(); strings.Contains(msg, "unreachable") || !strings.Contains(msg, "wait_replicas") {
		t.Errorf("message %q: want the replicas named, not Redis unreachable", msg)
	}
}
