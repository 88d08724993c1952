package enforce

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/releasetest"
	"github.com/sluicehq/sluice/redisstore"
)

// notRetried records the releases observed as failed and not sent again.
type notRetried struct {
	slotEvents
	n int
}

func (e *notRetried) ObserveSlot(ev sluice.SlotEvent) {
	e.slotEvents.ObserveSlot(ev)
	if ev.Op == sluice.SlotRelease && ev.NotRetried {
		e.mu.Lock()
		e.n++
		e.mu.Unlock()
	}
}

// A release that fails while sluice.MaxBackgroundReleases are being sent
// again is not sent again: it is observed as such (NotRetried, for the
// not_retried metric) and logged on a line of its own, paced, with the
// count dropped. Before, nothing told it from a release sent again but
// an attribute of the failures' line, which its pacing had mostly held
// back. Not parallel: it fills the process's bound.
func TestReleaseNotRetriedIsLoud(t *testing.T) {
	ctx := context.Background()
	r := redistest.StartServer(t)
	store := redisstore.New(r.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)})
	obs := &notRetried{}
	var logs logtest.Log
	rs := observedRules(t, store, obs, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(10, 30*time.Second), Key: ident})
	rs.SetLogger(logs.TextLogger())
	var held []*Held
	for range 3 {
		h, v, err := rs.Acquire(ctx, "k", sluice.PriorityCritical)
		if err != nil || !v.Allowed {
			t.Fatal(v, err)
		}
		held = append(held, h)
	}
	held[0].Release() // before the outage: freed
	r.Stop()
	held[1].Release() // sent again in the background
	releasetest.Fill(t, time.Now().Add(2*time.Second))
	held[2].Release() // no room
	if obs.n != 1 {
		t.Errorf("%d releases observed as not sent again, want 1; events: %s", obs.n, obs)
	}
	if n := obs.count("release/error"); n != 2 {
		t.Errorf("%d failed releases observed, want 2; events: %s", n, obs)
	}
	r.Start(t) // the one sent again lands
	out := logs.String()
	want := `level=WARN msg="sluice: ` + DroppedReleaseMsg + `" rule=one dropped=1 max_background=1024`
	if !strings.Contains(out, want) || strings.Count(out, "\n") != 2 {
		t.Errorf("log:\n%s\nwant the failures' line and one with %q", out, want)
	}
}

// The release of an abandoned acquire (the store failed: the acquire may
// have run) that finds sluice.MaxBackgroundReleases at work is not sent:
// it is observed as a release not sent again and logged on the same
// line, marked abandoned. Before, AcquireSlot dropped it without a word.
// Not parallel: it fills the process's bound.
func TestAbandonedNotSentIsLoud(t *testing.T) {
	ctx := context.Background()
	dead := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { dead.Close() })
	store := redisstore.New(dead, &redisstore.Options{Prefix: redistest.Prefix(t)})
	obs := &notRetried{}
	var logs logtest.Log
	rs := observedRules(t, store, obs, SlotSpec[string]{Name: "one", Limit: sluice.Concurrent(10, 30*time.Second), Key: ident})
	rs.SetLogger(logs.TextLogger())
	releasetest.Fill(t, time.Now().Add(2*time.Second))
	if _, _, err := rs.Acquire(ctx, "k", sluice.PriorityCritical); err == nil {
		t.Fatal("acquire with the store unreachable: no error")
	}
	if obs.n != 1 {
		t.Errorf("%d releases observed as not sent again, want 1; events: %s", obs.n, obs)
	}
	out := logs.String()
	want := `level=WARN msg="sluice: ` + DroppedReleaseMsg + `" rule=one dropped=1 max_background=1024 abandoned=true`
	if !strings.Contains(out, want) {
		t.Errorf("log:\n%s\nwant a line with %q", out, want)
	}
}
