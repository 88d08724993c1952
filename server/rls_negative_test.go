package server

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// is_negative_hits only looks, on sluice-format policies too: their cost
// stands in for hits the request leaves unsaid, not for negative ones. Over
// gRPC and Envoy's HTTP JSON form (/json), against Redis.
func TestRLSNegativeHitsTakeNothingRedis(t *testing.T) {
	store := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	svc := NewService(store, mustConfig(t, `
policies:
  - name: api
    limit: fixed_window 5/min
    key: "{api_key}"
  - name: costly
    limit: fixed_window 10/min
    cost: 3
    key: "{user}"
`), nil)
	c, base := serveRLS(t, svc), serveHTTP(t, svc)
	for range 6 {
		neg := desc("api_key=n1")
		neg.IsNegativeHits = true
		if got, want := render(call(t, c, rlsRequest("sluice", neg))), "OK: OK/5"; got != want {
			t.Fatalf("negative hits on api: got %q, want %q (looked, nothing taken)", got, want)
		}
		neg = desc("user=u1")
		neg.IsNegativeHits = true
		if got, want := render(call(t, c, rlsRequest("sluice", neg))), "OK: OK/10"; got != want {
			t.Fatalf("negative hits on costly: got %q, want %q", got, want)
		}
	}
	jsonCall := func(body string) (int, string) {
		t.Helper()
		resp, err := http.Post(base+"/json", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			OverallCode string
			Statuses    []struct{ LimitRemaining int }
		}
		b, _ := io.ReadAll(resp.Body)
		if err := json.Unmarshal(b, &out); err != nil || len(out.Statuses) != 1 {
			t.Fatalf("/json: %d %s", resp.StatusCode, b)
		}
		return out.Statuses[0].LimitRemaining, out.OverallCode
	}
	for range 6 {
		if rem, code := jsonCall(`{"domain":"sluice","descriptors":[{"entries":[{"key":"api_key","value":"n2"}],"is_negative_hits":true}]}`); rem != 5 || code != "OK" {
			t.Fatalf("/json negative hits: %s, %d remaining; want OK, 5", code, rem)
		}
	}
	// The counters are untouched: a real hit takes the first unit, or the
	// policy's cost.
	if got, want := render(call(t, c, rlsRequest("sluice", desc("api_key=n1")))), "OK: OK/4"; got != want {
		t.Errorf("hit after negative hits: got %q, want %q", got, want)
	}
	if got, want := render(call(t, c, rlsRequest("sluice", desc("user=u1")))), "OK: OK/7"; got != want {
		t.Errorf("costly hit after negative hits: got %q, want %q", got, want)
	}
	if rem, _ := jsonCall(`{"domain":"sluice","descriptors":[{"entries":[{"key":"api_key","value":"n2"}]}]}`); rem != 4 {
		t.Errorf("/json hit after negative hits: %d remaining, want 4", rem)
	}
}
