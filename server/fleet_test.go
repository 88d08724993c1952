//go:build unix

package server

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// fleetLimit is every fleet policy's limit: per hour, so that refills
// during a test are negligible, and small enough that the load can use up
// both Redis's limit and every instance's fallback share, driving the
// count to the bound; but not within fleetLead on an idle machine (300
// was, at about 6,000 requests a second): an instance whose keys all sit
// in its deny cache when the fault comes sends Redis nothing to fail, and
// its breaker never opens.
const (
	fleetLimit  = 3000
	fleetPeriod = time.Hour
	fleetConfig = `
policies:
  - name: gcra
    limit: gcra 3000/h
  - name: token_bucket
    limit: token_bucket 3000/h
  - name: sliding_window_log
    limit: sliding_window_log 3000/h
  - name: fixed_window
    limit: fixed_window 3000/h
`
)

// fleetLead is how long the load runs before a fault: short enough that
// Redis has not used up the limit, so that the fallback has something to
// admit (a key Redis denied stays denied in each instance's deny cache).
const fleetLead = 300 * time.Millisecond

var fleetPolicies = []string{"gcra", "token_bucket", "sliding_window_log", "fixed_window"}

// exactLimit is what an exact limiter admits at most from start to end for
// a fleet policy: the burst plus what refills meanwhile, or the limit in
// every window the interval touches.
func exactLimit(policy string, start, end time.Time) int64 {
	switch policy {
	case "fixed_window":
		windows := end.Truncate(fleetPeriod).Sub(start.Truncate(fleetPeriod))/fleetPeriod + 1
		return fleetLimit * int64(windows)
	case "sliding_window_log":
		return fleetLimit * int64((end.Sub(start)+fleetPeriod-1)/fleetPeriod)
	}
	refill := (int64(end.Sub(start))*fleetLimit + int64(fleetPeriod) - 1) / int64(fleetPeriod)
	return fleetLimit + refill
}

// checkFleetBound asserts the fallback bound on a finished load (README,
// "Bounds when Redis fails": 2·(B + r·T) for the buckets, 2·L per window or
// Period for the window algorithms): with the fleet size known and no
// acknowledged take lost, the fleet admits at most twice what an exact
// limiter would over the run, however the breaker flapped.
func checkFleetBound(t *testing.T, l *load) {
	t.Helper()
	allowed, denied, failed := l.sum()
	t.Logf("%d requests in %v: %d allowed, %d denied, %d failed", allowed+denied+failed, l.took.Round(time.Millisecond), allowed, denied, failed)
	end := l.start.Add(l.took)
	for i, p := range l.policies {
		total, per := l.admitted(i)
		exact := exactLimit(p, l.start, end)
		t.Logf("%s: %d admitted (instances %v); exact limiter %d, bound %d", p, total, per, exact, 2*exact)
		if total > 2*exact {
			t.Errorf("%s: the fleet admitted %d, above the bound 2 × %d", p, total, exact)
		}
	}
	if failed > 0 {
		t.Errorf("%d requests failed: the failure policy must answer every one", failed)
	}
}

// TestFleetBoundRedisPaused: four instances under load, Redis stopped
// (SIGSTOP: connections hang) for 3s, then resumed.
//
// The instances find the fleet's size themselves, through Redis; the load
// starts once each counts four.
func TestFleetBoundRedisPaused(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	f := startFleet(t, r.url(), 4, fleetConfig)
	f.awaitFleetSize(t, 4, 5*time.Second)
	l := f.drive(2, "client", fleetPolicies...)
	time.Sleep(fleetLead)
	r.pause(t)
	time.Sleep(3 * time.Second)
	r.resume(t)
	time.Sleep(2 * time.Second)
	l.finish()
	checkFleetBound(t, l)
	// Loud: one line each as the outage starts and ends.
	f.awaitLogs(t, 5*time.Second, `msg="resilient: breaker open" store=redis from=closed`, `msg="resilient: breaker closed"`,
		"resilient: fleet registry lost", "resilient: fleet registry back")
}

