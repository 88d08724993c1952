package server

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// maxKeysConfig: one unit an hour, so that every key a check takes from
// has taken its whole limit, and a full store evicts one of them.
const maxKeysConfig = "policies:\n  - name: login\n    limit: 1/hour\n"

// TestCLIMaxKeys: --max-keys bounds the memory store of sluice serve, the
// embedded one and, with --redis, the local failure policy's (Redis
// unreachable here, so the policy answers every check; a fleet of one,
// named, takes the whole limit). At 64 keys, one a shard, 1,000 keys
// evict a denied key, which is admitted again, and the evictions are told
// (a WARN line; /v1/status degraded, with the count); at the default
// (1,000,000) the same flood leaves it denied, and evicts nothing. The
// start line names the bound.
func TestCLIMaxKeys(t *testing.T) {
	t.Parallel()
	cfg := writeConfig(t, maxKeysConfig)
	dead := "redis://" + redistest.DeadAddr(t)
	for _, tt := range []struct {
		name    string
		env     []string
		args    []string
		started string // the start line's store.max_keys; "" on Redis
		evicted bool
	}{
		{"memory, default", nil, nil, "1000000", false},
		{"memory, --max-keys 64", nil, []string{"--max-keys", "64"}, "64", true},
		{"memory, SLUICE_MAX_KEYS=64", []string{"SLUICE_MAX_KEYS=64"}, nil, "64", true},
		{"local failure policy, --max-keys 64", nil, []string{"--redis", dead, "--fleet-size", "1", "--max-keys", "64"}, "", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--config", cfg, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, tt.args...)
			p := startSluice(t, tt.env, args...)
			if got := p.started["store.max_keys"]; got != tt.started {
				t.Errorf("start line: store.max_keys=%q, want %q (%v)", got, tt.started, p.started)
			}
			check := func(key string) int {
				code, body := p.post(t, "/v1/check", fmt.Sprintf(`{"policy":"login","key":%q}`, key))
				if code != 200 && code != 429 {
					t.Fatalf("check %s: %d %v", key, code, body)
				}
				return code
			}
			if a, b := check("victim"), check("victim"); a != 200 || b != 429 {
				t.Fatalf("victim: %d then %d, want 200 then 429 under 1/hour\n%s", a, b, p.stderr.String())
			}
			for i := range 1000 {
				check(fmt.Sprint("flood-", i))
			}
			if got := check("victim") == 200; got != tt.evicted {
				t.Errorf("after 1,000 other keys the victim is admitted: %v, want %v", got, tt.evicted)
			}
			code, body := p.get(t, "/v1/status")
			var st Status
			if err := json.Unmarshal([]byte(body), &st); code != 200 || err != nil || st.Store.Memory == nil {
				t.Fatalf("/v1/status: %d %s (%v)", code, body, err)
			}
			if mem := st.Store.Memory; (mem.EvictedKeys > 0) != tt.evicted || mem.Evicting != tt.evicted || mem.MaxKeys != map[bool]int{false: 1_000_000, true: 64}[tt.evicted] {
				t.Errorf("/v1/status store.memory %+v; evictions expected: %v", *mem, tt.evicted)
			}
			if tt.evicted {
				if r := p.expect(t, memoryEvictingMsg); r["level"] != "WARN" || r["max_keys"] != "64" || r["evicted"] == "" {
					t.Errorf("eviction line %v", r)
				}
			}
			p.stop(t)
		})
	}
	code, stderr := runSluice(t, nil, "serve", "--config", cfg, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--max-keys", "0")
	if code != 2 || !strings.Contains(stderr, "--max-keys 0: want 1 or more") {
		t.Errorf("--max-keys 0: exit %d, stderr %q; want 2 and the flag named", code, stderr)
	}
}
