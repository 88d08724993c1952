package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/storetest"
)

// The in-flight differential test: random traces of acquire, extend and
// release on a few keys drive the Lua scripts and memory/inflight.go with
// one fake clock, and every step must answer the same, RetryAfter to the
// microsecond.
//
// Redis TTLs run in real time while the fake clock jumps: the clock moves
// on a grid of inflightDiffGrid and holds are multiples of it, so a key with
// a live holder has at least that TTL, and the test raises the key's TTL
// to an hour right after each call.
const (
	inflightDiffTraces = 4
	inflightDiffSteps  = 3000
	inflightDiffKeys   = 3
	inflightDiffGrid   = 250 * time.Millisecond
)

// A release that finds no holder leaves a tombstone, living the longest
// hold its Store has used, which refuses that id's next acquire: ids come
// back often here, so traces check that too. Every store first acquires
// with the longest hold a trace uses, so that their tombstones live alike.
//
// Odd traces send each call through one of two Stores on the one Redis
// (two processes): a holder acquired by one is extended and released by
// either, so that a Store's young holders are released elsewhere and
// their ids come back with other weights. Those traces keep each key's
// hold: a young holder that another process extends with a shorter hold
// may be released by ZREM after that hold ends (BENCHMARKS.md).
func TestInFlightDifferential(t *testing.T) {
	seed := diffSeed(t)
	t.Logf("seed %d (%s=%d to repeat)", seed, diffSeedEnv, seed)
	for trace := range inflightDiffTraces {
		t.Run(fmt.Sprintf("trace%d", trace), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 0x1f<<8|uint64(trace)))
			runInFlightTrace(t, r, 1+trace%2)
		})
	}
}

