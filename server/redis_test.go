package server

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestRLSExactUnderConcurrencyRedis: many goroutines send two-descriptor
// requests over gRPC to services sharing one Redis (standalone, then the
// cluster, where the two keys sit in different slots). Exactly the
// smaller limit is admitted, and the larger one loses nothing to the
// denied requests.
func TestRLSExactUnderConcurrencyRedis(t *testing.T) {
	const cfg = `
domain: conc
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 50, algorithm: sliding_window_log}
  - key: tenant
    rate_limit: {unit: hour, requests_per_unit: 80, algorithm: sliding_window_log}
`
	// Besides the shared deployments, what --redis redis+sentinel://...
	// opens: the master found through a live Sentinel.
	sentinel := redistest.Deployment{Name: "sentinel", Client: func(t testing.TB) redis.UniversalClient {
		c, err := NewRedisClient("redis+sentinel://" + redistest.SentinelAddr(t) + "?master_name=" + redistest.SentinelMaster)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}}
	for _, tt := range append(redistest.Deployments(), sentinel) {
		t.Run(tt.Name, func(t *testing.T) {
			client := tt.Client(t)
			prefix := redistest.Prefix(t)
			// Two service instances, as two replicas behind Envoy would be.
			var clients []rlsv3.RateLimitServiceClient
			for range 2 {
				store := redisstore.New(client, &redisstore.Options{Prefix: prefix})
				clients = append(clients, serveRLS(t, NewService(store, mustConfig(t, cfg), nil)))
			}
			var allowed atomic.Int64
			var wg sync.WaitGroup
			for g := range 32 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					c := clients[g%len(clients)]
					for range 5 {
						resp, err := c.ShouldRateLimit(context.Background(), rlsRequest("conc", desc("user=u1"), desc("tenant=t1")))
						if err != nil {
							t.Error(err)
							return
						}
						if resp.OverallCode == rlsv3.RateLimitResponse_OK {
							allowed.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if got := allowed.Load(); got != 50 {
				t.Errorf("%d of 160 admitted, want exactly 50", got)
			}
			// The tenant limit was charged only for admitted requests.
			var tenant atomic.Int64
			for g := range 16 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 4 {
						resp, err := clients[g%2].ShouldRateLimit(context.Background(), rlsRequest("conc", desc("tenant=t1")))
						if err == nil && resp.OverallCode == rlsv3.RateLimitResponse_OK {
							tenant.Add(1)
						}
					}
				}()
			}
			wg.Wait()
			if got := tenant.Load(); got != 30 {
				t.Errorf("tenant alone: %d of 64 admitted, want the 30 left", got)
			}
			if tt.Name == "sentinel" { // the state is on the master Sentinel named
				n, err := redistest.Client(t).Keys(context.Background(), prefix+"*").Result()
				if err != nil || len(n) == 0 {
					t.Errorf("no keys under %q on the standalone server behind the Sentinel: %v", prefix, err)
				}
			}
		})
	}
}

