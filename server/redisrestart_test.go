package server

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// markerHook calls at before a command writing the marker key is sent,
// alone or in a pipeline: the point of the watch's cycle after it read
// INFO and before its marker call reaches Redis.
type markerHook struct{ at func() }

func (markerHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h markerHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.before([]redis.Cmder{cmd})
		return next(ctx, cmd)
	}
}

func (h markerHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.before(cmds)
		return next(ctx, cmds)
	}
}

func (h markerHook) before(cmds []redis.Cmder) {
	for _, c := range cmds {
		if args := c.Args(); len(args) > 1 && c.Name() == "set" {
			if k, _ := args[1].(string); strings.HasPrefix(k, markerPrefix) {
				h.at()
				return
			}
		}
	}
}

// TestFaultRedisRestartAtMarkerNotFlush: Redis killed and restarted
// between the watch's INFO read and its marker call is a restart, never a
// flush. Before, the marker call reached the restarted server, which had
// lost the key, and was compared with the run_id of the INFO read from the
// killed one: "Redis flushed ... without a restart", and a restart too on
// the next poll.
func TestFaultRedisRestartAtMarkerNotFlush(t *testing.T) {
	t.Parallel()
	const restarts = 5
	r := redistest.StartServer(t)
	var logs syncBuffer
	w := newEvictionWatch(logs.TextLogger(), 50*time.Millisecond)
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { c.Close() })
	var armed atomic.Bool
	at, done, stop := make(chan struct{}), make(chan struct{}), make(chan struct{})
	c.AddHook(markerHook{at: func() {
		if armed.CompareAndSwap(true, false) {
			select {
			case at <- struct{}{}:
				select {
				case <-done:
				case <-stop:
				}
			case <-stop:
			}
		}
	}})
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		w.watch(stop, 50*time.Millisecond, c, func() bool { return false })
	}()
	t.Cleanup(func() { close(stop); <-ended })
	// The marker read once on this server, then killed and restarted at
	// the chosen point, each time.
	for i := 1; i <= restarts; i++ {
		time.Sleep(150 * time.Millisecond)
		armed.Store(true)
		select {
		case <-at:
		case <-time.After(5 * time.Second):
			t.Fatalf("restart %d: no marker call in 5s:\n%s", i, logs.String())
		}
		r.Stop()
		r.Start(t)
		done <- struct{}{}
		if !eventually(func() bool { return w.counts(r.Addr).restarts == int64(i) }) {
			t.Fatalf("restart %d: %d restarts told:\n%s", i, w.counts(r.Addr).restarts, logs.String())
		}
	}
	time.Sleep(200 * time.Millisecond) // a few more polls
	if n := w.counts(r.Addr); n.flushes != 0 || n.restarts != restarts || countLines(&logs, "Redis flushed") != 0 {
		t.Errorf("%d restarts between INFO and the marker call: %d flushes, %d restarts told, want 0 and %d:\n%s",
			restarts, n.flushes, n.restarts, restarts, logs.String())
	}
}

// TestRedisRestartAOFKeys: a Redis with appendonly yes, killed and
// restarted, loads every key from its AOF, and the `Redis restarted` line
// says how many keys it holds. Before, it gave rdb_last_load_keys_loaded,
// which under Redis 7's multi-part AOF counts only the base RDB (empty
// here): keys_loaded=0 with every key back.
func TestRedisRestartAOFKeys(t *testing.T) {
	t.Parallel()
	const keys = 210
	r := redistest.StartServer(t, "--appendonly", "yes", "--appendfsync", "always")
	var logs syncBuffer
	w := newEvictionWatch(logs.TextLogger(), 50*time.Millisecond)
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	t.Cleanup(func() { c.Close() })
	ctx := context.Background()
	pipe := c.Pipeline()
	for i := range keys {
		pipe.Set(ctx, fmt.Sprintf("k%d", i), "v", 0)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	stop, ended := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(ended)
		w.watch(stop, 50*time.Millisecond, c, func() bool { return false })
	}()
	t.Cleanup(func() { close(stop); <-ended })
	time.Sleep(150 * time.Millisecond) // a few polls on the first server
	r.Stop()
	r.Start(t)
	line := logged(t, &logs, "Redis restarted")
	if n, err := c.DBSize(ctx).Result(); err != nil || n != keys+1 { // and the marker key
		t.Fatalf("DBSIZE after the restart = %d, %v; want %d: the AOF lost keys", n, err, keys+1)
	}
	if !slices.Contains(strings.Fields(line), fmt.Sprintf("keyspace_keys=%d", keys+1)) || strings.Contains(line, "keys_loaded") {
		t.Errorf("Redis restarted line %q: want keyspace_keys=%d (the keys, the marker's among them), no keys_loaded", line, keys+1)
	}
}