func runInFlightTrace(t *testing.T, r *rand.Rand, stores int) {
	ctx := context.Background()
	client := redistest.Client(t)
	clock := storetest.NewClock(storetest.T0)
	mem := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
	t.Cleanup(func() { mem.Close() })
	prefix := redistest.Prefix(t)
	var reds []*redisstore.Store
	for range stores {
		reds = append(reds, redisstore.New(client, &redisstore.Options{Prefix: prefix, Clock: clock.Now}))
	}
	red := reds[0]
	longest := sluice.Concurrent(1, inflightDiffGrid*44)
	for _, st := range []sluice.Slots{mem, reds[0], reds[len(reds)-1]} {
		if d, err := st.Acquire(ctx, "warm", longest, 1, "w"); err != nil || !d.Allowed {
			t.Fatalf("Acquire(warm) = %+v, %v", d, err)
		}
	}
	type key struct {
		name  string
		limit sluice.InFlightLimit
	}
	keys := make([]key, inflightDiffKeys)
	for i := range keys {
		keys[i] = key{fmt.Sprintf("k%d", i), sluice.Concurrent(1+r.Int64N(10), inflightDiffGrid*time.Duration(4+r.IntN(40)))}
	}
	// k0 is wide, with many holders.
	keys[0].limit.Max = 20 + r.Int64N(30)
	var history []string
	seen := map[string]int{} // outcomes, so that a trace cannot pass vacuously
	var expired int64
	for step := range inflightDiffSteps {
		clock.Advance(inflightDiffGrid * time.Duration(r.IntN(5)))
		k := keys[r.IntN(len(keys))]
		l := k.limit
		red = reds[r.IntN(len(reds))]
		if r.IntN(4) == 0 && stores == 1 { // now and then a hold of its own
			l.Hold = inflightDiffGrid * time.Duration(4+r.IntN(40))
		}
		holder := fmt.Sprintf("h%d", r.IntN(12))
		if k.name == "k0" {
			holder = fmt.Sprintf("h%d", r.IntN(64))
		}
		var m, d string
		switch op := r.IntN(10); {
		case op < 5:
			w := 1 + r.Int64N(min(l.Max, 4))
			md, merr := mem.Acquire(ctx, k.name, l, w, holder)
			rd, rerr := red.Acquire(ctx, k.name, l, w, holder)
			expired += md.Expired
			m, d = fmt.Sprintf("acquire w%d %+v %v", w, md, merr), fmt.Sprintf("acquire w%d %+v %v", w, rd, rerr)
		case op < 7:
			mok, merr := mem.Extend(ctx, k.name, l, holder)
			rok, rerr := red.Extend(ctx, k.name, l, holder)
			m, d = fmt.Sprintf("extend %v %v", mok, merr), fmt.Sprintf("extend %v %v", rok, rerr)
		default:
			mok, merr := mem.Release(ctx, k.name, holder)
			rok, rerr := red.Release(ctx, k.name, holder)
			m, d = fmt.Sprintf("release %v %v", mok, merr), fmt.Sprintf("release %v %v", rok, rerr)
		}
		for _, rk := range red.SlotKeys(k.name) {
			client.PExpire(ctx, rk, time.Hour)
			// Holders and their weights, tombstones, and 4 others.
			if n := client.ZCard(ctx, rk).Val(); n > 3*64+4 {
				t.Fatalf("step %d: %s has %d members", step, rk, n)
			}
		}
		seen[outcome(m)]++
		history = append(history, fmt.Sprintf("%d %v %s %s: %s", step, clock.Now().Sub(storetest.T0), k.name, holder, m))
		if m != d {
			from := max(0, len(history)-30)
			for _, h := range history[from:] {
				t.Log(h)
			}
			t.Fatalf("step %d: memory %s\n                     redis  %s", step, m, d)
		}
	}
	t.Logf("outcomes: %v", seen)
	for _, o := range []string{"acquired", "denied", "refused", "extend true", "extend false", "release true", "release false"} {
		if seen[o] == 0 {
			t.Errorf("no %q in the trace", o)
		}
	}
	if expired == 0 {
		t.Error("no acquire removed an expired holder in the trace")
	}
	// Once every hold has run out, an acquire removes every holder and the
	// script's release that follows (from a store that does not know the
	// holder young) deletes the Redis key.
	clock.Advance(time.Hour)
	other := redisstore.New(client, &redisstore.Options{Prefix: prefix, Clock: clock.Now})
	for _, k := range keys {
		if _, err := red.Acquire(ctx, k.name, k.limit, 1, "last"); err != nil {
			t.Fatal(err)
		}
		if ok, err := other.Release(ctx, k.name, "last"); err != nil || !ok {
			t.Fatalf("Release = %v, %v", ok, err)
		}
		if n := client.Exists(ctx, red.SlotKeys(k.name)...).Val(); n != 0 {
			t.Errorf("%s: %d Redis keys left after every hold ended", k.name, n)
		}
	}
}

