package server

import (
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// A look (cost 0) at a key whose denial the deny cache holds must not
// answer "allowed" on the deny cache's word.
func TestLookAtCachedDenial(t *testing.T) {
	addr := redistest.Addr(t)
	cfg := writeConfig(t, "domain: d\npolicies:\n  - name: api\n    limit: fixed_window 1/1h\n")
	srv := runServer(t, Options{ConfigFile: cfg, RedisURL: "redis://" + addr + "/0"})
	p := &proc{http: srv.HTTPAddr()}
	key := redistest.Prefix(t) + "k"
	body := `{"policy":"api","key":"` + key + `"}`
	if code, m := p.post(t, "/v1/check", body); code != 200 {
		t.Fatalf("first check: %d %v", code, m)
	}
	for i := 0; i < 3; i++ {
		if code, m := p.post(t, "/v1/check", body); code != 429 {
			t.Fatalf("check over the limit: %d %v", code, m)
		}
	}
	look := `{"policy":"api","key":"` + key + `","cost":0}`
	code, m := p.post(t, "/v1/check", look)
	t.Logf("look: %d %v", code, m)
	if m["source"] == "deny_cache" && m["allowed"] == true {
		t.Fatalf("look answered allowed from the deny cache: %d %v", code, m)
	}
	// A look is never refused; the cached denial it tells has its wait.
	if code != 200 || m["shadow_denied"] != nil || m["remaining"] != 0.0 {
		t.Fatalf("look: %d %v, want 200 with remaining 0 and no shadow_denied", code, m)
	}
	if m["source"] == "deny_cache" {
		if m["allowed"] != false || m["retry_after_ms"].(float64) <= 0 {
			t.Errorf("look from the deny cache: %v, want allowed false with its wait", m)
		}
	} else if m["allowed"] != true {
		t.Errorf("look from the store: %v, want allowed true", m)
	}
}
