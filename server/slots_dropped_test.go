package server

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/enforce"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/releasetest"
)

// TestReleaseNotRetriedIsLogged: a release that fails (503) while
// sluice.MaxBackgroundReleases are being sent again is not sent again:
// the service logs it on a line of its own, paced, with the count
// dropped, and counts it as not_retried. Before, RetryRelease's error was
// discarded: nothing said the slot would stay held to its hold timeout.
// Not parallel: it fills the process's bound.
func TestReleaseNotRetriedIsLogged(t *testing.T) {
	cfg := writeConfig(t, slotsConfig)
	r := redistest.StartServer(t)
	logs := new(syncBuffer)
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", NoFailurePolicy: true,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
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
	cfg := writeConfig(t, slotsConfig)
	r := redistest.StartServer(t)
	logs := new(syncBuffer)
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", NoFailurePolicy: true,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
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
