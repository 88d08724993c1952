package server

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/openloop"
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
	file := writeConfig(t, slowRedisConfig)
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

// pacedChecks runs callers goroutines for d, each posting a check of a key
// of its own every period (from a random phase), the first at once and the
// others joining one by one over ramp. It returns how many checks each
// source answered ("" for Redis) and their latencies, sorted.
func pacedChecks(p *proc, callers int, period, ramp, d time.Duration) (map[string]int, []time.Duration) {
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: callers}}
	defer client.CloseIdleConnections()
	var mu sync.Mutex
	sources := map[string]int{}
	lat := openloop.Paced(callers, period, ramp, d, func(c, i int) time.Duration {
		start := time.Now()
		src := checkSource(client, p, fmt.Sprint("c", c, ":", i))
		took := time.Since(start)
		mu.Lock()
		sources[src]++
		mu.Unlock()
		return took
	})
	return sources, lat
}

// TestFaultServeSlowRedisStaysInUse: `sluice serve` with its defaults
// (decision timeout 50ms) on a Redis behind a delaying proxy, 8 clients
// each sending a check every 20ms (joining over a second):
//
//   - round trip 20ms (40% of the timeout): at least 99% of the decisions
//     come from Redis, the failure policy never takes over, and the
//     connections to Redis stay few;
//   - round trip 60ms (above the timeout): the decisions fall back at the
//     timeout and the breaker opens.
func TestFaultServeSlowRedisStaysInUse(t *testing.T) {
	race.SkipTiming(t)
	const (
		callers = 8
		period  = 20 * time.Millisecond
	)
	p, proxy := serveBehindProxy(t)
	proxy.SetDelay(10 * time.Millisecond)
	before := proxy.Accepted()
	sources, lat := pacedChecks(p, callers, period, time.Second, 4*time.Second)
	n := len(lat)
	t.Logf("round trip 20ms: %d checks, %v; p50 %v, p99 %v; %d new Redis connections", n, sources, lat[n/2], lat[n*99/100], proxy.Accepted()-before)
	if sources[""]*100 < n*99 {
		t.Errorf("round trip 20ms: %d of %d decisions from Redis (%v), want at least 99%%", sources[""], n, sources)
	}
	if got := scrapedMetric(t, p, `sluice_fallback_transitions_total{to="on"}`); got != "" && got != "0" {
		t.Errorf("round trip 20ms: the failure policy took over %s times, want never", got)
	}
	// Each client has at most one check in flight; the service adds its
	// checks' and the fleet registry's connections.
	if got := proxy.Accepted() - before; got > 2*callers {
		t.Errorf("round trip 20ms: %d new Redis connections for %d clients, want at most %d", got, callers, 2*callers)
	}

	proxy.SetDelay(30 * time.Millisecond)
	sources, lat = pacedChecks(p, callers, period, 0, 3*time.Second)
	n = len(lat)
	t.Logf("round trip 60ms: %d checks, %v; p50 %v, p99 %v, slowest %v; %d Redis connections open", n, sources, lat[n/2], lat[n*99/100], lat[n-1], proxy.Open())
	if sources["fallback"]*10 < n*9 {
		t.Errorf("round trip 60ms: %d of %d decisions from the fallback (%v), want at least 90%%", sources["fallback"], n, sources)
	}
	if got := scrapedMetric(t, p, `sluice_fallback_transitions_total{to="on"}`); got == "" || got == "0" {
		t.Errorf("round trip 60ms: the failure policy never took over")
	}
	if p99 := lat[n*99/100]; p99 > 80*time.Millisecond {
		t.Errorf("round trip 60ms: p99 %v, want about the decision timeout (50ms) or less", p99)
	}
}

// TestFaultServeColdStartWarm: `sluice serve` started on a Redis 200ms
// away (round trip), its script cache empty, decision timeout 300ms: its
// first decisions, 8 at once, are Redis's, none meets a NOSCRIPT or dials
// a connection, and its breaker never opens, since the store is warmed
// (connections dialled, scripts loaded) before it serves. Cold, every one
// of the first calls paid a handshake or a NOSCRIPT and EVAL, two round
// trips or more, over the timeout, and the breaker opened once at start.
//
// The timeout is 1.5 round trips, so that a warm call has half a round
// trip to spare and a cold one overshoots by as much: with 40ms and 50ms a
// loaded machine's 10ms of scheduling delay sent a whole batch of warm
// calls to the fallback.
func TestFaultServeColdStartWarm(t *testing.T) {
	race.SkipTiming(t)
	srv := redistest.StartServer(t)
	rc := srv.Client(t)
	rc.ScriptFlush(t.Context())
	proxy := redistest.StartDelayProxy(t, srv.Addr)
	proxy.SetDelay(100 * time.Millisecond)
	file := writeConfig(t, slowRedisConfig)
	p := startSluice(t, nil, "--config", file, "--redis", "redis://"+proxy.Addr, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0",
		"--watch-interval", "0", "--failure-policy", "local", "--decision-timeout", "300ms")
	// The start's own access check meets one NOSCRIPT, before the warm-up.
	noScript := func() string {
		info, err := rc.Info(t.Context(), "errorstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		for line := range strings.Lines(info) {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "errorstat_NOSCRIPT:"); ok {
				return rest
			}
		}
		return "count=0"
	}
	scripts, dialled := noScript(), proxy.Accepted()
	var mu sync.Mutex
	sources := map[string]int{}
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for i := range 5 {
				src := checkSource(http.DefaultClient, p, fmt.Sprintf("k%d-%d", w, i))
				mu.Lock()
				sources[src]++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if sources[""] != 40 {
		t.Errorf("first 40 decisions by source %v, want all 40 from Redis", sources)
	}
	if got := noScript(); got != scripts {
		t.Errorf("NOSCRIPT errors at Redis %s after the first decisions, %s before: a script was not loaded by the warm-up", got, scripts)
	}
	// The store check's quick ping keeps one connection of its own, which
	// its first check dials, maybe meanwhile; cold, the decisions dialled 12.
	if got := proxy.Accepted() - dialled; got > 1 {
		t.Errorf("%d Redis connections dialled during the first decisions, want at most the store check's one: the warm-up dials the decisions'", got)
	}
	if got := scrapedMetric(t, p, `sluice_breaker_transitions_total{partition="",store="redis",to="open"}`); got != "" && got != "0" {
		t.Errorf("the breaker opened %s times at start", got)
	}
}
