package server

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// slowRedisConfig is one policy that admits every request the tests send.
const slowRedisConfig = `domain: sluice
policies:
  - name: api
    limit: gcra 1000000/1s
`

// serveBehindProxy starts a private Redis, a DelayProxy in front of it and
// `sluice serve` (default flags but args) on the proxy.
func serveBehindProxy(t *testing.T, args ...string) (*proc, *redistest.DelayProxy) {
	t.Helper()
	srv := redistest.StartServer(t)
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	file := filepath.Join(t.TempDir(), "sluice.yaml")
	if err := os.WriteFile(file, []byte(slowRedisConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	p := startSluice(t, nil, append([]string{"--config", file, "--redis", "redis://" + proxy.Addr,
		"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0"}, args...)...)
	return p, proxy
}

// checkSource posts a check of key under "api" and returns who answered
// ("" for Redis), or "error".
func checkSource(client *http.Client, p *proc, key string) string {
	resp, err := client.Post("http://"+p.http+"/v1/check", "application/json", strings.NewReader(`{"policy":"api","key":"`+key+`"}`))
	if err != nil {
		return "error"
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "error"
	}
	_, after, ok := strings.Cut(string(body), `"source":"`)
	if !ok {
		return ""
	}
	src, _, _ := strings.Cut(after, `"`)
	return src
}

// TestFaultServeSlowRedisRoundTrip: `sluice serve` on a Redis 20ms away
// (decision timeout 50ms) reports the round trip as
// sluice_redis_round_trip_seconds and logs one WARN line for it: a quarter
// of the timeout or more, one step from the failure policy.
func TestFaultServeSlowRedisRoundTrip(t *testing.T) {
	race.SkipTiming(t)
	p, proxy := serveBehindProxy(t)
	proxy.SetDelay(10 * time.Millisecond)
	stop := keepCalling(4, 20*time.Millisecond, func(w int) { checkSource(http.DefaultClient, p, "k"+strconv.Itoa(w)) })
	r := p.expect(t, "redisstore: Redis round trip over a quarter of the calls' deadline: they no longer wait to be batched, and fail once it nears the deadline")
	stop()
	if r["level"] != "WARN" || r["deadline"] != "50ms" {
		t.Errorf("the line %v: want level WARN, deadline 50ms", r)
	}
	got, err := strconv.ParseFloat(scrapedMetric(t, p, "sluice_redis_round_trip_seconds"), 64)
	if err != nil || got < 0.015 || got > 0.04 {
		t.Errorf("sluice_redis_round_trip_seconds %v (%v), Redis 20ms away", got, err)
	}
}
