package server

import (
	"context"
	"net"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/internal/redistest"
)

// TestServerTakeOnReplicaCause: Redis turned into a replica (REPLICAOF)
// under a running service refuses every take with READONLY, behind the
// store's own words ("redisstore: ... take: READONLY ..."): each is
// counted with cause topology, none as unreachable.
func TestServerTakeOnReplicaCause(t *testing.T) {
	t.Parallel()
	master := redistest.StartServer(t)
	r := redistest.StartServer(t)
	var logs syncBuffer
	_, p := startOnRedis(t, "redis://"+r.Addr, "error", &logs) // every decision goes to Redis
	if code, _ := p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=a"}`); code != 200 {
		t.Fatalf("check with Redis a master: %d", code)
	}
	host, port, _ := net.SplitHostPort(master.Addr)
	if err := r.Client(t).ReplicaOf(context.Background(), host, port).Err(); err != nil {
		t.Fatal(err)
	}
	const series = `sluice_store_errors_total{cause="topology",op="take",store="redis"}`
	if !eventually(func() bool {
		p.post(t, "/v1/check", `{"policy":"rl.foo","key":"foo=a"}`)
		got := scrapedMetric(t, p, series)
		return got != "" && got != "0"
	}) {
		_, body := p.get(t, "/metrics")
		t.Fatalf("no take counted as %s:\n%s", series, grepLines(body, "sluice_store_errors_total"))
	}
	if _, body := p.get(t, "/metrics"); strings.Contains(body, `sluice_store_errors_total{cause="unreachable"`) {
		t.Errorf("takes refused by a replica counted as unreachable:\n%s", grepLines(body, "sluice_store_errors_total"))
	}
}

// grepLines returns text's lines that contain word.
func grepLines(text, word string) string {
	var b strings.Builder
	for line := range strings.Lines(text) {
		if strings.Contains(line, word) {
			b.WriteString(line)
		}
	}
	return b.String()
}