// On the server's clock: a slot's key expires a hold after the last hold
// ends (the TTL is set about once a hold). A young holder's release is one
// ZREM, which leaves the key without holders to that TTL; the script's
// release of the last holder deletes it.
func TestInFlightKeysExpire(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	ctx := context.Background()
	prefix := redistest.Prefix(t)
	s := redisstore.New(client, &redisstore.Options{Prefix: prefix})
	l := sluice.Concurrent(2, 5*time.Second)
	a, _, err := sluice.AcquireSlot(ctx, s, "k", l, 1)
	if err != nil || a == nil {
		t.Fatalf("AcquireSlot = %v, %v", a, err)
	}
	for _, k := range s.SlotKeys("k") {
		if ttl := client.PTTL(ctx, k).Val(); ttl <= 9*time.Second || ttl > 10*time.Second {
			t.Errorf("%s: TTL %v, want just under twice the 5s hold", k, ttl)
		}
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	for _, k := range s.SlotKeys("k") {
		if n := client.ZCount(ctx, k, "(0", "+inf").Val(); n != 0 {
			t.Errorf("%s: %d holders left after the last release", k, n)
		}
		if ttl := client.PTTL(ctx, k).Val(); ttl > 10*time.Second {
			t.Errorf("%s: TTL %v after the last release, want at most twice the hold", k, ttl)
		}
	}
	// The script's release (an id it does not know is young) deletes it.
	if d, err := s.Acquire(ctx, "k", l, 1, "b"); err != nil || !d.Allowed || d.InUse != 1 {
		t.Fatalf("Acquire = %+v, %v", d, err)
	}
	other := redisstore.New(client, &redisstore.Options{Prefix: prefix})
	if ok, err := other.Release(ctx, "k", "b"); err != nil || !ok {
		t.Fatalf("Release by another store = %v, %v", ok, err)
	}
	if n := client.Exists(ctx, s.SlotKeys("k")...).Val(); n != 0 {
		t.Errorf("%d keys left after the script released the last holder", n)
	}
}

func outcome(step string) string {
	switch {
	case strings.Contains(step, "Allowed:true"):
		return "acquired"
	case strings.Contains(step, "Allowed:false") && strings.Contains(step, "RetryAfter:0s"): // a tombstone's
		return "refused"
	case strings.Contains(step, "Allowed:false"):
		return "denied"
	}
	return strings.TrimSuffix(step, " <nil>")
}

// The in-flight scripts survive a flushed script cache, batched or alone.
func TestInFlightNoScript(t *testing.T) {
	t.Parallel()
	client := redistest.Client(t)
	ctx := context.Background()
	for _, batch := range []int{0, 1} {
		s := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), MaxBatch: batch})
		l := sluice.Concurrent(1, time.Minute)
		client.ScriptFlush(ctx)
		if d, err := s.Acquire(ctx, "k", l, 1, "a"); err != nil || !d.Allowed {
			t.Fatalf("MaxBatch %d: Acquire after SCRIPT FLUSH = %+v, %v", batch, d, err)
		}
		client.ScriptFlush(ctx)
		if ok, err := s.Extend(ctx, "k", l, "a"); err != nil || !ok {
			t.Fatalf("MaxBatch %d: Extend after SCRIPT FLUSH = %v, %v", batch, ok, err)
		}
		client.ScriptFlush(ctx)
		if ok, err := s.Release(ctx, "k", "a"); err != nil || !ok {
			t.Fatalf("MaxBatch %d: Release after SCRIPT FLUSH = %v, %v", batch, ok, err)
		}
	}
}

// An acquire's scan removes exactly the expired holders and their weight
// members, and a denial's estimate counts holders in deadline order.
func TestInFlightScan(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := redistest.Client(t)
	clock := storetest.NewClock(storetest.T0)
	s := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now})
	short, long := sluice.Concurrent(100, time.Minute), sluice.Concurrent(100, time.Hour)
	acquire := func(h string, l sluice.InFlightLimit, w, inUse, expired int64) {
		t.Helper()
		d, err := s.Acquire(ctx, "k", l, w, h)
		if err != nil || !d.Allowed || d.InUse != inUse || d.Expired != expired {
			t.Fatalf("Acquire(%s) = %+v, %v; want allowed, %d in use, %d expired", h, d, err, inUse, expired)
		}
	}
	for i := range 10 {
		acquire(fmt.Sprint("s", i), short, 2, int64(2*i+2), 0)
	}
	for i := range 40 {
		acquire(fmt.Sprint("l", i), long, 1, int64(21+i), 0)
	}
	for i := range 35 {
		if ok, err := s.Release(ctx, "k", fmt.Sprint("l", i)); err != nil || !ok {
			t.Fatalf("Release(l%d) = %v, %v", i, ok, err)
		}
	}
	clock.Advance(time.Minute)
	acquire("x", long, 3, 8, 20) // the 10 short holds of weight 2 expired
	key := s.SlotKeys("k")[0]
	if n := client.ZCard(ctx, key).Val(); n != 6+1+3 {
		t.Errorf("after the scan: %d members, want 6 holders, a weight and 3 others", n)
	}
	clock.Advance(time.Minute)
	acquire("y", long, 1, 9, 0)
	// 9 held; a weight of 5 over Max 10 needs 4 freed: l35..l38, whose
	// hold ends 58 minutes from now.
	d, err := s.Acquire(ctx, "k", sluice.Concurrent(10, time.Hour), 5, "z")
	if err != nil || d.Allowed || d.RetryAfter != 58*time.Minute {
		t.Errorf("Acquire over Max = %+v, %v; want denied for 58m", d, err)
	}
}

