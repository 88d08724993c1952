package resilient

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/storetest"
)

// The default fallback keeps time by Options.Clock, as the breaker and the
// deny cache do: with Redis refusing connections, a key the fallback
// denied for an hour is admitted again once the injected clock has moved
// an hour, while the real clock has not.
func TestDefaultFallbackUsesClock(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	clk := storetest.NewClock(t0)
	s := newStore(t, redisstore.New(c, nil), &Options{Clock: clk.Now, Logger: discard})
	lim := sluice.PerHour(1)
	take := func(what string, want bool) {
		t.Helper()
		d, err := s.Take(context.Background(), "k", lim, 1)
		if err != nil || d.Allowed != want || d.Source != sluice.SourceFallback {
			t.Fatalf("%s: %+v, %v; want allowed=%v by the fallback", what, d, err, want)
		}
	}
	take("first take", true)
	take("second take", false)
	clk.Advance(time.Hour)
	take("an hour later by the injected clock", true)
}

// evictionRecorder is a recorder that also adds up EvictionEvents.
type evictionRecorder struct {
	recorder
	keys atomic.Uint64
}

func (e *evictionRecorder) ObserveEvictions(ev sluice.EvictionEvent) { e.keys.Add(ev.Keys) }

// The default fallback that evicts keys during an outage says so as
// sluice serve's memory store does: one WARN line when it starts, an
// EvictionEvent per growth, FallbackEvictions reporting it, and one INFO
// line once it has stopped for a minute.
func TestDefaultFallbackEvictionsTold(t *testing.T) {
	t.Parallel()
	c := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	clk := storetest.NewClock(t0)
	log, obs := &lines{}, &evictionRecorder{}
	s := newStore(t, redisstore.New(c, nil), &Options{Clock: clk.Now, Logger: slog.New(log), Observer: obs, FallbackMaxKeys: 64})
	flood := func(from int) {
		for i := range 200 {
			if d, err := s.Take(context.Background(), fmt.Sprint("k", from+i), sluice.PerHour(10), 1); err != nil || d.Source != sluice.SourceFallback {
				t.Fatalf("take: %+v, %v; want a fallback decision", d, err)
			}
		}
	}
	count := func(msg string) (n int) {
		for _, l := range log.all() {
			if strings.HasPrefix(l, msg) {
				n++
			}
		}
		return n
	}
	const on, off = "resilient: fallback store evicting keys", "resilient: fallback store no longer evicting keys"
	flood(0)
	clk.Advance(2 * time.Second)
	flood(1000)
	ev, evicting := s.FallbackEvictions()
	if ev.Keys == 0 || !evicting {
		t.Fatalf("FallbackEvictions = %+v, %v after 400 keys into 64: want evictions, evicting", ev, evicting)
	}
	if got := obs.keys.Load(); got != ev.Keys {
		t.Errorf("EvictionEvents add up to %d keys, FallbackEvictions says %d", got, ev.Keys)
	}
	if count(on) != 1 || count(off) != 0 {
		t.Errorf("lines %q: want one %q and no %q", log.all(), on, off)
	}
	clk.Advance(evictQuiet + 2*time.Second)
	if _, evicting := s.FallbackEvictions(); evicting {
		t.Error("still evicting after a quiet minute")
	}
	if count(on) != 1 || count(off) != 1 {
		t.Errorf("lines %q: want one %q and one %q", log.all(), on, off)
	}
}
