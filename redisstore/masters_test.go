package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// On a Cluster, Check and CheckAccess run on every master: with one
// stopped (SIGSTOP) they name it in a *PartialError, the others among the
// answered, by the end of their context; with every master stopped the
// error is one master's, not a partial one. The store's prefix with a hash
// tag of its own puts every key on one master, the only one CheckAccess
// asks.
func TestCheckClusterMasterStopped(t *testing.T) {
	t.Parallel()
	cl := redistest.StartCluster(t, &redistest.ClusterOptions{Args: []string{"--cluster-require-full-coverage", "no"}})
	c := cl.Client(t)
	s := redisstore.New(c, nil)
	ctx := func() context.Context {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		t.Cleanup(cancel)
		return ctx
	}
	rep, err := redisstore.Check(ctx(), c)
	if err != nil || len(rep.Masters) != 3 {
		t.Fatalf("Check = %+v, %v: want 3 masters, nil", rep, err)
	}
	if err := s.CheckAccess(ctx()); err != nil {
		t.Fatalf("CheckAccess = %v", err)
	}

	stopped := cl.MasterOf(t, "sluice:check")
	tag := ""
	for i := 0; tag == ""; i++ {
		if p := fmt.Sprintf("p{%d}:", i); cl.MasterOf(t, p+"check") != stopped {
			tag = p
		}
	}
	paused := map[*redistest.Node]bool{}
	pause := func(n *redistest.Node) {
		n.Pause(t)
		paused[n] = true
	}
	defer func() {
		for n := range paused {
			n.Resume(t)
		}
	}()
	pause(stopped)
	partial := func(what string, err error) {
		t.Helper()
		var pe *redisstore.PartialError
		if !errors.As(err, &pe) || !errors.Is(err, redisstore.ErrPartial) {
			t.Fatalf("%s = %v, want a *PartialError", what, err)
		}
		if !slices.Equal(pe.Addrs(), []string{stopped.Addr}) || len(pe.Answered) != 2 || slices.Contains(pe.Answered, stopped.Addr) {
			t.Errorf("%s: failed %v, answered %v; want %s failed alone", what, pe.Addrs(), pe.Answered, stopped.Addr)
		}
		if !errors.Is(err, redisstore.ErrUnreachable) || errors.Is(err, redisstore.ErrMisconfigured) {
			t.Errorf("%s = %v, want the master unreachable, nothing misconfigured", what, err)
		}
	}
	start := time.Now()
	rep, err = redisstore.Check(ctx(), c)
	partial("Check", err)
	if rep == nil || len(rep.Masters) != 3 || rep.Version == "" {
		t.Errorf("Check's report %+v with a master stopped: want the three masters, the others' version", rep)
	}
	partial("CheckAccess", s.CheckAccess(ctx()))
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the checks took %v, want each within its 1s context", d)
	}
	tagged := redisstore.New(c, &redisstore.Options{Prefix: tag})
	if err := tagged.CheckAccess(ctx()); err != nil {
		t.Errorf("CheckAccess under prefix %q, whose keys are all on a live master, = %v, want nil", tag, err)
	}

	for _, n := range cl.Nodes {
		if n != stopped {
			pause(n)
		}
	}
	err = s.CheckAccess(ctx())
	if errors.Is(err, redisstore.ErrPartial) || !errors.Is(err, redisstore.ErrUnreachable) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("CheckAccess with every master stopped = %v, want ErrUnreachable wrapping the deadline, not partial", err)
	}
	for n := range paused {
		n.Resume(t)
		delete(paused, n)
	}
	if err := s.CheckAccess(ctx()); err != nil {
		t.Errorf("CheckAccess with every master back = %v", err)
	}
}

func TestJoinMasters(t *testing.T) {
	down := redisstore.Classify(errors.New("dial tcp: connection refused"))
	perm := redisstore.Classify(errors.New("NOPERM no"))
	a := &redisstore.PartialError{Failed: map[string]error{"a:1": down}, Answered: []string{"b:1", "c:1"}}
	b := &redisstore.PartialError{Failed: map[string]error{"b:1": perm}, Answered: []string{"a:1", "c:1"}}
	var pe *redisstore.PartialError
	if err := redisstore.JoinMasters(nil, nil); err != nil {
		t.Errorf("JoinMasters(nil, nil) = %v", err)
	}
	if err := redisstore.JoinMasters(nil, a); !errors.As(err, &pe) || !slices.Equal(pe.Addrs(), []string{"a:1"}) {
		t.Errorf("JoinMasters(nil, a) = %v, want a", err)
	}
	if err := redisstore.JoinMasters(a, b); !errors.As(err, &pe) || !slices.Equal(pe.Addrs(), []string{"a:1", "b:1"}) || !slices.Equal(pe.Answered, []string{"c:1"}) {
		t.Errorf("JoinMasters(a, b) = %v, want a:1 and b:1 failing, c:1 answered", err)
	}
	c := &redisstore.PartialError{Failed: map[string]error{"c:1": down}, Answered: []string{"a:1", "b:1"}}
	err := redisstore.JoinMasters(a, b, c)
	if errors.Is(err, redisstore.ErrPartial) || !errors.Is(err, redisstore.ErrPermission) {
		t.Errorf("JoinMasters with every master failing = %v, want the misconfigured one's error alone", err)
	}
	whole := redisstore.Classify(redis.ErrClosed)
	if err := redisstore.JoinMasters(a, whole); err != whole {
		t.Errorf("JoinMasters(a, whole) = %v, want %v", err, whole)
	}
}