// sent records the name of every command a client sends.
type sent struct {
	mu    sync.Mutex
	names []string
}

func (s *sent) DialHook(next redis.DialHook) redis.DialHook { return next }
func (s *sent) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		s.mu.Lock()
		s.names = append(s.names, cmd.Name())
		s.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (s *sent) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (s *sent) take() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.names
	s.names = nil
	return n
}

// A holder of weight 1 released early in its hold is one ZREM, no script;
// released later, or of a greater weight, it goes by the script, which
// checks the deadline. The shortcut answers as the script would: an id
// whose hold ended, then acquired again with another weight and extended,
// is released whole.
func TestInFlightYoungRelease(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := redistest.Client(t)
	var log sent
	client.AddHook(&log)
	clock := storetest.NewClock(storetest.T0)
	s := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now, MaxBatch: 1})
	l := sluice.Concurrent(10, 10*time.Second)
	acquire := func(h string, w, inUse int64) {
		t.Helper()
		if d, err := s.Acquire(ctx, "k", l, w, h); err != nil || !d.Allowed || d.InUse != inUse {
			t.Fatalf("Acquire(%s, %d) = %+v, %v; want allowed, %d in use", h, w, d, err, inUse)
		}
	}
	release := func(h string, want bool, cmd string) {
		t.Helper()
		log.take()
		if ok, err := s.Release(ctx, "k", h); err != nil || ok != want {
			t.Fatalf("Release(%s) = %v, %v; want %v", h, ok, err, want)
		}
		// (EVALSHA may be followed by EVAL, when the server has yet to
		// load the script.)
		if got := log.take(); len(got) == 0 || got[0] != cmd || cmd == "zrem" && len(got) != 1 {
			t.Errorf("Release(%s) sent %v, want %s", h, got, cmd)
		}
	}
	acquire("a", 1, 1)
	clock.Advance(4 * time.Second)
	release("a", true, "zrem")
	release("a", false, "evalsha") // forgotten: the script says
	acquire("b", 1, 1)
	acquire("c", 2, 3)
	clock.Advance(6 * time.Second) // b is half-way through its hold
	release("b", true, "evalsha")
	release("c", true, "evalsha")
	// Left: a's tombstone (its second release found no holder), with its
	// count and the key's end.
	if got := client.ZRange(ctx, s.SlotKeys("k")[0], 0, -1).Val(); strings.Join(got, " ") != "t X xa" {
		t.Errorf("members left after every release: %q, want a's tombstone alone", got)
	}

	// d's hold ends unreleased; the id comes back with weight 3 and is
	// extended: its release must free all 3.
	acquire("d", 1, 1)
	clock.Advance(11 * time.Second)
	acquire("e", 1, 1) // removes d
	acquire("d", 3, 4)
	if ok, err := s.Extend(ctx, "k", l, "d"); err != nil || !ok {
		t.Fatalf("Extend(d) = %v, %v", ok, err)
	}
	release("d", true, "evalsha")
	acquire("f", 1, 2)
}

