package server

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/releasetest"
)

// TestShutdownWaitsForReleases: a release that failed with Redis away
// (503, sent again in the background) still frees its slot when the
// instance stops gracefully while Redis is away and Redis returns within
// the grace period; with Redis away for good, the stop ends with the
// grace period and logs how many releases it gave up. Before, Shutdown
// closed the store under the background release, and the slot stayed
// held to its hold timeout, with nothing logged. Not parallel: the
// background releases are the process's.
func TestShutdownWaitsForReleases(t *testing.T) {
	// A hold well past the stop, but short: a release given up at the
	// stop retries (in a test, where the process goes on, on a closed
	// store) until it passes.
	const hold = 8 * time.Second
	cfg := writeConfig(t, strings.Replace(slotsConfig, "hold: 30s", "hold: 8s", 1))
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), hold+5*time.Second)
		defer cancel()
		sluice.WaitReleases(ctx) // not to count in the next test's
	}()
	r := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always") // the slot survives a restart
	// The default failure policy (local): the release fails past its
	// breaker, which stays open until its probe after Redis returns.
	start := func(logs *syncBuffer) *Server {
		return startServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", FleetSize: 1,
			Logger: slog.New(slog.NewTextHandler(logs, nil))})
	}
	// failedRelease acquires key's whole max on srv and releases it with
	// Redis stopped: 503.
	failedRelease := func(srv *Server, key string) {
		t.Helper()
		base := "http://" + srv.HTTPAddr()
		code, body, _ := post(t, base, "/v1/acquire", `{"policy":"exports","key":"`+key+`","weight":10}`)
		if code != 200 {
			t.Fatalf("acquire: %d %v", code, body)
		}
		r.Stop()
		if code, body, _ := post(t, base, "/v1/release", tokenBody(body["token"])); code != 503 {
			t.Fatalf("release with Redis stopped: %d %v, want 503", code, body)
		}
	}

	t.Run("Redis back within the grace period", func(t *testing.T) {
		logs := new(syncBuffer)
		srv := start(logs)
		failedRelease(srv, "ann")
		go func() {
			time.Sleep(time.Second)
			r.Start(t)
		}()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		began := time.Now()
		if err := srv.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		t.Logf("stopped in %v", time.Since(began))
		// At once: a release still retrying after the stop (only in a test,
		// where the process goes on) must not count.
		check := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", NoFailurePolicy: true})
		if code, body, _ := post(t, "http://"+check.HTTPAddr(), "/v1/acquire", `{"policy":"exports","key":"ann","weight":10}`); code != 200 {
			t.Errorf("acquire of the whole max after the stop: %d %v; want 200 (the failed release sent before the stop)", code, body)
		}
		if !strings.Contains(logs.String(), `msg="in-flight releases sent before stop"`) {
			t.Errorf("no line for the releases sent at stop in:\n%s", logs)
		}
	})

	t.Run("Redis away for good", func(t *testing.T) {
		logs := new(syncBuffer)
		srv := start(logs)
		failedRelease(srv, "bob")
		defer r.Start(t)
		ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
		defer cancel()
		began := time.Now()
		srv.Shutdown(ctx)
		// The fleet's withdrawal and the lease return have bounds of their
		// own, past ctx's.
		if took := time.Since(began); took > 1500*time.Millisecond+2*leaseReturnTimeout+time.Second {
			t.Errorf("Shutdown with a 1.5s grace took %v", took)
		}
		want := `level=WARN msg="in-flight releases not sent before stop; their slots free at their hold timeout" releases=`
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no %q in:\n%s", want, logs)
		}
	})
}

// TestReleaseNotRetriedIsLogged: a release that fails (503) while
// sluice.MaxBackgroundReleases are being sent again is not sent again:
// the service logs it on a line of its own, paced, with the count
// dropped, and counts it as not_retried. Before, RetryRelease's error was
// discarded: nothing said the slot would stay held to its hold timeout.
// Not parallel: it fills the process's bound.
func TestReleaseNotRetriedIsLogged(t *testing.T) {
	r, srv, logs := slotsOnOwnRedis(t)
	base := "http://" + srv.HTTPAddr()
	var tokens []string
	for _, key := range []string{"ann", "bob"} {
		code, body, _ := post(t, base, "/v1/acquire", `{"policy":"exports","key":"`+key+`"}`)
		if code != 200 {
			t.Fatalf("acquire: %d %v", code, body)
		}
		tokens = append(tokens, tokenBody(body["token"]))
	}
	r.Stop()
	defer r.Start(t) // for the cleanup's Shutdown
	releasetest.Fill(t, time.Now().Add(2*time.Second))
	for _, tok := range tokens {
		if code, body, _ := post(t, base, "/v1/release", tok); code != 503 {
			t.Fatalf("release with Redis stopped: %d %v, want 503", code, body)
		}
	}
	labels := map[string]string{"policy": "exports", "call": "release"}
	labels["outcome"] = "not_retried"
	if v := metricValue(t, srv.Metrics().Registry(), "sluice_inflight_calls_total", labels); v != 2 {
		t.Errorf("not_retried releases = %v, want 2", v)
	}
	want := `level=WARN msg="` + enforce.DroppedReleaseMsg + `" policy=exports dropped=1 max_background=1024`
	if got := logs.String(); strings.Count(got, want) != 1 {
		t.Errorf("log:\n%s\nwant one line with %q (the second held back by the pacing)", got, want)
	}
}

