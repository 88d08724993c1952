package resilient_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/promsluice"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// records is a slog.Handler that keeps the records of one message.
type records struct {
	msg string
	mu  sync.Mutex
	got []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if rec.Message == r.msg {
		r.got = append(r.got, rec.Clone())
	}
	return nil
}

func (r *records) all() []slog.Record {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]slog.Record(nil), r.got...)
}

// attrs returns a record's attributes by key.
func attrs(rec slog.Record) map[string]slog.Value {
	m := map[string]slog.Value{}
	rec.Attrs(func(a slog.Attr) bool {
		m[a.Key] = a.Value
		return true
	})
	return m
}

// Calls that time out while the breaker stays closed are answered by the
// failure policy without a transition to tell it: a burst of them, Redis
// paused under 5 concurrent takes, is one WARN line with the store, the
// policy, the count and the first error; a later burst (of layered takes)
// is one more, with its own count; a burst (of in-flight acquires) still
// pending at Close is written by Close. The counts are those of
// sluice_store_calls_total{source="fallback"}, which counts the same
// decisions. Real Redis, paused with CLIENT PAUSE.
func TestFaultClosedBreakerAnswersLogged(t *testing.T) {
	race.SkipTiming(t)
	t.Parallel()
	srv := redistest.StartServer(t)
	admin := srv.Client(t)
	log := &records{msg: resilient.ClosedMsg}
	reg := prometheus.NewRegistry()
	col := promsluice.New(nil)
	reg.MustRegister(col)
	s, err := resilient.NewMulti(redisstore.New(srv.Client(t), &redisstore.Options{Prefix: redistest.Prefix(t)}),
		&resilient.Options{Name: "redis", Logger: slog.New(log), Observer: col})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	resilient.PaceClosedLines(s.Store, 300*time.Millisecond, time.Second)
	lim := sluice.PerSecond(1_000_000)
	ctx := context.Background()
	fallbacks := func() (n int64) {
		for _, op := range []string{"take", "take_all", "acquire"} {
			v, _ := promtest.Value(t, reg, "sluice_store_calls_total", map[string]string{"store": "redis", "op": op, "source": "fallback"})
			n += int64(v)
		}
		return n
	}
	// onRedis waits for a pause to end, without a take that could fail
	// (a run of failures over DeadAfter would open the breaker), then
	// takes from Redis.
	onRedis := func() {
		t.Helper()
		if err := admin.Ping(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		if d, err := s.Take(ctx, "warm", lim, 1); err != nil || d.Source != sluice.SourceBackend {
			t.Fatalf("take after the pause: %+v, %v; want Redis's answer", d, err)
		}
	}
	// burst pauses Redis and sends n calls of op at once, which all time
	// out: takes, layered takes or in-flight acquires.
	burst := func(op string, n int) {
		t.Helper()
		if err := admin.Do(ctx, "CLIENT", "PAUSE", 1000).Err(); err != nil {
			t.Fatal(err)
		}
		before := fallbacks()
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				key := fmt.Sprint("k", i)
				var src sluice.Source
				var err error
				switch op {
				case "take":
					var d sluice.Decision
					d, err = s.Take(ctx, key, lim, 1)
					src = d.Source
				case "take_all":
					var ds []sluice.Decision
					ds, err = s.TakeAll(ctx, []sluice.Request{{Key: key + "a", Limit: lim, Cost: 1}, {Key: key + "b", Limit: lim, Cost: 1}})
					if err == nil {
						src = ds[0].Source
					}
				case "acquire":
					var d sluice.SlotDecision
					d, err = s.Acquire(ctx, key, sluice.Concurrent(10, time.Second), 1, "h")
					src = d.Source
				}
				if err != nil || src != sluice.SourceFallback {
					t.Errorf("%s in a pause: answered by %v, %v; want the fallback", op, src, err)
				}
			})
		}
		wg.Wait()
		if got := fallbacks() - before; got != int64(n) {
			t.Fatalf("sluice_store_calls_total{source=fallback} grew by %d for %d %ss the fallback answered", got, n, op)
		}
	}
	// lineFor waits for line i and checks it.
	lineFor := func(i int, decisions int64) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for len(log.all()) <= i && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(400 * time.Millisecond) // longer than gather: a second line would show
		got := log.all()
		if len(got) != i+1 {
			t.Fatalf("%d lines, want %d", len(got), i+1)
		}
		rec, a := got[i], attrs(got[i])
		err, _ := a["error"].Any().(error)
		if rec.Level != slog.LevelWarn || a["store"].String() != "redis" || a["policy"].String() != "local" ||
			a["decisions"].Int64() != decisions || !errors.Is(err, resilient.ErrTimeout) {
			t.Errorf("line %d: %v %q %v; want WARN, store redis, policy local, %d decisions, a timeout", i, rec.Level, rec.Message, a, decisions)
		}
	}

	for range 25 { // calls that succeed: 5 failures of 30 open no breaker
		onRedis()
	}
	burst("take", 5)
	lineFor(0, 5)
	onRedis()
	burst("take_all", 3)
	lineFor(1, 3)
	onRedis()
	burst("acquire", 2)
	if err := s.Close(); err != nil { // before the quiet second is up
		t.Fatal(err)
	}
	if got := log.all(); len(got) != 3 || attrs(got[2])["decisions"].Int64() != 2 {
		t.Errorf("after Close: %d lines; want a third, for 2 decisions", len(got))
	}
	if st := s.State(); st != sluice.BreakerClosed {
		t.Errorf("breaker %v, want closed throughout", st)
	}
	if got, want := fallbacks(), int64(10); got != want {
		t.Errorf("sluice_store_calls_total{source=fallback} = %d, want %d: the decisions the lines count", got, want)
	}
}