// TestServerOnRedis runs the service through --redis: readiness pings
// Redis, decisions are shared, and a dead Redis is handled by the failure
// policy (local fallback) or reported (error).
func TestServerOnRedis(t *testing.T) {
	r := redistest.StartServer(t)
	for _, tt := range []struct {
		policy     string
		downStatus int // /v1/check while Redis is down
		downReady  int // /readyz while Redis is down: the failure policy answers
	}{
		{"local", 200, 200},
		{"error", 503, 503},
	} {
		t.Run(tt.policy, func(t *testing.T) {
			fp, ok, err := ParseFailurePolicy(tt.policy)
			if err != nil {
				t.Fatal(err)
			}
			srv := runServer(t, Options{
				ConfigFile: "testdata/envoy-example.yaml", RedisURL: "redis://" + r.Addr + "/0",
				FailurePolicy: fp, NoFailurePolicy: !ok,
			})
			p := &proc{http: srv.HTTPAddr()}
			if code, _ := p.get(t, "/readyz"); code != 200 {
				t.Errorf("readyz with Redis up: %d", code)
			}
			if code, _ := p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=`+tt.policy+`"}`); code != 200 {
				t.Errorf("check: %d", code)
			}
			// A stalled Redis (writes paused: scripts wait) costs a decision
			// the decision timeout, with or without a failure policy.
			pause := redis.NewClient(&redis.Options{Addr: r.Addr})
			if err := pause.Do(context.Background(), "CLIENT", "PAUSE", 1000, "WRITE").Err(); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			code, _ := p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=`+tt.policy+`-stalled"}`)
			if took := time.Since(start); code != tt.downStatus || took > 800*time.Millisecond {
				t.Errorf("check with Redis stalled: %d after %v, want %d well within the 1s pause", code, took, tt.downStatus)
			}
			time.Sleep(time.Until(start.Add(1100 * time.Millisecond)))
			pause.Close()
			r.Stop()
			defer r.Start(t)
			// A request's own check waits only the decision timeout, less
			// than the client's retries of a refused dial: the watch tells.
			for deadline := time.Now().Add(3 * time.Second); ; time.Sleep(50 * time.Millisecond) {
				code, _ := p.get(t, "/readyz")
				if code == tt.downReady {
					break
				}
				if time.Now().After(deadline) {
					t.Errorf("readyz with Redis down: %d for 3s, want %d", code, tt.downReady)
					break
				}
			}
			if code, body := p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=`+tt.policy+`"}`); code != tt.downStatus {
				t.Errorf("check with Redis down: %d %v, want %d", code, body, tt.downStatus)
			}
		})
	}
}

func TestNewRedisClient(t *testing.T) {
	tests := []struct {
		url  string
		kind string // standalone, cluster, failover, or an error substring
	}{
		{"redis://localhost:6379/0", "standalone"},
		{"rediss://user:pw@localhost:6380", "standalone"},
		{"redis+cluster://localhost:7000?addr=localhost:7001&addr=localhost:7002", "cluster"},
		{"redis://localhost:7000?addr=localhost:7001", "use redis+cluster://"},
		{"redis+cluster://?addr=localhost:7001", "no host"},
		{"redis://", "no host"},
		{"redis+cluster://127.0.0.1:7001,127.0.0.1:7002", "is a list: name one host:port, and the others with redis+cluster://127.0.0.1:7001?addr="},
		// A list on redis:// must not point at addr=, which redis:// refuses.
		{"redis://h1:1,h2:2", `host "h1:1,h2:2" is a list: a redis:// URL names one Redis; for Redis Cluster use redis+cluster://h1:1?addr=h2:2, for Sentinel redis+sentinel://`},
		{"rediss://h1:1,h2:2", "for Redis Cluster use rediss+cluster://h1:1?addr=h2:2"},
		{"redis+sentinel://s1:1,s2:2?master_name=m", "redis+sentinel://s1:1?addr=s2:2"},
		{"redis://localhost?pool_size=-5", `pool_size="-5"`},
		{"redis+cluster://localhost?pool_size=99999999999", `pool_size="99999999999"`},
		{"redis://localhost?max_retries=-2", `max_retries="-2": want a whole number from 0 to 1048576 (or -1 for none)`},
		{"redis://localhost?max_retries=-1", "standalone"},
		{"redis+cluster://localhost:7000?pipeline_pool_size=-1", "cluster"},
		{"redis://localhost?pipeline_pool_size=-2", `pipeline_pool_size="-2"`},
		{"redis://localhost?dial_timeout=-1s", `dial_timeout="-1s"`},
		{"redis://localhost?read_timeout=0", `read_timeout="0"`},
		{"redis+sentinel://localhost?master_name=m&conn_max_idle_time=-1", `conn_max_idle_time="-1"`},
		{"redis://localhost?dial_timeout=2", "standalone"},
		{"redis://localhost?client_name=a%0Ab", `client_name="a\nb"`},
		{"redis://localhost?client_name=a%20b", `client_name="a b"`},
		{"redis://localhost?client_name=sluice-1", "standalone"},
		{"rediss+cluster://u:p@localhost:7000", "cluster"},
		{"redis+sentinel://localhost:26379?master_name=mymaster&addr=localhost:26380", "failover"},
		{"redis://localhost:26379?master_name=mymaster", "failover"},
		{"redis+sentinel://localhost:26379", "needs master_name"},
		{"http://localhost", "scheme"},
		{"redis+ring://localhost", "scheme"},
		{"redis://:topsecret@localhost:6379?bogus_option=1", "bogus_option"},
		{"redis://:s3cr%zzet@localhost:6379", "invalid URL escape"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			c, err := NewRedisClient(tt.url)
			if err != nil {
				if !errors.Is(err, ErrRedisURL) || !strings.Contains(err.Error(), tt.kind) {
					t.Fatalf("err = %v, want ErrRedisURL about %q", err, tt.kind)
				}
				if u, _ := url.Parse(tt.url); u != nil && u.User != nil {
					if pw, _ := u.User.Password(); strings.Contains(err.Error(), pw) {
						t.Errorf("error leaks the password: %v", err)
					}
				}
				if strings.Contains(err.Error(), "s3cr") { // a URL too broken to parse
					t.Errorf("error leaks the password: %v", err)
				}
				return
			}
			defer c.Close()
			var kind string
			var ctxTimeout bool // health's probe relies on it too: its Ping ends with its context
			switch rc := c.(type) {
			case *redis.Client:
				kind = "standalone"
				if strings.Contains(tt.url, "master_name") {
					kind = "failover" // NewFailoverClient returns a *redis.Client too
				}
				ctxTimeout = rc.Options().ContextTimeoutEnabled
			case *redis.ClusterClient:
				kind = "cluster"
				ctxTimeout = rc.Options().ContextTimeoutEnabled
			}
			if !ctxTimeout {
				t.Error("ContextTimeoutEnabled off: the failure policy's timeout would not stop calls")
			}
			if kind != tt.kind {
				t.Errorf("%T, want %s", c, tt.kind)
			}
		})
	}
}