// An id released by another process and acquired again with a greater
// weight: the Store that acquired it first, and still takes it for young,
// finds no weight-1 member to ZREM (so it can never take part of the
// heavier holder away), and its script releases the heavier holder, as
// the memory store would; the key's sums stay right (nothing is left when
// every holder is gone).
func TestInFlightYoungIDReused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := redistest.Client(t)
	clock := storetest.NewClock(storetest.T0)
	prefix := redistest.Prefix(t)
	a := redisstore.New(client, &redisstore.Options{Prefix: prefix, Clock: clock.Now})
	b := redisstore.New(client, &redisstore.Options{Prefix: prefix, Clock: clock.Now})
	l := sluice.Concurrent(4, 10*time.Second)
	acquire := func(s *redisstore.Store, w int64, h string, allowed bool, inUse int64) {
		t.Helper()
		if d, err := s.Acquire(ctx, "k", l, w, h); err != nil || d.Allowed != allowed || d.InUse != inUse {
			t.Fatalf("Acquire(%d, %s) = %+v, %v; want allowed %v, %d in use", w, h, d, err, allowed, inUse)
		}
	}
	release := func(s *redisstore.Store, h string, want bool) {
		t.Helper()
		if ok, err := s.Release(ctx, "k", h); err != nil || ok != want {
			t.Fatalf("Release(%s) = %v, %v; want %v", h, ok, err, want)
		}
	}
	acquire(a, 1, "x", true, 1)
	release(b, "x", true)
	acquire(b, 3, "x", true, 3)
	acquire(a, 2, "y", false, 3)
	release(a, "x", true)
	release(b, "x", false) // a tombstone of x
	acquire(a, 4, "y", true, 4)
	release(a, "y", true)
	if got := client.ZRange(ctx, a.SlotKeys("k")[0], 0, -1).Val(); strings.Join(got, " ") != "t X xx" {
		t.Errorf("members left after every holder is gone: %q, want x's tombstone alone", got)
	}
	clock.Advance(10 * time.Second) // the tombstone ends: the last release deletes the key
	acquire(a, 1, "z", true, 1)
	release(b, "z", true)
	if n := client.Exists(ctx, a.SlotKeys("k")...).Val(); n != 0 {
		t.Errorf("members left after every holder and tombstone is gone: %v", client.ZRangeWithScores(ctx, a.SlotKeys("k")[0], 0, -1).Val())
	}
}

// An extend whose answer is lost (its context ended while Redis was
// paused) may have run with another hold: the Store forgets the holder as
// young, so its release goes by the script, which checks the deadline.
func TestInFlightYoungLostExtend(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.StartServer(t)
	client := srv.Client(t)
	admin := srv.Client(t)
	clock := storetest.NewClock(storetest.T0)
	s := redisstore.New(client, &redisstore.Options{Clock: clock.Now})
	long, short := sluice.Concurrent(4, 10*time.Second), sluice.Concurrent(4, 2*time.Second)
	if d, err := s.Acquire(ctx, "k", long, 1, "x"); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	if ok, err := s.Extend(ctx, "k", long, "x"); err != nil || !ok { // loads the script
		t.Fatal(ok, err)
	}
	if err := admin.Do(ctx, "client", "pause", "300", "write").Err(); err != nil {
		t.Fatal(err)
	}
	ectx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if _, err := s.Extend(ectx, "k", short, "x"); err == nil {
		t.Fatal("Extend returned before Redis answered")
	}
	cancel()
	time.Sleep(400 * time.Millisecond) // the extend runs once the pause ends
	clock.Advance(3 * time.Second)     // past the short hold; under half the long one
	if ok, err := s.Release(ctx, "k", "x"); err != nil || ok {
		t.Fatalf("Release of a holder whose (short) hold ended = %v, %v; want false", ok, err)
	}
}

// Goroutines of two Stores acquire (weights 1 to 3), extend and release
// four shared ids at random: once every id is released, the whole Max is
// free (no member or weight left behind).
func TestInFlightYoungConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	client := redistest.Client(t)
	prefix := redistest.Prefix(t)
	ss := []*redisstore.Store{
		redisstore.New(client, &redisstore.Options{Prefix: prefix}),
		redisstore.New(client, &redisstore.Options{Prefix: prefix}),
	}
	l := sluice.Concurrent(8, time.Hour)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 500 {
				s := ss[r.IntN(len(ss))]
				h := fmt.Sprint("h", r.IntN(4))
				var err error
				switch r.IntN(3) {
				case 0:
					_, err = s.Acquire(ctx, "k", l, 1+r.Int64N(3), h)
				case 1:
					_, err = s.Extend(ctx, "k", l, h)
				default:
					_, err = s.Release(ctx, "k", h)
				}
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	fresh := redisstore.New(client, &redisstore.Options{Prefix: prefix})
	for i := range 4 {
		if _, err := fresh.Release(ctx, "k", fmt.Sprint("h", i)); err != nil {
			t.Fatal(err)
		}
	}
	if d, err := ss[0].Acquire(ctx, "k", l, 8, "all"); err != nil || !d.Allowed || d.InUse != 8 {
		t.Errorf("every holder released: Acquire(8 of 8) = %+v, %v; members %v", d, err, client.ZRangeWithScores(ctx, ss[0].SlotKeys("k")[0], 0, -1).Val())
	}
}

