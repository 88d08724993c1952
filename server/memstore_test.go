package server

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// loginConfig is the review's: sliding_window_log 5/15m, keyed by the
// request's key.
const loginConfig = "domain: sluice\npolicies:\n  - name: login\n    limit: sliding_window_log 5/15m\n"

// TestMemoryEvictionEpisode: a flood of distinct keys through Envoy's API
// into a full memory store (--max-keys 640, 10 keys a shard) is told at
// once, one WARN line however long the flood goes on; /v1/status says
// degraded, with the reason and the store's figures, /readyz stays ready
// and says so, and the metrics count the evictions. The denied victim key
// stays denied (only flood keys are evicted). None for evictionQuietPolls
// polls ends the episode: one INFO line with its total, and the service is
// no longer degraded.
func TestMemoryEvictionEpisode(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, loginConfig)
	var logs syncBuffer
	srv := runServer(t, Options{
		ConfigFile: cfg, MaxKeys: 640, StoreCheckInterval: 50 * time.Millisecond, // quiet after 3 s
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	p := &proc{http: srv.HTTPAddr(), grpc: srv.GRPCAddr()}
	status := func() Status {
		t.Helper()
		code, body := p.get(t, "/v1/status")
		var st Status
		if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil {
			t.Fatalf("/v1/status: %d %s (%v)", code, body, err)
		}
		if st.Store.Memory == nil {
			t.Fatalf("/v1/status without store.memory: %s", body)
		}
		return st
	}
	if st := status(); st.Degraded || *st.Store.Memory != (MemoryStatus{MaxKeys: 640}) {
		t.Fatalf("before: %+v, memory %+v", st, *st.Store.Memory)
	}
	victim := func() int {
		code, _ := p.post(t, "/v1/check", `{"policy":"login","key":"victim@example.com"}`)
		return code
	}
	for i := range 6 {
		if code, want := victim(), map[bool]int{true: 200, false: 429}[i < 5]; code != want {
			t.Fatalf("victim attempt %d: %d, want %d", i+1, code, want)
		}
	}
	rls := dialRLS(t, p.grpc)
	next := 0
	flood := func(keys int) {
		for ; keys > 0; keys -= 128 {
			var ds []*rlcommon.RateLimitDescriptor
			for range min(keys, 128) {
				ds = append(ds, desc("policy=login", fmt.Sprint("key=flood-", next)))
				next++
			}
			call(t, rls, rlsRequest("sluice", ds...))
		}
	}
	flood(2000)
	line := logged(t, &logs, "memory store evicting keys", "level=WARN", "evicted=", "max_keys=640")
	for range 10 { // the flood goes on over polls
		flood(128)
		time.Sleep(20 * time.Millisecond)
	}
	if n := countLines(&logs, "memory store evicting keys"); n != 1 {
		t.Errorf("%d lines for one episode of evictions, want 1:\n%s", n, logs.String())
	}
	st := status()
	mem := *st.Store.Memory // a request's descriptors, taken at once, are never evicted for each other
	if !st.Degraded || !st.Ready || !strings.Contains(strings.Join(st.Reasons, "\n"), "memory store is full (--max-keys 640)") ||
		!mem.Evicting || mem.EvictingSince == nil || mem.EvictedKeys == 0 || mem.EvictedExhaustedKeys != 0 || mem.Keys > 640+128 || mem.MaxKeys != 640 {
		t.Errorf("during the flood: %+v, memory %+v", st, mem)
	}
	if code, body := p.get(t, "/readyz"); code != 200 || !strings.Contains(body, "degraded: the memory store is full") {
		t.Errorf("readyz while evicting: %d %q", code, body)
	}
	evicted, _ := strconv.ParseUint(scrapedMetric(t, p, `sluice_store_evicted_keys_total{store="memory"}`), 10, 64)
	if evicted < mem.EvictedKeys || scrapedMetric(t, p, `sluice_store_max_keys{store="memory"}`) != "640" ||
		scrapedMetric(t, p, `sluice_store_evicted_exhausted_keys_total{store="memory"}`) != "0" || scrapedMetric(t, p, "sluice_degraded") != "1" {
		t.Errorf("metrics during the flood: evicted %d (status %d), max_keys %s, exhausted %s, degraded %s", evicted, mem.EvictedKeys,
			scrapedMetric(t, p, `sluice_store_max_keys{store="memory"}`), scrapedMetric(t, p, `sluice_store_evicted_exhausted_keys_total{store="memory"}`),
			scrapedMetric(t, p, "sluice_degraded"))
	}
	if code := victim(); code != 429 {
		t.Errorf("victim after the flood: %d, want 429 (evicted?)", code)
	}
	end := logged(t, &logs, "memory store no longer evicting keys", "level=INFO", "evicted=", "lasted=")
	first, _ := strconv.ParseUint(logValue(line, "evicted"), 10, 64)
	total, _ := strconv.ParseUint(logValue(end, "evicted"), 10, 64)
	final := status()
	if first == 0 || total < first || total != final.Store.Memory.EvictedKeys || logValue(end, "exhausted") != "0" {
		t.Errorf("evicted %d at the start and %d in the episode; the store counts %+v:\n%s", first, total, *final.Store.Memory, logs.String())
	}
	if final.Degraded || final.Store.Memory.Evicting || scrapedMetric(t, p, "sluice_degraded") != "0" {
		t.Errorf("after the episode: %+v, memory %+v, sluice_degraded %s", final, *final.Store.Memory, scrapedMetric(t, p, "sluice_degraded"))
	}
}
