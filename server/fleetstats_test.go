package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

func publish(t *testing.T, f *Fleet) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := f.Publish(ctx); err != nil {
		t.Fatalf("publish: %v", err)
	}
}

// Instances publishing to one Redis see the fleet's sums: counts per
// policy, top keys merged; a report expires when its instance stops
// publishing, and the listing stays within MaxInstances.
func TestFiguresAcrossInstances(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		client func(t *testing.T) redis.UniversalClient
	}{
		{"standalone", func(t *testing.T) redis.UniversalClient {
			c := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr})
			t.Cleanup(func() { c.Close() })
			return c
		}},
		{"cluster", func(t *testing.T) redis.UniversalClient { return redistest.ClusterClient(t) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			client := tt.client(t)
			clock := newFakeClock()
			prefix := redistest.Prefix(t) + "fleet"
			a, b := newMemService(t, topConfig, clock), newMemService(t, topConfig, clock)
			fa := NewFleet(client, a, &FleetOptions{Prefix: prefix})
			fb := NewFleet(client, b, &FleetOptions{Prefix: prefix})
			for range 3 {
				check(t, a, "login", "x") // 2 allowed, 1 denied
			}
			for range 4 {
				check(t, b, "login", "x") // 2 allowed, 2 denied
			}
			check(t, b, "partner", "y")
			// Checks the store failed, as the engine reports them.
			for svc, n := range map[*Service]int{a: 1, b: 2} {
				for range n {
					observer{svc}.ObserveDecision(sluice.DecisionEvent{Policy: "login", Outcome: sluice.OutcomeError})
				}
			}
			publish(t, fa)
			publish(t, fb)
			publish(t, fa)

			o := a.mon.overview(a.Stats().Snapshot())
			if o.Scope != "fleet" || o.Instances != 2 {
				t.Fatalf("scope %q with %d instances, want the fleet of 2", o.Scope, o.Instances)
			}
			if got := fmt.Sprint(o.Allowed, o.Denied, o.Policies[0].Allowed, o.Policies[0].Denied, o.Policies[1].Allowed); got != "5 3 4 3 1" {
				t.Errorf("allowed, denied, login's, partner's allowed = %s, want 5 3 4 3 1", got)
			}
			if o.Errors != 3 || o.Policies[0].Errors != 3 || o.ErrorRatio != 3.0/11 {
				t.Errorf("errors %d (login's %d), ratio %v; want 3 of 11 checks", o.Errors, o.Policies[0].Errors, o.ErrorRatio)
			}
			top, scope, n := a.mon.topLists(TopN)
			if scope != "fleet" || n != 2 || len(top.Denials) != 1 || top.Denials[0].Count != 3 {
				t.Errorf("top %+v (%s of %d): want x denied 3 times across the fleet", top, scope, n)
			}
			if got := collectorValue(t, fa.instances); got != 2 {
				t.Errorf("sluice_fleet_instances = %v, want 2", got)
			}

			// Bounded keys: the report expires, and so does the listing.
			ctx := context.Background()
			for _, k := range []string{fa.reportKey(a.mon.instance), fa.setKey()} {
				if ttl := client.PTTL(ctx, k).Val(); ttl <= 0 || ttl > fa.ttl {
					t.Errorf("%s: TTL %v, want within (0, %v]", k, ttl, fa.ttl)
				}
			}

			// b stops publishing: once its report is older than the TTL,
			// a's figures are its own again.
			clock.Set(t0.Add(fa.ttl + time.Millisecond))
			if o := a.mon.overview(a.Stats().Snapshot()); o.Instances != 1 || o.Allowed != 2 {
				t.Errorf("after b's report expired: %d instances, %d allowed; want 1, 2", o.Instances, o.Allowed)
			}
			publish(t, fa)
			if n := client.ZCard(ctx, fa.setKey()).Val(); n != 1 {
				t.Errorf("listing holds %d instances after b went stale, want 1", n)
			}

			// A stopped instance withdraws at once.
			fb.Start()
			fb.Stop()
			if n := client.Exists(ctx, fb.reportKey(b.mon.instance)).Val(); n != 0 {
				t.Errorf("b's report still there after Stop")
			}

			// Many instances: the listing keeps MaxInstances.
			for range 5 {
				f := NewFleet(client, newMemService(t, topConfig, clock), &FleetOptions{Prefix: prefix, MaxInstances: 3})
				publish(t, f)
			}
			if n := client.ZCard(ctx, fa.setKey()).Val(); n > 3 {
				t.Errorf("listing holds %d instances, want at most 3", n)
			}
		})
	}
}