// ReleaseOnce frees a slot and remembers its release for the time asked,
// in the same script: sent again within it, it reports the slot released
// before (and remembers it again); after it, or for a holder never held,
// not held. Both keys live in one hash slot, so it runs on a cluster too.
func TestInFlightReleaseOnce(t *testing.T) {
	t.Parallel()
	redistest.Each(t, func(t *testing.T, client redis.UniversalClient) {
		ctx := context.Background()
		clock := storetest.NewClock(storetest.T0)
		s := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t), Clock: clock.Now})
		l := sluice.Concurrent(3, 10*time.Second)
		release := func(h string, remember time.Duration, released, before bool) {
			t.Helper()
			r, b, err := s.ReleaseOnce(ctx, "k", h, remember)
			if err != nil || r != released || b != before {
				t.Fatalf("ReleaseOnce(%s) = %v, %v, %v; want %v, %v", h, r, b, err, released, before)
			}
		}
		for _, h := range []string{"a", "b"} {
			if d, err := s.Acquire(ctx, "k", l, 1, h); err != nil || !d.Allowed {
				t.Fatalf("Acquire(%s) = %+v, %v", h, d, err)
			}
		}
		if d, err := s.Acquire(ctx, "k", l, 2, "w"); err == nil && d.Allowed {
			t.Fatalf("Acquire(w, 2) over max = %+v", d)
		}
		release("a", 5*time.Second, true, false) // young: still by the script
		release("a", 5*time.Second, true, true)
		if d, err := s.Acquire(ctx, "k", l, 2, "w"); err != nil || !d.Allowed || d.InUse != 3 {
			t.Fatalf("a released, Acquire(w, 2) = %+v, %v; want allowed, 3 in use", d, err)
		}
		release("w", 5*time.Second, true, false) // a heavier holder
		clock.Advance(4 * time.Second)
		release("a", 5*time.Second, true, true) // remembered again from now
		clock.Advance(4 * time.Second)
		release("a", 5*time.Second, true, true)
		clock.Advance(5 * time.Second)
		release("a", 5*time.Second, false, false) // forgotten
		release("never", 5*time.Second, false, false)
		if ok, err := s.Release(ctx, "k", "b"); err != nil || ok {
			t.Fatalf("Release(b) past its hold = %v, %v; want false", ok, err)
		}
		release("b", 5*time.Second, false, false) // expired, not released
		if _, _, err := s.ReleaseOnce(ctx, "k", "b", 0); !errors.Is(err, sluice.ErrInvalidLimit) {
			t.Errorf("ReleaseOnce remembering 0 = %v, want ErrInvalidLimit", err)
		}
	})
}

// A release whose reply is lost after Redis ran it (here: its caller gave
// up during a CLIENT PAUSE, and it ran when the pause ended) is answered
// "released before" when sent again: Release alone would say not held.
func TestInFlightReleaseOnceLostReply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv := redistest.StartServer(t)
	client, admin := srv.Client(t), srv.Client(t)
	s := redisstore.New(client, nil)
	l := sluice.Concurrent(1, 10*time.Second)
	if d, err := s.Acquire(ctx, "k", l, 1, "x"); err != nil || !d.Allowed {
		t.Fatal(d, err)
	}
	if _, _, err := s.ReleaseOnce(ctx, "k", "other", time.Second); err != nil { // loads the script
		t.Fatal(err)
	}
	if err := admin.Do(ctx, "client", "pause", "300", "write").Err(); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if _, _, err := s.ReleaseOnce(rctx, "k", "x", 10*time.Second); err == nil {
		t.Fatal("ReleaseOnce returned before Redis answered")
	}
	cancel()
	time.Sleep(400 * time.Millisecond) // the release runs once the pause ends
	if ok, err := s.Release(ctx, "k", "x"); err != nil || ok {
		t.Fatalf("Release after the lost one = %v, %v; want false: it ran", ok, err)
	}
	if released, before, err := s.ReleaseOnce(ctx, "k", "x", 10*time.Second); err != nil || !released || !before {
		t.Errorf("ReleaseOnce sent again = %v, %v, %v; want released before", released, before, err)
	}
}