func TestParseFailurePolicy(t *testing.T) {
	for in, want := range map[string]string{"": "local", "local": "local", "fallback": "local", "open": "open", "fail-closed": "closed", "error": "none"} {
		p, ok, err := ParseFailurePolicy(in)
		got := "none"
		if ok {
			got = p.String()
		}
		if err != nil || got != want {
			t.Errorf("ParseFailurePolicy(%q) = %v, %v, %v; want %s", in, p, ok, err, want)
		}
	}
	if _, _, err := ParseFailurePolicy("sometimes"); err == nil {
		t.Error("no error for an unknown policy")
	}
}

// TestServerWaitReplicas: --redis's wait_replicas makes every take wait for
// that many replicas (Redis WAIT). A standalone server has none, so under
// the error policy a take fails (503) once wait_timeout passes; the
// parameters never reach go-redis, which would refuse them.
func TestServerWaitReplicas(t *testing.T) {
	r := redistest.StartServer(t)
	srv := runServer(t, Options{
		ConfigFile: "testdata/envoy-example.yaml", RedisURL: "redis://" + r.Addr + "/0?wait_replicas=1&wait_timeout=10ms",
		NoFailurePolicy: true, DecisionTimeout: time.Second,
	})
	p := &proc{http: srv.HTTPAddr()}
	if code, body := p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=wait"}`); code != 503 {
		t.Errorf("check with a replica to wait for and none: %d %v, want 503", code, body)
	}
}

func TestStoreURLOptions(t *testing.T) {
	for _, tt := range []struct {
		in, out  string
		replicas int
		timeout  time.Duration
		bad      bool
	}{
		{in: "redis://h:1/0", out: "redis://h:1/0"},
		{in: "redis://h:1/0?wait_replicas=2&wait_timeout=50ms&pool_size=5", out: "redis://h:1/0?pool_size=5", replicas: 2, timeout: 50 * time.Millisecond},
		{in: "redis+cluster://h:1?addr=h:2&wait_replicas=1", out: "redis+cluster://h:1?addr=h%3A2", replicas: 1},
		{in: "redis://h:1?wait_replicas=-1", bad: true},
		{in: "redis://h:1?wait_replicas=two", bad: true},
		{in: "redis://h:1?wait_timeout=0s", bad: true},
	} {
		out, o, err := storeURLOptions(tt.in)
		if tt.bad {
			if !errors.Is(err, ErrRedisURL) {
				t.Errorf("%s: err %v, want ErrRedisURL", tt.in, err)
			}
			continue
		}
		if err != nil || out != tt.out || o.WaitReplicas != tt.replicas || o.WaitTimeout != tt.timeout {
			t.Errorf("%s: %q %d %v %v, want %q %d %v", tt.in, out, o.WaitReplicas, o.WaitTimeout, err, tt.out, tt.replicas, tt.timeout)
		}
	}
}