// TestFleetBoundRedisKilled: four instances under load, Redis killed
// (connections refused) for 3s, then restarted. Its append-only file,
// synced before every reply, keeps every acknowledged take: the bound's
// precondition.
func TestFleetBoundRedisKilled(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t, "--appendonly", "yes", "--appendfsync", "always")
	f := startFleet(t, r.url(), 4, fleetConfig)
	f.awaitFleetSize(t, 4, 5*time.Second)
	l := f.drive(2, "client", fleetPolicies...)
	time.Sleep(fleetLead)
	r.Stop()
	time.Sleep(3 * time.Second)
	r.restart(t)
	time.Sleep(2 * time.Second)
	l.finish()
	checkFleetBound(t, l)
}

// TestFleetBoundRedisSlow: four instances under load, Redis paused
// (CLIENT PAUSE) 80ms every 200ms for 4s: slower than the decision
// timeout, alive in between. The breaker stays closed.
func TestFleetBoundRedisSlow(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	f := startFleet(t, r.url(), 4, fleetConfig)
	f.awaitFleetSize(t, 4, 5*time.Second)
	c := r.client()
	defer c.Close()
	l := f.drive(2, "client", fleetPolicies...)
	time.Sleep(fleetLead)
	for range 20 {
		if err := c.ClientPause(context.Background(), 80*time.Millisecond).Err(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(time.Second)
	l.finish()
	checkFleetBound(t, l)
	// Slow is not down: the calls that timed out fell back alone.
	for i, p := range f.procs {
		if log := p.stderr.String(); strings.Contains(log, "resilient: breaker open") {
			t.Errorf("instance %d: the breaker opened; log:\n%s", i, log)
		}
	}
}

// TestFleetSizeDiscovery: instances count each other through Redis; a
// fifth that joins is counted by all within 5s, and with Redis stopped
// (longer than a registration lasts) every count holds.
func TestFleetSizeDiscovery(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	f := startFleet(t, r.url(), 4, fleetConfig)
	f.awaitFleetSize(t, 4, 5*time.Second)
	f.add(t)
	took := f.awaitFleetSize(t, 5, 5*time.Second)
	t.Logf("five instances count five %v after the fifth started", took.Round(time.Millisecond))
	for i, p := range f.procs[:4] {
		n := 0
		for line := range strings.SplitSeq(p.stderr.String(), "\n") {
			if strings.Contains(line, "resilient: fleet size changed") && strings.Contains(line, " to=5 ") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("instance %d logged the change to 5 %d times, want once; log:\n%s", i, n, p.stderr.String())
		}
	}

	r.pause(t)
	for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(250 * time.Millisecond) {
		for i, p := range f.procs {
			if got := metric(t, p, "sluice_fleet_size"); got != 5 {
				t.Fatalf("instance %d: fleet size %v with Redis stopped, want 5 kept", i, got)
			}
		}
	}
	for i, p := range f.procs {
		if got := metric(t, p, "sluice_fleet_registry_reachable"); got != 0 {
			t.Errorf("instance %d: registry reachable %v with Redis stopped", i, got)
		}
	}
	r.resume(t)
	f.awaitFleetSize(t, 5, 5*time.Second)
}

// TestCLIFleetSize: --fleet-size and SLUICE_FLEET_SIZE are read and
// checked, and an explicit size wins over the count.
func TestCLIFleetSize(t *testing.T) {
	for _, tt := range []struct {
		name   string
		env    []string
		args   []string
		code   int
		stderr string
	}{
		{"bad environment", []string{"SLUICE_FLEET_SIZE=many"}, nil, 2, "SLUICE_FLEET_SIZE"},
		{"flag over a bad environment", []string{"SLUICE_FLEET_SIZE=many"}, []string{"--fleet-size", "2", "--redis", "http://x"}, 2, "invalid redis URL"},
		{"negative", nil, []string{"--fleet-size", "-1"}, 2, "--fleet-size -1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stderr strings.Builder
			cmd := sluiceCmd(tt.env, append([]string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, tt.args...)...)
			cmd.Stderr = &stderr
			err := cmd.Run()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.ExitCode() != tt.code {
				t.Fatalf("exit %v, want code %d; stderr:\n%s", err, tt.code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderr, stderr.String())
			}
		})
	}
	t.Run("redis unreachable at start", func(t *testing.T) {
		addr := redistest.DeadAddr(t)
		for _, tt := range []struct {
			args []string
			want float64
		}{{nil, 1}, {[]string{"--fleet-size", "3"}, 3}} {
			f := startFleet(t, "redis://"+addr, 1, fleetConfig, tt.args...)
			if got := metric(t, f.procs[0], "sluice_fleet_size"); got != tt.want {
				t.Errorf("%v: sluice_fleet_size %v, want %v", tt.args, got, tt.want)
			}
			warned := strings.Contains(f.procs[0].stderr.String(), "fleet registry unreachable at start")
			if explicit := tt.args != nil; warned == explicit {
				t.Errorf("%v: warned %v; want a warning only without an explicit size", tt.args, warned)
			}
		}
	})
	t.Run("explicit wins", func(t *testing.T) {
		f := startFleet(t, startRedis(t).url(), 1, fleetConfig, "--fleet-size", "7")
		// Past the first heartbeats, which count one instance.
		f.awaitRegistry(t)
		if got := metric(t, f.procs[0], "sluice_fleet_size"); got != 7 {
			t.Errorf("sluice_fleet_size %v, want 7", got)
		}
	})
}

// partitionConfig: the fleet's GCRA policy, and one that refills fast
// enough (100 a second) that an instance still taking its share would
// admit within a second.
const partitionConfig = fleetConfig + `  - name: refill
    limit: gcra 6000/min
`

// TestFleetPartition: one instance of three is cut off from Redis (its
// connections hang) while the others are not. It answers from its
// fallback, a third of every limit, until the others stop counting it:
// --fleet-shrink plus the registration's 3s after its last registration.
// From then it refuses, with one ERROR line, sluice_fleet_counted 0 and a
// reason in /v1/status, while the others' count falls to 2. Redis then
// stops for everyone: the counted two take halves, the cut one nothing,
// and the fleet stays within the bound a shrink allows (README, "Bounds
// when Redis fails": 2·(B + r·T), plus B/N once for the shrink).
func TestFleetPartition(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	cut := newStallProxy(t, r.Addr)
	f := startFleet(t, r.url(), 2, partitionConfig, "--fleet-shrink", "2s")
	f.add(t, "--redis", "redis://"+cut.addr())
	f.awaitFleetSize(t, 3, 5*time.Second)
	policies := []string{"gcra", "refill"}
	l := f.drive(2, "client", policies...)
	time.Sleep(fleetLead)
	cut.stall()
	alone, rest := &fleet{procs: f.procs[2:]}, &fleet{procs: f.procs[:2]}
	alone.awaitLogs(t, 10*time.Second, "resilient: fleet registry unreachable for longer than the others count this process")
	if v := metric(t, f.procs[2], "sluice_fleet_counted"); v != 0 {
		t.Errorf("sluice_fleet_counted %v on the cut instance, want 0", v)
	}
	if _, st := f.procs[2].getJSON(t, "/v1/status"); !strings.Contains(fmt.Sprint(st["reasons"]), "the fleet no longer counts this instance") {
		t.Errorf("status %v: want a reason naming the fleet", st)
	}
	took := l.counts[2][1].allowed.Load()
	if took == 0 {
		t.Error("the cut instance admitted nothing while counted: no share was taken")
	}
	time.Sleep(time.Second)
	if now := l.counts[2][1].allowed.Load(); now != took {
		t.Errorf("the cut instance admitted %d more in the second after it was no longer counted", now-took)
	}
	rest.awaitFleetSize(t, 2, 5*time.Second)
	r.pause(t)
	time.Sleep(2 * time.Second)
	r.resume(t)
	time.Sleep(time.Second)
	l.finish()
	allowed, denied, failed := l.sum()
	t.Logf("%d requests in %v: %d allowed, %d denied, %d failed", allowed+denied+failed, l.took.Round(time.Millisecond), allowed, denied, failed)
	end := l.start.Add(l.took)
	for i, p := range policies {
		total, per := l.admitted(i)
		exact := exactLimit("gcra", l.start, end)
		if p == "refill" {
			exact = 6000 + int64(l.took*100/time.Second) + 1
		}
		bound := 2*exact + 6000/3
		if p == "gcra" {
			bound = 2*exact + fleetLimit/3
		}
		t.Logf("%s: %d admitted (instances %v); exact limiter %d, bound %d", p, total, per, exact, bound)
		if total > bound {
			t.Errorf("%s: the fleet admitted %d, above the bound %d", p, total, bound)
		}
	}
	if failed > 0 {
		t.Errorf("%d requests failed: the failure policy must answer every one", failed)
	}
}

// TestUnreachableAtStartStatus: an instance started while Redis is
// unreachable tells one true reason: without --fleet-size it has never
// registered, so local refuses (and --fleet-size is the fix); with it,
// local decides. Either way the failure policy answers, and
// fallback_active and sluice_fallback_active say so before any request.
func TestUnreachableAtStartStatus(t *testing.T) {
	addr := redistest.DeadAddr(t)
	for _, tt := range []struct {
		args           []string
		source, reason string
		code           int
	}{
		{nil, "fail_closed", "never registered", http.StatusTooManyRequests},
		{[]string{"--fleet-size", "2"}, "fallback", "failure policy local decides", http.StatusOK},
	} {
		p := startFleet(t, "redis://"+addr, 1, fleetConfig, tt.args...).procs[0]
		_, st := p.getJSON(t, "/v1/status")
		reasons, _ := st["reasons"].([]any)
		if len(reasons) != 1 || !strings.Contains(fmt.Sprint(reasons[0]), tt.reason) {
			t.Errorf("%v: reasons %q, want one saying %q", tt.args, reasons, tt.reason)
		}
		if tt.args == nil && len(reasons) == 1 {
			if r := fmt.Sprint(reasons[0]); !strings.Contains(r, "--fleet-size") || strings.Contains(r, "decides") || strings.Contains(r, "failed for longer") {
				t.Errorf("reason %q: want refusal, never registered, and the fix", r)
			}
		}
		if st["fallback_active"] != true {
			t.Errorf("%v: fallback_active %v, want true: the failure policy answers", tt.args, st["fallback_active"])
		}
		if got := metric(t, p, "sluice_fallback_active"); got != 1 {
			t.Errorf("%v: sluice_fallback_active %v, want 1", tt.args, got)
		}
		code, body := p.post(t, "/v1/check", `{"policy":"gcra","key":"a"}`)
		if code != tt.code || body["source"] != tt.source {
			t.Errorf("%v: check %d %v, want %d from %s", tt.args, code, body, tt.code, tt.source)
		}
	}
}

// TestFleetGracefulRestart: an instance stopped by SIGTERM withdraws its
// registration, so that a restart leaves the count at 1 within a
// heartbeat or two (not 2 for --fleet-shrink), and a rolling replacement
// of one of two instances leaves 2; an instance killed without a word is
// still counted, as one that may still run.
func TestFleetGracefulRestart(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	f := startFleet(t, r.url(), 1, fleetConfig)
	f.awaitRegistry(t)
	f.procs[0].stop(t)
	f.procs = nil
	f.add(t)
	f.awaitRegistry(t)
	took := f.awaitFleetSize(t, 1, 2500*time.Millisecond)
	time.Sleep(1500 * time.Millisecond) // past the old registration's TTL
	f.awaitFleetSize(t, 1, 0)
	if strings.Contains(f.procs[0].stderr.String(), "fleet size changed") {
		t.Errorf("the restarted instance counted its predecessor:\n%s", f.procs[0].stderr.String())
	}
	t.Logf("restarted: the count is 1 %v after the registration", took.Round(time.Millisecond))

	// Rolling: a replacement joins, then the old one stops.
	old := f.procs[0]
	f.add(t)
	f.awaitFleetSize(t, 2, 5*time.Second)
	f.add(t) // the third, replacing the first
	f.awaitFleetSize(t, 3, 5*time.Second)
	old.stop(t)
	f.procs = f.procs[1:]
	took = f.awaitFleetSize(t, 2, 2500*time.Millisecond)
	t.Logf("rolled: the count is 2 %v after the old instance stopped", took.Round(time.Millisecond))

	// Killed: silent, so kept for --fleet-shrink.
	if err := f.procs[1].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	f.procs[1].cmd.Wait()
	f.procs = f.procs[:1]
	time.Sleep(4 * time.Second) // past its registration's TTL
	if got := metric(t, f.procs[0], "sluice_fleet_size"); got != 2 {
		t.Errorf("sluice_fleet_size %v after an instance was killed, want 2 kept for --fleet-shrink", got)
	}
}

// TestWaitReplicasWarnings: wait_replicas on a master without replicas.
// The start warns that the master has too few, and, when wait_timeout
// plus Redis's timer tick (WAIT ends on a tick: 100ms at hz 10) does not
// fit in --decision-timeout, that a missing replica will look like a
// timeout. With a decision timeout that fits, the takes fail as not
// replicated, and /v1/status names that cause, not "unreachable".
func TestWaitReplicasWarnings(t *testing.T) {
	r := startRedis(t)
	slow := startFleet(t, r.url()+"?wait_replicas=1", 1, fleetConfig).procs[0]
	for _, want := range []string{"wait_timeout plus Redis's timer tick exceeds --decision-timeout", "wait_timeout=100ms", "decision_timeout=50ms", "redis_hz=10", "want_decision_timeout_at_least=200ms",
		"fewer connected replicas than wait_replicas", "connected_replicas=0"} {
		if !strings.Contains(slow.stderr.String(), want) {
			t.Errorf("start log lacks %q:\n%s", want, slow.stderr.String())
		}
	}
	p := startFleet(t, r.url()+"?wait_replicas=1&wait_timeout=20ms", 1, fleetConfig, "--decision-timeout", "300ms").procs[0]
	if strings.Contains(p.stderr.String(), "timer tick") {
		t.Errorf("warned of the tick though 20ms + 100ms fits in 300ms:\n%s", p.stderr.String())
	}
	var reasons string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		p.post(t, "/v1/check", `{"policy":"gcra","key":"a"}`)
		_, st := p.getJSON(t, "/v1/status")
		if reasons = fmt.Sprint(st["reasons"]); strings.Contains(reasons, "breaker is open") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the breaker did not open: %v", st)
		}
	}
	if !strings.Contains(reasons, "calls failed: not_replicated: ") {
		t.Errorf("reasons %s: want the cause not_replicated", reasons)
	}
	if strings.Contains(reasons, "unreachable") || !strings.Contains(reasons, "replicas acknowledged it within wait_timeout") {
		t.Errorf("reasons %s: want the replicas named, not Redis unreachable", reasons)
	}
}

