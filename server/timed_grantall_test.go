package server

import (
	"context"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// The service's timing wrapper (no failure policy) keeps the store's
// GrantAll, so that a layered leased request's grants still go in one
// call, and counts each grant in it as the grant or regrant it is.
func TestTimedStoreKeepsGrantAll(t *testing.T) {
	m := NewMetrics()
	m.storeName = "redis"
	rs := redisstore.New(redistest.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	ga, ok := timedStore(rs, m).(sluice.GrantAller)
	if !ok {
		t.Fatal("timedStore(redisstore) is no GrantAller: a layered leased TakeAll's grants go one call each")
	}
	limit := sluice.PerSecond(100)
	ctx := context.Background()
	first := ga.GrantAll(ctx, []sluice.GrantRequest{{Key: "a", Limit: limit, N: 10}, {Key: "b", Limit: limit, N: 10}})
	for i, r := range first {
		if r.Err != nil || r.Grant.Granted != 10 {
			t.Fatalf("grant %d: %+v", i, r)
		}
	}
	again := ga.GrantAll(ctx, []sluice.GrantRequest{{Key: "a", Limit: limit, N: 5, Grant: first[0].Grant, Unused: 4}})
	if again[0].Err != nil || again[0].Grant.Granted != 5 {
		t.Fatalf("regrant: %+v", again[0])
	}
	w := httptest.NewRecorder()
	m.Handler().ServeHTTP(w, httptest.NewRequest("GET", "/metrics", nil))
	body, _ := io.ReadAll(w.Body)
	for _, want := range []string{`sluice_store_calls_total{op="grant",source="backend",store="redis"} 2`, `sluice_store_calls_total{op="regrant",source="backend",store="redis"} 1`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("metrics lack %s:\n%s", want, grepLines(string(body), "sluice_store"))
		}
	}
}
