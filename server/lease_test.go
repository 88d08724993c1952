package server

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluicehq/sluice/internal/redistest"
)

// leaseConfig leases the hot policy for 50ms and keeps the login policy
// exact; lease is the hot policy's lease line.
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
// once the lease in hand has lived its 50ms; Shutdown gives the leases
// back.
func TestLeasesRedis(t *testing.T) {
	for _, policy := range []string{"local", "error"} {
		t.Run(policy, func(t *testing.T) { testLeasesRedis(t, policy) })
	}
}

func testLeasesRedis(t *testing.T, policy string) {
	rs := redistest.StartServer(t)
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(file, []byte(leaseConfig("    lease: 50ms")), 0o644); err != nil {
		t.Fatal(err)
	}
	fp, ok, err := ParseFailurePolicy(policy)
	if err != nil {
		t.Fatal(err)
	}
	srv := runServer(t, Options{ConfigFile: file, RedisURL: "redis://" + rs.Addr, FailurePolicy: fp, NoFailurePolicy: !ok, WatchInterval: -1})
	svc := srv.Service()
	p := &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}
	conn, err := grpc.NewClient(p.grpc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	rls := rlsv3.NewRateLimitServiceClient(conn)

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

	// The metrics are the lease store's counters.
	st := svc.LeaseStats()
	for name, want := range map[string]uint64{
		"sluice_lease_local_decisions_total": st.Local,
		"sluice_lease_grants_total":          st.Grants,
		"sluice_lease_units_granted_total":   st.Granted,
		"sluice_lease_units_returned_total":  st.Returned,
		"sluice_lease_keys":                  uint64(st.Keys),
	} {
		if got := metricValue(t, srv.Metrics().Registry(), name, nil); got != float64(want) {
			t.Errorf("%s = %v, want %d", name, got, want)
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
	time.Sleep(60 * time.Millisecond)
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