// TestFaultClusterNewClientMastersStoppedMaster: the package-level Masters
// and Check, on a new ClusterClient while one master of three is stopped
// (SIGSTOP), load the client's first slot map as a Store does, with 8
// reloads at once: Masters answers within mastersWithin, and Check names
// the stopped master in a *PartialError, the two others answered. go-redis
// loads a new client's map asking the nodes one at a time in random
// order: one that asked the stopped master first waited out the read
// timeout (3 s), or the caller's deadline with ContextTimeoutEnabled, and
// Check, its context ended, failed whole. Each round builds new clients,
// so that the map is loaded afresh.
func TestFaultClusterNewClientMastersStoppedMaster(t *testing.T) {
	race.SkipTiming(t)
	const (
		rounds        = 6
		mastersWithin = 300 * time.Millisecond
		checkWithin   = 500 * time.Millisecond // Check waits for the stopped master until then
	)
	cl := stoppableCluster(t)
	stopped := cl.Nodes[0]
	stopped.Pause(t)
	defer stopped.Resume(t)
	var slowest time.Duration
	defer func() { t.Logf("Masters took %v at most", slowest.Round(time.Millisecond)) }()
	for round := range rounds {
		for _, timed := range []bool{false, true} {
			opts := &redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: timed}
			c := redis.NewClusterClient(opts)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			start := time.Now()
			nodes, err := redisstore.Masters(ctx, c)
			d := time.Since(start)
			slowest = max(slowest, d)
			cancel()
			c.Close()
			if err != nil || len(nodes) != 3 || d > mastersWithin {
				t.Errorf("round %d, ContextTimeoutEnabled=%v: Masters = %d nodes, %v after %v; want 3 within %v",
					round, timed, len(nodes), err, d.Round(time.Millisecond), mastersWithin)
			}

			c = redis.NewClusterClient(opts)
			ctx, cancel = context.WithTimeout(context.Background(), checkWithin)
			start = time.Now()
			rep, err := redisstore.Check(ctx, c)
			d = time.Since(start)
			cancel()
			c.Close()
			var pe *redisstore.PartialError
			if !errors.As(err, &pe) || !slices.Equal(pe.Addrs(), []string{stopped.Addr}) || len(pe.Answered) != 2 || rep == nil || len(rep.Masters) != 3 {
				t.Errorf("round %d, ContextTimeoutEnabled=%v: Check = %+v, %v after %v; want %s failed alone, two answered",
					round, timed, rep, err, d.Round(time.Millisecond), stopped.Addr)
			}
			if d > checkWithin+200*time.Millisecond {
				t.Errorf("round %d, ContextTimeoutEnabled=%v: Check took %v, want its %v context", round, timed, d.Round(time.Millisecond), checkWithin)
			}
		}
	}
}

// TestFaultClusterNewClientStoppedMaster: a new ClusterClient's first
// decisions on live masters answer within their callers' 100 ms while
// another master is stopped (SIGSTOP). go-redis loads its command table
// on a client's first command (ClusterClient.cmdsInfo), from nodes one at
// a time, under a lock every ClusterClient.Process takes: one that asked
// the stopped master first held every call for the read timeout (3 s).
// Each round builds a new client, so that the table is loaded afresh from
// nodes in another random order. Callers wait up to half the read timeout,
// so that a call held for it fails, and 90% of the first takes must answer
// within 100 ms: a loaded machine can hold one past that, not a third of
// them (the rounds whose client asked the stopped master first).
func TestFaultClusterNewClientStoppedMaster(t *testing.T) {
	race.SkipTiming(t)
	const (
		rounds   = 8
		deadline = 1500 * time.Millisecond
		within   = 100 * time.Millisecond
	)
	ctx := context.Background()
	cl := stoppableCluster(t)
	l := failoverLimit
	keys, masters := keyPerMaster(t, cl, redisstore.New(nil, nil), l)
	masters[0].Pause(t)
	defer masters[0].Resume(t)
	var lat []time.Duration // every first take's, however it ended
	for _, batch := range []int{0, 1} {
		for _, timed := range []bool{false, true} {
			t.Run(fmt.Sprintf("maxbatch=%d/ContextTimeoutEnabled=%v", batch, timed), func(t *testing.T) {
				for round := range rounds {
					c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs(), ContextTimeoutEnabled: timed})
					s := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t), MaxBatch: batch})
					for _, key := range keys[1:] {
						start := time.Now()
						cctx, cancel := context.WithTimeout(ctx, deadline)
						_, err := s.Take(cctx, key, l, 1)
						cancel()
						took := time.Since(start)
						lat = append(lat, took)
						if err != nil {
							t.Errorf("round %d: first take of %q on a live master: %v after %v", round, key, err, took.Round(time.Millisecond))
						}
					}
					c.Close()
				}
			})
		}
	}
	slices.Sort(lat)
	p90 := lat[len(lat)*9/10]
	t.Logf("%d first takes: p50 %v, p90 %v, slowest %v", len(lat), lat[len(lat)/2].Round(time.Millisecond/10),
		p90.Round(time.Millisecond/10), lat[len(lat)-1].Round(time.Millisecond))
	if p90 > within {
		t.Errorf("first takes on live masters: p90 %v, want within %v", p90, within)
	}
}