// leaseConfig leases the hot policy and keeps the login policy exact;
// lease is the hot policy's lease line. The tests lease for 500ms, long
// beside a grant's round trip on a busy machine: a grant that comes back
// after D cannot be spent.
func leaseConfig(lease string) string {
	return `
domain: edge
policies:
  - name: hot
    limit: 1000/s
    key: "{user}"
` + lease + `
  - name: login
    limit: sliding_window_log 1000/h
    key: "{ip}"
`
}

// TestLeasesRedis: a service on a real Redis, behind the local failure
// policy and without one, answers most decisions of a leased policy from
// its lease, over the JSON API and Envoy's RLS alike, while the exact
// policy asks Redis every time; a reload that drops the lease takes effect
// once the lease in hand has lived its 500ms; Shutdown gives the leases
// back.
func TestLeasesRedis(t *testing.T) {
	for _, policy := range []string{"local", "error"} {
		t.Run(policy, func(t *testing.T) { testLeasesRedis(t, policy) })
	}
}

func testLeasesRedis(t *testing.T, policy string) {
	rs := redistest.StartServer(t)
	file := writeConfig(t, leaseConfig("    lease: 500ms"))
	fp, ok, err := ParseFailurePolicy(policy)
	if err != nil {
		t.Fatal(err)
	}
	// A generous timeout: a busy machine must not hand a decision to the
	// failure policy, whose answers Redis would not count.
	srv := runServer(t, Options{ConfigFile: file, RedisURL: "redis://" + rs.Addr, FailurePolicy: fp, NoFailurePolicy: !ok, WatchInterval: -1, DecisionTimeout: 5 * time.Second})
	svc := srv.Service()
	p := &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}
	rls := dialRLS(t, p.grpc)

	const n = 100
	var fromLease int // JSON answers whose source is "lease"
	transports := []struct {
		name   string
		decide func(policy, entry string)
	}{
		{"json", func(policy, entry string) {
			code, body := p.post(t, "/v1/check", fmt.Sprintf(`{"policy":%q,"key":%q}`, policy, strings.SplitN(entry, "=", 2)[1]))
			if code != 200 {
				t.Fatalf("check %s %s: %d %v", policy, entry, code, body)
			}
			if body["source"] == "lease" {
				fromLease++
			}
		}},
		{"rls", func(_, entry string) {
			if r := call(t, rls, rlsRequest("edge", desc(entry))); r.OverallCode != rlsv3.RateLimitResponse_OK {
				t.Fatalf("RLS %s: %v", entry, render(r))
			}
		}},
	}
	for _, tr := range transports {
		before := svc.LeaseStats()
		for range n {
			tr.decide("hot", "user=u-"+tr.name)
		}
		hot := svc.LeaseStats()
		t.Logf("%s: %d hot decisions: %d local, %d grants", tr.name, n, hot.Local-before.Local, hot.Grants-before.Grants)
		local := hot.Local - before.Local
		if local < n/2 {
			t.Errorf("%s: %d of %d hot decisions answered locally, want most (%+v)", tr.name, local, n, hot)
		}
		if tr.name == "json" && uint64(fromLease) != local {
			t.Errorf("%d JSON answers say source lease, want %d", fromLease, local)
		}
		for range n {
			tr.decide("login", "ip=1.2.3."+tr.name)
		}
		if st := svc.LeaseStats(); st.Local != hot.Local || st.Grants != hot.Grants || tr.name == "json" && uint64(fromLease) != local {
			t.Errorf("%s: exact decisions touched the leases: %+v, then %+v", tr.name, hot, st)
		}
		// The exact policy's state in Redis counts every decision.
		res, err := svc.Peek(context.Background(), "login", "1.2.3."+tr.name, 1)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := res.Decision.Remaining, int64(1000-n); got != want {
			t.Errorf("%s: login has %d left in Redis, want %d", tr.name, got, want)
		}
	}

	// The metrics are the lease store's counters. The gauges are read live:
	// a lease may end (or be swept) between two reads on a slow machine, so
	// each is checked against the store's figures before and after.
	st := svc.LeaseStats()
	got := map[string]float64{}
	for _, name := range []string{"sluice_lease_local_decisions_total", "sluice_lease_grants_total", "sluice_lease_units_granted_total",
		"sluice_lease_units_returned_total", "sluice_lease_units_lost_total", "sluice_lease_units_forfeited_total", "sluice_lease_keys", "sluice_lease_keys_leased"} {
		got[name] = metricValue(t, srv.Metrics().Registry(), name, nil)
	}
	after := svc.LeaseStats()
	for name, want := range map[string][2]uint64{
		"sluice_lease_local_decisions_total": {st.Local, after.Local},
		"sluice_lease_grants_total":          {st.Grants, after.Grants},
		"sluice_lease_units_granted_total":   {st.Granted, after.Granted},
		"sluice_lease_units_returned_total":  {st.Returned, after.Returned},
		"sluice_lease_units_lost_total":      {st.Lost, after.Lost},
		"sluice_lease_units_forfeited_total": {st.Forfeited, after.Forfeited},
		"sluice_lease_keys":                  {uint64(st.Keys), uint64(after.Keys)},
		"sluice_lease_keys_leased":           {uint64(st.Leased), uint64(after.Leased)},
	} {
		lo, hi := min(want[0], want[1]), max(want[0], want[1])
		if g := got[name]; g < float64(lo) || g > float64(hi) {
			t.Errorf("%s = %v, want %d (%d after)", name, g, want[0], want[1])
		}
	}

	// A request that checks both policies at once goes through the lease
	// store's TakeAll: the exact one is taken in Redis, once.
	for range 3 {
		if r := call(t, rls, rlsRequest("edge", desc("user=u-both"), desc("ip=9.9.9.9"))); r.OverallCode != rlsv3.RateLimitResponse_OK {
			t.Fatalf("RLS with both policies: %v", render(r))
		}
	}
	if res, err := svc.Peek(context.Background(), "login", "9.9.9.9", 1); err != nil || res.Decision.Remaining != 997 {
		t.Errorf("login after 3 layered requests: %+v, %v; want 997 left", res.Decision, err)
	}

	// Without the lease, decisions go to Redis once the lease in hand has
	// expired.
	if err := os.WriteFile(file, []byte(leaseConfig("")), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(600 * time.Millisecond)
	before := svc.LeaseStats()
	for range 10 {
		transports[0].decide("hot", "user=u-json")
	}
	if st := svc.LeaseStats(); st.Local != before.Local || st.Grants != before.Grants {
		t.Errorf("after the reload dropped the lease: %+v, then %+v", before, st)
	}

	if err := srv.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := svc.LeaseStats(); st.Keys != 0 {
		t.Errorf("after Shutdown the service still holds %d keys' leases", st.Keys)
	}
}