// TestRedisRestartDropsHeldSlots: a Redis restarted without persistence
// has lost the in-flight slots it held; the instance that acquired them
// stops counting them as held when its watch sees the restart (one WARN
// line, sluice_redis_slots_lost_total), and counts those acquired since.
// Before, they stayed in the held figures (the dashboard, /v1/stats,
// sluice_inflight_held) until their hold timeout, here 30 s.
func TestRedisRestartDropsHeldSlots(t *testing.T) {
	checkSlotsLost(t, "restarted", func(r *redistest.Server) {
		time.Sleep(time.Second) // the slots older than the restarted server's start, in whole seconds
		r.Stop()
		r.Start(t)
	})
}

// TestRedisFlushDropsHeldSlots: a FLUSHALL erases the in-flight slots
// Redis held, as a restart without persistence does; the instance that
// acquired them stops counting them as held when its watch finds the
// marker gone. Before, the flush was told but they stayed in the held
// figures until their hold timeout, here 30 s.
func TestRedisFlushDropsHeldSlots(t *testing.T) {
	checkSlotsLost(t, "flushed", func(r *redistest.Server) {
		time.Sleep(300 * time.Millisecond) // the watch has looked at the marker since
		if err := r.Client(t).FlushAll(context.Background()).Err(); err != nil {
			t.Fatal(err)
		}
	})
}

// checkSlotsLost holds two slots (weight 7) through a service on a Redis
// without persistence, has lose make Redis lose them, and checks that the
// service stops counting them, in one WARN line saying Redis was event
// and in sluice_redis_slots_lost_total, and counts a slot acquired since.
func checkSlotsLost(t *testing.T, event string, lose func(*redistest.Server)) {
	r := redistest.StartServer(t) // --save '' --appendonly no
	logs := new(syncBuffer)
	srv := runServer(t, Options{ConfigFile: writeConfig(t, slotsConfig), RedisURL: "redis://" + r.Addr + "/0", NoFailurePolicy: true,
		StoreCheckInterval: 50 * time.Millisecond, Logger: logs.TextLogger()})
	base := "http://" + srv.HTTPAddr()
	acquire := func(key string, weight int) {
		t.Helper()
		if code, body, _ := post(t, base, "/v1/acquire", fmt.Sprintf(`{"policy":"exports","key":%q,"weight":%d}`, key, weight)); code != 200 {
			t.Fatalf("acquire %s: %d %v", key, code, body)
		}
	}
	held := func() int64 { return srv.svc.holds.held()["exports"] }
	lost := func() float64 {
		return metricValue(t, srv.Metrics().Registry(), "sluice_redis_slots_lost_total", map[string]string{"node": r.Addr})
	}
	acquire("ann", 4)
	acquire("bob", 3)
	if n := held(); n != 7 {
		t.Fatalf("held %d after the acquires, want 7", n)
	}
	if v := lost(); v != 0 {
		t.Fatalf("sluice_redis_slots_lost_total %v before Redis was %s, want 0", v, event)
	}
	lose(r)
	for deadline := time.Now().Add(5 * time.Second); held() != 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("held %d 5 s after Redis was %s, want 0 (its slots are gone); log:\n%s", held(), event, logs)
		}
	}
	want := `level=WARN msg="Redis ` + event + `: the in-flight slots acquired here that it held are gone; no longer counted as held" node=` + r.Addr + ` slots=2 weight=7`
	if got := logs.String(); strings.Count(got, want) != 1 {
		t.Errorf("log:\n%s\nwant one %q", got, want)
	}
	if v := lost(); v != 2 {
		t.Errorf("sluice_redis_slots_lost_total %v, want 2", v)
	}
	if v := metricValue(t, srv.Metrics().Registry(), "sluice_inflight_held", map[string]string{"policy": "exports"}); v != 0 {
		t.Errorf("sluice_inflight_held %v, want 0", v)
	}
	// The server holds the slots acquired since: they count.
	acquire("ann", 2)
	time.Sleep(200 * time.Millisecond) // a few polls more
	if n := held(); n != 2 {
		t.Errorf("held %d after an acquire on the %s Redis, want 2", n, event)
	}
}
