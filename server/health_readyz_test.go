//go:build unix

package server

import (
	"io"
	"math/rand/v2"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
)

// TestFaultReadyzRedisKilled: under the error policy, /readyz is 503 soon
// after Redis is killed (its port refusing connections), by the request's
// own check, not a second later by the watch's. A real sluice serve, Redis
// killed 20 times at a random point of the watch's 1 s interval, /readyz
// asked every 5 ms.
func TestFaultReadyzRedisKilled(t *testing.T) {
	race.SkipTiming(t)
	r := startRedis(t)
	p := startSluice(t, nil, "--config", "testdata/envoy-example.yaml", "--redis", r.url(),
		"--failure-policy", "error", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0")
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