// TestLeasesReturnedAtShutdown: the units a fixed-window lease did not
// spend go back into the window at Shutdown, so Redis then counts exactly
// the decisions made.
func TestLeasesReturnedAtShutdown(t *testing.T) {
	t.Run("drained", func(t *testing.T) { testLeasesReturnedAtShutdown(t, context.Background()) })
	// A drain cut short by its deadline still returns them; only a
	// canceled context (a second signal) leaves them to expire.
	past, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	t.Run("deadline passed", func(t *testing.T) { testLeasesReturnedAtShutdown(t, past) })
}

func testLeasesReturnedAtShutdown(t *testing.T, ctx context.Context) {
	rs := redistest.StartServer(t)
	file := writeConfig(t, "policies:\n  - name: hot\n    limit: fixed_window 1000/h\n    lease: 1s\n")
	opts := Options{ConfigFile: file, RedisURL: "redis://" + rs.Addr, WatchInterval: -1, DecisionTimeout: 5 * time.Second}
	start := time.Now()
	srv := runServer(t, opts)
	const n = 20
	for range n {
		if res, err := srv.Service().Check(context.Background(), "hot", "k", 0); err != nil || !res.Allowed {
			t.Fatalf("Check = %+v, %v", res, err)
		}
	}
	st := srv.Service().LeaseStats()
	if st.Granted <= n-st.Local {
		t.Fatalf("no unit left in a lease to return: %+v", st)
	}
	if err := srv.Shutdown(ctx); err != nil && ctx.Err() == nil {
		t.Fatal(err)
	}
	if start.Truncate(time.Hour) != time.Now().Truncate(time.Hour) {
		t.Skip("the hour's window ended during the test")
	}
	res, err := runServer(t, opts).Service().Peek(context.Background(), "hot", "k", 1)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.Decision.Remaining, int64(1000-n); got != want {
		t.Errorf("after Shutdown Redis has %d left, want %d (granted %d, local %d, returned %d)", got, want, st.Granted, st.Local, srv.Service().LeaseStats().Returned)
	}
}