// The fleet's overview counts the decisions leases answered on every
// instance, per policy and in all.
func TestFleetFiguresLocal(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: redistest.StartServer(t).Addr})
	t.Cleanup(func() { c.Close() })
	clock := newFakeClock()
	prefix := redistest.Prefix(t) + "fleet"
	const cfg = "policies:\n  - name: hot\n    limit: 100/min\n    lease: 1s\n  - name: exact\n    limit: 100/min\n"
	a, b := newMemService(t, cfg, clock), newMemService(t, cfg, clock)
	fa := NewFleet(c, a, &FleetOptions{Prefix: prefix})
	fb := NewFleet(c, b, &FleetOptions{Prefix: prefix})
	for range 20 {
		check(t, a, "hot", "k")
		check(t, b, "hot", "k")
		check(t, b, "exact", "k")
	}
	la, lb := a.LeaseStats().Local, b.LeaseStats().Local
	if la == 0 || lb == 0 {
		t.Fatalf("local decisions %d and %d: the leases never answered", la, lb)
	}
	publish(t, fa)
	publish(t, fb)
	publish(t, fa) // a reads the fleet's reports as it publishes
	o := a.mon.overview(a.Stats().Snapshot())
	if o.Instances != 2 || uint64(o.Local) != la+lb || uint64(o.Policies[0].Local) != la+lb || o.Policies[1].Local != 0 {
		t.Errorf("overview of %d instances: %d local, hot %d, exact %d; want 2 instances, %d local, all of them hot's",
			o.Instances, o.Local, o.Policies[0].Local, o.Policies[1].Local, la+lb)
	}
}

// Losing Redis is one warning and a counted failure, not a line per round;
// its return is one line; the figures fall back to this instance's.
func TestFiguresWhenRedisIsLost(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	client := redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { client.Close() })
	var logs bytes.Buffer
	clock := newFakeClock()
	svc := newMemService(t, topConfig, clock)
	f := NewFleet(client, svc, &FleetOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Prefix: redistest.Prefix(t)})
	publish(t, f)
	r.Stop()
	for range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		if err := f.Publish(ctx); err == nil {
			t.Error("publish with Redis down: no error")
		}
		cancel()
	}
	r.Start(t)
	publish(t, f)
	lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[1], "available again") {
		t.Errorf("log:\n%s\nwant one warning and one recovery line", logs.String())
	}
	if got := collectorValue(t, f.failures); got != 3 {
		t.Errorf("sluice_fleet_publish_failures_total = %v, want 3", got)
	}
}

// metricValue is the value of a collector's one gauge or counter.
func collectorValue(t *testing.T, c prometheus.Collector) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	mfs, err := reg.Gather()
	if err != nil || len(mfs) != 1 || len(mfs[0].GetMetric()) != 1 {
		t.Fatalf("gather: %v %v", mfs, err)
	}
	m := mfs[0].GetMetric()[0]
	return m.GetGauge().GetValue() + m.GetCounter().GetValue()
}

// Two `sluice serve` processes on one Redis each show the fleet's figures
// within a few publishing rounds, and one that stops leaves them at once.
func TestFleetFiguresAcrossProcesses(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	env := []string{"SLUICE_HTTP_ADDR=127.0.0.1:0", "SLUICE_GRPC_ADDR=127.0.0.1:0", "SLUICE_REDIS_URL=redis://" + r.Addr + "/0"}
	a, b := startSluice(t, env), startSluice(t, env)
	for range 3 {
		a.post(t, "/v1/check", `{"policy":"fixed_window","key":"from-a"}`)
	}
	for range 7 {
		b.post(t, "/v1/check", `{"policy":"fixed_window","key":"from-b"}`) // 5 allowed, 2 denied
	}
	overview := func(p *proc) Overview {
		t.Helper()
		_, body := p.get(t, "/v1/stats")
		var st struct{ Overview Overview }
		if err := json.Unmarshal([]byte(body), &st); err != nil {
			t.Fatalf("stats %q: %v", body, err)
		}
		return st.Overview
	}
	// Rounds are 2 s apart: 10 s is five of them.
	await := func(p *proc, what string, ok func(Overview) bool) {
		t.Helper()
		var o Overview
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if o = overview(p); ok(o) {
				return
			}
		}
		t.Fatalf("%s: overview %+v", what, o)
	}
	for _, p := range []*proc{a, b} {
		await(p, "the fleet's sums", func(o Overview) bool {
			return o.Scope == "fleet" && o.Instances == 2 && o.Allowed == 8 && o.Denied == 2
		})
	}
	b.stop(t)
	start := time.Now()
	await(a, "b gone", func(o Overview) bool { return o.Instances == 1 && o.Allowed == 3 && o.Denied == 0 })
	t.Logf("a dropped the stopped b after %v", time.Since(start))
}

// While this instance's rounds fail and no other report is left, the
// figures are this instance's alone: the scope says so.
func TestFleetScopeWhileRedisAway(t *testing.T) {
	f := &Fleet{}
	if got := f.scope(nil); got != "fleet" {
		t.Errorf("scope with rounds answered = %q, want fleet", got)
	}
	f.failing = true
	if got := f.scope(nil); got != "instance" {
		t.Errorf("scope with rounds failing and no report = %q, want instance", got)
	}
	if got := f.scope([]instanceReport{{}}); got != "fleet" {
		t.Errorf("scope with rounds failing and a report left = %q, want fleet", got)
	}
}