// TestAbandonedNotSentIsCounted: the release of an acquire that failed
// (503: the acquire may have run on Redis) that finds
// sluice.MaxBackgroundReleases at work is not sent: the service counts it
// as not_retried and logs it on the same line, marked abandoned. Before,
// AcquireSlot dropped it without a word. Not parallel: it fills the
// process's bound.
func TestAbandonedNotSentIsCounted(t *testing.T) {
	r, srv, logs := slotsOnOwnRedis(t)
	base := "http://" + srv.HTTPAddr()
	r.Stop()
	defer r.Start(t) // for the cleanup's Shutdown
	releasetest.Fill(t, time.Now().Add(2*time.Second))
	if code, body, _ := post(t, base, "/v1/acquire", `{"policy":"exports","key":"ann"}`); code != 503 {
		t.Fatalf("acquire with Redis stopped: %d %v, want 503", code, body)
	}
	labels := map[string]string{"policy": "exports", "call": "release", "outcome": "not_retried"}
	if v := metricValue(t, srv.Metrics().Registry(), "sluice_inflight_calls_total", labels); v != 1 {
		t.Errorf("not_retried releases = %v, want 1", v)
	}
	want := `level=WARN msg="` + enforce.DroppedReleaseMsg + `" policy=exports dropped=1 max_background=1024 abandoned=true`
	if got := logs.String(); strings.Count(got, want) != 1 {
		t.Errorf("log:\n%s\nwant one line with %q", got, want)
	}
}

// slotsOnOwnRedis serves slotsConfig on a redis-server of its own, which
// the test may stop, with no failure policy and its log in text.
func slotsOnOwnRedis(t *testing.T) (*redistest.Server, *Server, *syncBuffer) {
	t.Helper()
	cfg := writeConfig(t, slotsConfig)
	r := redistest.StartServer(t)
	logs := new(syncBuffer)
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", NoFailurePolicy: true,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	return r, srv, logs
}

// TestFaultReleaseRetryEndsAtHold: a release that fails (Redis stalled) for a
// slot whose hold ends soon is sent again until that hold ends, not a
// whole hold after the failure: past it Redis has freed the slot anyway.
// A stop waits for it no longer either. Before, the retry went on, and a
// stop waited, until a hold after the failure (here 2 s past the slot's
// hold). Not parallel: the background releases are the process's.
func TestFaultReleaseRetryEndsAtHold(t *testing.T) {
	race.SkipTiming(t)
	const hold = 3 * time.Second
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), hold+5*time.Second)
		defer cancel()
		sluice.WaitReleases(ctx) // not to count in the next test's
	}()
	cfg := writeConfig(t, strings.Replace(slotsConfig, "hold: 30s", "hold: 3s", 1))
	r := redistest.StartServer(t)
	logs := new(syncBuffer)
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", NoFailurePolicy: true,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	base := "http://" + srv.HTTPAddr()
	code, body, _ := post(t, base, "/v1/acquire", `{"policy":"exports","key":"ann","weight":10}`)
	if code != 200 {
		t.Fatalf("acquire: %d %v", code, body)
	}
	holdEnd := time.Now().Add(hold) // Redis's is before: it answered first
	time.Sleep(2 * time.Second)
	r.Pause(t)
	defer r.Resume(t)
	if code, body, _ := post(t, base, "/v1/release", tokenBody(body["token"])); code != 503 {
		t.Fatalf("release with Redis stalled: %d %v, want 503", code, body)
	}
	if n, _ := srv.svc.pendingReleases(); n != 1 {
		t.Fatalf("%d releases sent again after the 503, want 1", n)
	}
	// The stop's wait for the releases sent again, Redis still stalled.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	srv.waitReleases(ctx)
	const slack = 500 * time.Millisecond
	if late := time.Since(holdEnd); late > slack {
		t.Errorf("the stop waited for the release sent again until %v past the slot's hold end, want at most %v", late, slack)
	}
	want := `msg="in-flight releases not sent before stop, their holds ended: Redis freed their slots" releases=1`
	if !strings.Contains(logs.String(), want) {
		t.Errorf("no %q in:\n%s", want, logs)
	}
	// The retry itself stops at the hold end: its try then is cut there.
	for sluice.PendingReleases() != 0 {
		if late := time.Since(holdEnd); late > slack {
			t.Fatalf("the release still sent again %v past the slot's hold end", late)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