// TestSentinelURLCredentials: a Sentinel URL's user and password are
// Redis's, as in every other form of --redis; the Sentinels' own come from
// sentinel_username= and sentinel_password=.
func TestSentinelURLCredentials(t *testing.T) {
	for _, tt := range []struct {
		url                          string
		user, pass, sentUser, sentPW string
		err                          string
	}{
		{url: "redis://app:pw@s1:26379?master_name=m", user: "app", pass: "pw"},
		{url: "redis://:pw@s1:26379?master_name=m", pass: "pw"},
		{url: "redis://s1:26379?master_name=m&username=app&password=pw", user: "app", pass: "pw"},
		{url: "redis://app:pw@s1:26379?master_name=m&sentinel_username=watch&sentinel_password=spw", user: "app", pass: "pw", sentUser: "watch", sentPW: "spw"},
		{url: "redis://s1:26379?master_name=m&sentinel_password=spw", sentPW: "spw"},
		{url: "redis://app:pw@s1:26379?master_name=m&password=other", err: "give them once"},
		{url: "redis://app:pw@s1:26379", err: "needs master_name"},
	} {
		t.Run(tt.url, func(t *testing.T) {
			u, err := url.Parse(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			o, err := failoverOptions(u)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one about %q", err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.Username != tt.user || o.Password != tt.pass || o.SentinelUsername != tt.sentUser || o.SentinelPassword != tt.sentPW || o.MasterName != "m" {
				t.Fatalf("Redis %q:%q, Sentinels %q:%q, master %q; want %q:%q, %q:%q, m", o.Username, o.Password, o.SentinelUsername, o.SentinelPassword, o.MasterName, tt.user, tt.pass, tt.sentUser, tt.sentPW)
			}
		})
	}
	if got := redactURL("redis+sentinel://app:pw@s1:26379?master_name=m&sentinel_password=spw"); strings.Contains(got, "pw@") || strings.Contains(got, "spw") {
		t.Errorf("redactURL leaks a password: %s", got)
	}
}

// TestRedisClientCoversDecisionTimeout: go-redis cuts a call at its read
// timeout (5s by default) whatever the context allows, so a longer
// decision timeout raises the timeouts the URL does not set.
func TestRedisClientCoversDecisionTimeout(t *testing.T) {
	for _, tt := range []struct {
		url                 string
		d                   time.Duration
		dial, read, written time.Duration
	}{
		{"redis://127.0.0.1:1", 20 * time.Second, 20 * time.Second, 20 * time.Second, 20 * time.Second},
		{"redis://127.0.0.1:1", 50 * time.Millisecond, 5 * time.Second, 5 * time.Second, 5 * time.Second},
		{"redis://127.0.0.1:1?read_timeout=1s", 20 * time.Second, 20 * time.Second, time.Second, 20 * time.Second},
	} {
		c, err := newRedisClient(tt.url, tt.d, nil)
		if err != nil {
			t.Fatal(err)
		}
		o := c.(*redis.Client).Options()
		if o.DialTimeout != tt.dial || o.ReadTimeout != tt.read || o.WriteTimeout != tt.written {
			t.Errorf("%s with %v: dial %v, read %v, write %v; want %v, %v, %v", tt.url, tt.d, o.DialTimeout, o.ReadTimeout, o.WriteTimeout, tt.dial, tt.read, tt.written)
		}
		c.Close()
	}
	c, err := newRedisClient("redis+cluster://127.0.0.1:1", 20*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if o := c.(*redis.ClusterClient).Options(); o.ReadTimeout != 20*time.Second {
		t.Errorf("cluster read timeout %v", o.ReadTimeout)
	}
}