// TestFaultAbandonedAcquire: an acquire that times out while Redis is
// stalled runs when Redis resumes, for a holder nobody knows. AcquireSlot
// releases it in the background, and a failure policy's holder is
// released in Redis too when its Slot is: either way the key's only slot
// is free again within a few seconds of the resume, not after its hold of
// an hour.
func TestFaultAbandonedAcquire(t *testing.T) {
	ctx := context.Background()
	l := sluice.Concurrent(1, time.Hour)
	for _, tc := range []struct {
		name      string
		resilient bool
	}{{"bare store: AcquireSlot errs", false}, {"failure policy: Slot.Release", true}} {
		t.Run(tc.name, func(t *testing.T) {
			srv := redistest.StartServer(t)
			c := srv.Client(t)
			rs := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
			if _, err := rs.Acquire(ctx, "warm", l, 1, "w"); err != nil { // the script loaded
				t.Fatal(err)
			}
			var store sluice.Slots = rs
			if tc.resilient {
				fb := memory.New(nil)
				t.Cleanup(func() { fb.Close() })
				r, err := resilient.New(rs, &resilient.Options{Policy: resilient.FallbackLocal, Timeout: 100 * time.Millisecond, Fallback: fb, Nodes: 1})
				if err != nil {
					t.Fatal(err)
				}
				store = r
			}
			srv.Pause(t)
			wait := 100 * time.Millisecond // the bare store's caller gives up
			if tc.resilient {
				wait = time.Second // the failure policy's Timeout, 100 ms, answers first
			}
			actx, cancel := context.WithTimeout(ctx, wait)
			slot, d, err := sluice.AcquireSlot(actx, store, "k", l, 1)
			cancel()
			switch {
			case tc.resilient && (err != nil || !d.Allowed || d.Source != sluice.SourceFallback):
				t.Fatalf("AcquireSlot with Redis paused = %+v, %v; want the fallback's slot", d, err)
			case !tc.resilient && err == nil:
				t.Fatalf("AcquireSlot with Redis paused = %+v, nil; want an error", d)
			}
			srv.Resume(t)
			if slot != nil {
				if err := slot.Release(ctx); err != nil {
					t.Fatal(err)
				}
			}
			waitFree(t, rs, l)
		})
	}
	// Under a breaker that opens during the outage, the holders denied by
	// the policy are released past it, straight to Redis.
	t.Run("failure policy: breaker open", func(t *testing.T) {
		srv := redistest.StartServer(t)
		c := srv.Client(t)
		rs := redisstore.New(c, &redisstore.Options{Prefix: redistest.Prefix(t)})
		many := sluice.Concurrent(100, time.Hour)
		if _, err := rs.Acquire(ctx, "warm", many, 1, "w"); err != nil {
			t.Fatal(err)
		}
		r, err := resilient.New(rs, &resilient.Options{Policy: resilient.FailClosed, Timeout: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		srv.Pause(t)
		for end := time.Now().Add(800 * time.Millisecond); time.Now().Before(end); {
			actx, cancel := context.WithTimeout(ctx, time.Second)
			if _, d, err := sluice.AcquireSlot(actx, r, "k", many, 1); err != nil || d.Allowed {
				t.Errorf("AcquireSlot with Redis paused = %+v, %v; want the policy's denial", d, err)
			}
			cancel()
		}
		if r.State() != sluice.BreakerOpen {
			t.Errorf("breaker %v after 800ms of failures, want open", r.State())
		}
		srv.Resume(t)
		waitFree(t, rs, many)
	})
}

// waitFree waits until key k holds no holder in rs, 5 s at most.
func waitFree(t *testing.T, rs *redisstore.Store, l sluice.InFlightLimit) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for {
		holder := sluice.NewHolderID()
		d, err := rs.Acquire(ctx, "k", l, l.Max, holder)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			rs.Release(ctx, "k", holder)
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the resume key k still has holders: %+v", d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
