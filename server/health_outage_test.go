//go:build unix

package server

import (
	"context"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// TestFaultDownForFromFirstFailure: Redis frozen (SIGSTOP) or killed
// under load through sluice serve, whose watch checks every second. The
// watch declares the store lost a check or more after the first decision
// failed; `store back`'s down_for counts from that first failure: at least
// the outage (stop to restart) less a little, at most stop to the line.
func TestFaultDownForFromFirstFailure(t *testing.T) {
	race.SkipTiming(t)
	const outage = 2500 * time.Millisecond
	for _, how := range []string{"sigstop", "kill"} {
		t.Run(how, func(t *testing.T) {
			r := startRedis(t)
			f := startFleet(t, r.url(), 1, "policies:\n  - name: api\n    limit: fixed_window 1000000000/1h\n", "--failure-policy", "local")
			p := f.procs[0]
			l := f.drive(2, "k", "api")
			defer l.finish()
			time.Sleep(300 * time.Millisecond)
			stopped := time.Now()
			if how == "sigstop" {
				r.pause(t)
			} else {
				r.Stop()
			}
			time.Sleep(outage)
			if how == "sigstop" {
				r.resume(t)
			} else {
				r.restart(t) // returns once Redis is ready
			}
			restarted := time.Now()
			var line string
			for deadline := time.Now().Add(10 * time.Second); line == ""; time.Sleep(5 * time.Millisecond) {
				for l := range strings.Lines(p.stderr.String()) {
					if strings.Contains(l, `msg="store back"`) {
						line = l
					}
				}
				if time.Now().After(deadline) {
					t.Fatalf("no store back line:\n%s", p.stderr.String())
				}
			}
			seen := time.Now()
			_, v, ok := strings.Cut(line, "down_for=")
			if !ok {
				t.Fatalf("store back line %q: no down_for", line)
			}
			downFor, err := time.ParseDuration(strings.Fields(v)[0])
			if err != nil {
				t.Fatalf("store back line %q: %v", line, err)
			}
			// The decisions in flight at the stop fail within the decision
			// timeout (or at once, refused).
			const tolerance = 200 * time.Millisecond
			if lo, hi := restarted.Sub(stopped)-tolerance, seen.Sub(stopped); downFor < lo || downFor > hi {
				t.Errorf("down_for=%v, want within [%v, %v] (stop to restart %v, less %v; stop to the line seen):\n%s",
					downFor, lo, hi, restarted.Sub(stopped), tolerance, p.stderr.String())
			}
		})
	}
}

// TestFaultStoreLostIdleAtOnce: under every failure policy an instance
// no request reaches learns that Redis was killed from the watch's next
// check, which says so as it starts (a refused dial), not once go-redis
// has retried for its 1 s timeout; one in flight at the kill says so as
// soon as its redial is refused (TestFaultStoreLostMidCheck). /v1/status's
// since is that check's start, so `store back`'s down_for counts from it:
// the outage less up to one check interval at its start, plus up to one
// at its end.
func TestFaultStoreLostIdleAtOnce(t *testing.T) {
	race.SkipTiming(t)
	// Each policy has its Redis and process of their own, and the trials
	// mostly wait out outages: run side by side, the test takes one's time.
	for _, policy := range []string{"error", "local"} {
		t.Run(policy, func(t *testing.T) {
			t.Parallel()
			storeLostIdleAtOnce(t, policy)
		})
	}
}

func storeLostIdleAtOnce(t *testing.T, policy string) {
	r := startRedis(t)
	p := startSluice(t, nil, "--config", "testdata/envoy-example.yaml", "--redis", r.url(),
		"--failure-policy", policy, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0")
	count := func(msg string) int { return strings.Count(p.stderr.String(), `msg="`+msg+`"`) }
	const trials, outage = 5, 1500 * time.Millisecond
	for i := range trials {
		time.Sleep(rand.N(time.Second))
		// Before Stop: it returns once the process is gone and its port
		// held, by when a check may have met the refused dial.
		killed := time.Now()
		r.Stop()
		for count("store lost") < i+1 {
			if time.Since(killed) > 5*time.Second {
				t.Fatalf("no store lost line 5s after Redis was killed:\n%s", p.stderr.String())
			}
			time.Sleep(2 * time.Millisecond)
		}
		seen := time.Now()
		_, st := p.getJSON(t, "/v1/status")
		since, err := time.Parse(time.RFC3339Nano, st["store"].(map[string]any)["since"].(string))
		if err != nil {
			t.Fatal(err)
		}
		// The watch checks every second; its check is told at once. A
		// check that started before the kill met it mid-call: since is
		// its start, and it is told once the redial is refused.
		after, told := since.Sub(killed), seen.Sub(killed)
		if after > 0 {
			told = seen.Sub(since)
		}
		t.Logf("trial %d: since %v after the kill, store lost seen %v after the later of since and the kill", i, after, told)
		if after < -100*time.Millisecond || after > 1300*time.Millisecond || told > 300*time.Millisecond {
			t.Errorf("trial %d: since %v after the kill, store lost seen %v after the later of since and the kill; want within [-100ms, 1.3s] and 300ms", i, after, told)
		}
		time.Sleep(outage - time.Since(killed))
		r.restart(t)
		for count("store back") < i+1 {
			if time.Since(killed) > 10*time.Second {
				t.Fatalf("no store back line:\n%s", p.stderr.String())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// TestFaultStoreLostMidCheck: Redis killed while a check's call is in
// flight (its writes paused, so that the check's pings passed and its
// access script waits) is told by that check as soon as the redial is
// refused: store lost, unreachable. go-redis alone retries the cut call
// and the refused dial until the check's 1 s deadline, which reads as a
// stall. The watch is off (an hour): the test runs the checks.
func TestFaultStoreLostMidCheck(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	var logs syncBuffer
	srv := runServer(t, Options{
		ConfigFile: "testdata/envoy-example.yaml", RedisURL: r.url(), NoFailurePolicy: true,
		StoreCheckInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	type result struct {
		err error
		at  time.Time // when it ended
	}
	check := func() result {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second) // the watch's
		defer cancel()
		err := srv.health.check(ctx)
		return result{err, time.Now()}
	}
	const trials = 3
	for i := range trials {
		admin := r.client()
		if err := admin.Do(context.Background(), "client", "pause", 5000, "write").Err(); err != nil {
			t.Fatal(err)
		}
		admin.Close()
		done := make(chan result, 1)
		go func() { done <- check() }()
		time.Sleep(200 * time.Millisecond)
		select {
		case res := <-done:
			t.Fatalf("trial %d: the check ended with Redis's writes paused (%v): its script was not held", i, res.err)
		default:
		}
		killed := time.Now()
		r.Stop()
		res := <-done
		t.Logf("trial %d: the check in flight at the kill ended %v after it: %v", i, res.at.Sub(killed), res.err)
		if took := res.at.Sub(killed); took > 200*time.Millisecond || res.err == nil || cause(redisstore.Classify(res.err)) != "unreachable" {
			t.Errorf("trial %d: the check in flight at the kill ended %v after it with %v; want unreachable within 200ms", i, took, res.err)
		}
		if n := countLines(&logs, "store lost"); n != i+1 {
			t.Errorf("trial %d: %d store lost lines, want %d:\n%s", i, n, i+1, logs.String())
		}
		r.restart(t)
		if res := check(); res.err != nil {
			t.Fatalf("trial %d: check after the restart: %v", i, res.err)
		}
	}
	if strings.Contains(logs.String(), "cause=stalled") {
		t.Errorf("a killed Redis told as stalled:\n%s", logs.String())
	}
}

// TestFaultReadyzRedisKilled: under the error policy, /readyz is 503 soon
// after Redis is killed (its port refusing connections), by the request's
// own check, not a second later by the watch's. A real sluice serve, Redis
// killed 20 times at a random point of the watch's 1 s interval, /readyz
// asked every 5 ms.
func TestFaultReadyzRedisKilled(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	p := serveErrorPolicy(t, r)
	client := &http.Client{Timeout: 5 * time.Second}
	readyz := func() int {
		resp, err := client.Get("http://" + p.http + "/readyz")
		if err != nil {
			t.Fatalf("readyz: %v", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}
	// until asks /readyz every 5 ms until it answers code, and returns
	// how long that took.
	until := func(code int, what string) time.Duration {
		start := time.Now()
		for readyz() != code {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("readyz not %d 10s after %s", code, what)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return time.Since(start)
	}
	const trials = 20
	var lags []time.Duration
	for i := range trials {
		if i > 0 {
			r.restart(t)
		}
		until(200, "Redis started")
		time.Sleep(rand.N(time.Second))
		r.Stop()
		lags = append(lags, until(503, "Redis was killed"))
	}
	slices.Sort(lags)
	p50, p95, worst := lags[trials/2], lags[trials*95/100], lags[trials-1]
	t.Logf("Redis killed to /readyz 503 over %d trials: p50 %v, p95 %v, max %v", trials, p50, p95, worst)
	// The watch checks every second: a lag near that is the watch's.
	if p95 > 250*time.Millisecond || worst > 500*time.Millisecond {
		t.Errorf("Redis killed to /readyz 503: p50 %v, p95 %v, max %v over %d trials; want p95 within 250ms and max within 500ms (the watch's interval is 1s): %v",
			p50, p95, worst, trials, lags)
	}
}

// serveErrorPolicy runs `sluice serve` on the Envoy example against r,
// under the error policy, so that every outage shows in its answers.
func serveErrorPolicy(t *testing.T, r *redisProc) *proc {
	t.Helper()
	return startSluice(t, nil, "--config", "testdata/envoy-example.yaml", "--redis", r.url(),
		"--failure-policy", "error", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0")
}

// TestFaultIsolatedTimeoutNotOutageStart: a decision that timed out while
// Redis went on answering (CLIENT PAUSE of 150 ms, against a 50 ms
// decision timeout) is not the start of an outage that comes later
// without a check between: once Redis is killed, the store lost's since,
// and the store back's down_for, count from the kill's failures. Before,
// they counted from that timeout, as TestFaultDownForFromFirstFailure/kill
// once saw under load (a timeout 260 ms before the kill, down_for over its
// bound).
func TestFaultIsolatedTimeoutNotOutageStart(t *testing.T) {
	race.SkipTiming(t)
	r := redistest.StartServer(t)
	srv, p, logs := serveChecked(t, "redis://"+r.Addr)
	stop := keepCalling(2, 2*time.Millisecond, func(int) { sendKey(p, "api", "k") })
	defer stop()
	time.Sleep(300 * time.Millisecond)
	if err := r.Client(t).Do(context.Background(), "CLIENT", "PAUSE", "150", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	logged(t, logs, "failure policy answered failed calls (breaker still closed)")
	time.Sleep(500 * time.Millisecond) // Redis answers the decisions again
	killed := time.Now()
	r.Stop()
	time.Sleep(200 * time.Millisecond) // decisions fail
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.health.check(ctx); err == nil {
		t.Fatal("the check passed with Redis killed")
	}
	st := srv.health.Status()
	// The decisions in flight at the kill started within the decision
	// timeout before it.
	if early := killed.Sub(st.Store.Since); st.Store.Up || early > 100*time.Millisecond {
		t.Errorf("store up %v, since %v before the kill, want lost, since at most 100ms before it (the pause's timeouts were over 500ms before):\n%s",
			st.Store.Up, early, logs.String())
	}
	r.Start(t)
	if err := srv.health.check(ctx); err != nil {
		t.Fatalf("check with Redis back: %v", err)
	}
	line := logged(t, logs, `msg="store back"`)
	downFor, err := time.ParseDuration(logValue(line, "down_for"))
	if err != nil {
		t.Fatalf("store back line %q: %v", line, err)
	}
	// down_for counts from the outage's first failure (since, checked
	// above to be at most 100ms before the kill, not the pause's 500ms
	// before), and is logged to the ms, rounded.
	if hi := time.Since(st.Store.Since) + time.Millisecond; downFor > hi {
		t.Errorf("down_for=%v, want at most %v, the outage's first failure (%v before the kill) to the line", downFor, hi, killed.Sub(st.Store.Since))
	}
}
