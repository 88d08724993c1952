package redisstore

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// One dead master among live ones: calls fail and succeed in turn, and
// the episode is one line each way, not a pair per reload.
func TestReloaderEpisode(t *testing.T) {
	var logs bytes.Buffer
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	defer c.Close()
	r := &reloader{cluster: c, log: slog.New(slog.NewTextHandler(&logs, nil))}
	down := errors.New("dial tcp 127.0.0.1:7001: connect: connection refused")
	for range 20 {
		r.failed(down)
		r.succeeded()
	}
	if n := strings.Count(logs.String(), "cluster calls failing"); n != 1 {
		t.Errorf("%d failing lines, want 1:\n%s", n, logs.String())
	}
	if strings.Contains(logs.String(), "succeeding again") {
		t.Errorf("the episode ended while a node still failed:\n%s", logs.String())
	}
	r.lastBad.Store(time.Now().Add(-recoveredAfter).UnixNano())
	r.succeeded()
	if n := strings.Count(logs.String(), "succeeding again"); n != 1 {
		t.Errorf("%d succeeding lines after %v without failure, want 1:\n%s", n, recoveredAfter, logs.String())
	}
}