// TestFleetFailedStartNotCounted: `sluice serve` runs that cannot start
// (the HTTP or gRPC address in use) never register in the fleet, so the
// instances that run do not count them: not even for the moment before a
// withdrawal, which a size grown at once would keep until it was seen.
func TestFleetFailedStartNotCounted(t *testing.T) {
	t.Parallel()
	r := redistest.StartServer(t)
	f := startFleet(t, "redis://"+r.Addr, 2, failoverConfig)
	f.awaitFleetSize(t, 2, 5*time.Second)
	admin := r.Client(t)
	ctx := context.Background()
	for i := range 4 {
		taken := []string{"--http", f.procs[0].http}
		if i%2 == 1 {
			taken = []string{"--grpc", f.procs[0].grpc}
		}
		cmd := sluiceCmd(nil, append(append([]string{"serve"}, f.args...), taken...)...)
		out, err := cmd.CombinedOutput()
		if code := cmd.ProcessState.ExitCode(); code != 1 || !strings.Contains(string(out), "address already in use") {
			t.Fatalf("start on an address in use: exit %d (%v), want 1 naming it; output:\n%s", code, err, out)
		}
		// A registration withdrawn at once would be listed as withdrawn.
		if n, err := admin.ZCard(ctx, "sluice:{fleet}:left").Result(); err != nil || n != 0 {
			t.Fatalf("after failed start %d: %d withdrawn registrations (%v), want none: it registered", i, n, err)
		}
	}
	if n, err := admin.ZCard(ctx, "sluice:{fleet}").Result(); err != nil || n != 2 {
		t.Errorf("registry: %d members (%v), want the 2 running", n, err)
	}
	time.Sleep(1500 * time.Millisecond) // a heartbeat of each running instance
	for i, p := range f.procs {
		if got := metric(t, p, "sluice_fleet_size"); got != 2 {
			t.Errorf("instance %d: sluice_fleet_size %v after failed starts, want 2", i, got)
		}
	}
}
