package server

import (
	"context"
	"encoding/json"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/server/config"
)

// Counts racing with a bucket rollover are all kept: goroutines count while
// the clock crosses several buckets, and the buckets sum to every count.
func TestStatsRolloverLosesNothing(t *testing.T) {
	t.Parallel()
	var now atomic.Int64
	now.Store(time.Unix(1_700_000_000, 0).UnixNano())
	s := newStats(func() time.Time { return time.Unix(0, now.Load()) })
	r := s.setPolicies([]*config.Policy{{Name: "p"}})["p"]
	const workers, each, buckets = 8, 5000, 10
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				if w == 0 && i%(each/buckets) == 0 {
					now.Add(int64(StatsBucket)) // one goroutine moves the clock on
				}
				s.add(r, i%3 == 0)
			}
		}()
	}
	wg.Wait()
	var allowed, denied int64
	for _, ser := range s.Snapshot() {
		for i := range ser.Allowed {
			allowed += ser.Allowed[i]
			denied += ser.Denied[i]
		}
	}
	wantDenied := int64(workers * ((each + 2) / 3))
	if allowed+denied != workers*each || denied != wantDenied {
		t.Errorf("counted %d allowed + %d denied, want %d + %d", allowed, denied, workers*each-wantDenied, wantDenied)
	}
}

// A bucket's counts are not reported once its slot is reused 60 buckets
// later, nor before.
func TestStatsWindow(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(1_700_000_000, 0)
	now := t0
	s := newStats(func() time.Time { return now })
	r := s.setPolicies([]*config.Policy{{Name: "p"}})["p"]
	s.add(r, false)
	s.add(r, true)
	ser := s.Snapshot()[0]
	if ser.Allowed[StatsBuckets-1] != 1 || ser.Denied[StatsBuckets-1] != 1 {
		t.Fatalf("current bucket: %+v", ser)
	}
	now = t0.Add(StatsBucket * (StatsBuckets - 1))
	if ser := s.Snapshot()[0]; ser.Allowed[0] != 1 {
		t.Errorf("oldest bucket lost its count: %v", ser.Allowed)
	}
	now = t0.Add(StatsBucket * StatsBuckets)
	s.add(r, true) // the same slot, a new bucket
	ser = s.Snapshot()[0]
	if ser.Allowed[StatsBuckets-1] != 0 || ser.Denied[StatsBuckets-1] != 1 || ser.Allowed[0] != 0 {
		t.Errorf("after a full turn: allowed %v denied %v", ser.Allowed, ser.Denied)
	}
}

const storeErrorsConfig = `
policies:
  - name: dry
    limit: 5/min
    strategy: shadow
    key: "{ip}"
  - name: api
    limit: 100/min
    key: "{user}"
`

// TestStoreErrorsCountedAlike: under the error failure policy, with Redis
// stopped, the checks the store fails count alike in the metrics
// (outcome="error"), /v1/stats (the series' and the overview's errors)
// and the dashboard, through the JSON API and Envoy RLS: a shadow
// policy's too, though it lets its requests through (200, OK). The shadow
// policy's failures are logged once, with the cause, and their end once.
func TestStoreErrorsCountedAlike(t *testing.T) {
	r := redistest.StartServer(t)
	cfg := writeConfig(t, storeErrorsConfig)
	logs := &syncBuffer{}
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + r.Addr + "/0", NoFailurePolicy: true,
		Logger: slog.New(slog.NewJSONHandler(logs, nil))})
	p := &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}
	base := "http://" + p.http
	rls := dialRLS(t, p.grpc)
	if code, body, _ := post(t, base, "/v1/check", `{"policy":"dry","key":"1.2.3.4"}`); code != 200 {
		t.Fatalf("check with Redis up: %d %v", code, body)
	}
	r.Stop()
	for range 2 {
		if code, body, _ := post(t, base, "/v1/check", `{"policy":"dry","key":"1.2.3.4"}`); code != 200 {
			t.Errorf("shadow check with Redis stopped: %d %v, want 200 (a dry run never blocks)", code, body)
		}
		if got := render(call(t, rls, rlsRequest(config.DefaultDomain, desc("ip=1.2.3.4")))); !strings.HasPrefix(got, "OK:") {
			t.Errorf("shadow descriptor with Redis stopped: %s, want OK", got)
		}
	}
	if code, _, _ := post(t, base, "/v1/check", `{"policy":"api","key":"ann"}`); code != 503 {
		t.Errorf("check with Redis stopped: %d, want 503", code)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := rls.ShouldRateLimit(ctx, rlsRequest(config.DefaultDomain, desc("user=ann"))); status.Code(err) != codes.Unavailable {
		t.Errorf("RLS with Redis stopped: %v, want UNAVAILABLE", err)
	}

	want := map[string]int64{"dry": 4, "api": 2}
	for policy, n := range want {
		if got := scrapedMetric(t, p, `sluice_decisions_total{outcome="error",policy="`+policy+`"}`); got != strconv.FormatInt(n, 10) {
			t.Errorf("%s: decisions{outcome=error} = %q, want %d", policy, got, n)
		}
	}
	var st struct {
		Series   []Series `json:"series"`
		Overview Overview `json:"overview"`
	}
	if _, body := p.get(t, "/v1/stats"); json.Unmarshal([]byte(body), &st) != nil {
		t.Fatalf("/v1/stats: %s", body)
	}
	for _, s := range st.Series {
		var errs int64
		for _, e := range s.Errors {
			errs += e
		}
		if errs != want[s.Policy] {
			t.Errorf("/v1/stats series %s: %d errors, want %d", s.Policy, errs, want[s.Policy])
		}
	}
	for _, f := range st.Overview.Policies {
		if f.Errors != want[f.Policy] {
			t.Errorf("/v1/stats overview %s: %d errors, want %d", f.Policy, f.Errors, want[f.Policy])
		}
	}
	if o := st.Overview; o.Errors != 6 || o.Allowed != 1 || o.ErrorRatio != 6.0/7 {
		t.Errorf("overview: %d errors of %d allowed, ratio %v; want 6, 1, 6/7", o.Errors, o.Allowed, o.ErrorRatio)
	}
	if n := countLines(logs, "shadow policy's store call failed"); n != 1 || !strings.Contains(logs.String(), `"policy":"dry","misconfigured":false`) {
		t.Errorf("%d lines for the shadow policy's failures, want one naming it:\n%s", n, logs)
	}

	r.Start(t)
	deadline := time.Now().Add(10 * time.Second)
	for countLines(logs, "shadow policy's store calls succeeding again") == 0 && time.Now().Before(deadline) {
		post(t, base, "/v1/check", `{"policy":"dry","key":"1.2.3.4"}`)
		time.Sleep(50 * time.Millisecond)
	}
	if n := countLines(logs, "shadow policy's store calls succeeding again"); n != 1 {
		t.Errorf("%d lines for the shadow policy's recovery, want 1:\n%s", n, logs)
	}
}
