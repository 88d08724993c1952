package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/memory"
	"github.com/sluicehq/sluice/storetest"
)

// watch is a go-redis hook that counts what a client sends and lets a test
// hold single commands or pipelines at a gate.
type watch struct {
	pipelines   atomic.Int64 // batches sent: pipelines, and merged runs sent alone
	merged      atomic.Int64 // runs of takeEachScript (several calls in one command)
	noscript    atomic.Int64 // batched commands that met NOSCRIPT
	evals       atomic.Int64 // EVAL commands sent in batches
	scriptLoads atomic.Int64

	holdOne, holdPipe *gate  // nil: no gate
	afterLoad         func() // runs after each SCRIPT LOAD
}

// gate holds the first command that reaches it until opened.
type gate struct {
	once    sync.Once
	reached chan struct{}
	open    chan struct{}
}

func newGate() *gate { return &gate{reached: make(chan struct{}), open: make(chan struct{})} }

func (g *gate) pass() {
	if g == nil {
		return
	}
	first := false
	g.once.Do(func() { first = true })
	if first {
		close(g.reached)
		<-g.open
	}
}

func (w *watch) DialHook(next redis.DialHook) redis.DialHook { return next }

func (w *watch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isMerged(cmd) { // a batch of one command: not pipelined
			w.holdPipe.pass()
			err := next(ctx, cmd)
			w.sent([]redis.Cmder{cmd})
			if isNoScript(err) && cmd.Err() == nil { // set on cmd once the hooks return
				w.noscript.Add(1)
			}
			return err
		}
		if cmd.Name() == "evalsha" {
			w.holdOne.pass()
		}
		err := next(ctx, cmd)
		w.loaded(cmd)
		return err
	}
}

// isMerged reports whether cmd is a run of takeEachScript.
func isMerged(cmd redis.Cmder) bool {
	args := cmd.Args()
	return len(args) > 1 && (args[1] == takeEachScript.sha || args[1] == takeEachScript.src)
}

// sent counts a batch of cmds, answered.
func (w *watch) sent(cmds []redis.Cmder) {
	w.pipelines.Add(1)
	for _, c := range cmds {
		if isNoScript(c.Err()) {
			w.noscript.Add(1)
		}
		if c.Name() == "eval" {
			w.evals.Add(1)
		}
		if isMerged(c) {
			w.merged.Add(1)
		}
	}
}

// loaded counts cmd if it is a SCRIPT LOAD, and runs afterLoad.
func (w *watch) loaded(cmd redis.Cmder) {
	if args := cmd.Args(); len(args) > 1 && cmd.Name() == "script" && args[1] == "load" {
		w.scriptLoads.Add(1)
		if w.afterLoad != nil {
			w.afterLoad()
		}
	}
}

// loads counts a watch's SCRIPT LOADs on the client of a cluster's node:
// the store loads scripts on the master a batch went to, not through the
// ClusterClient.
type loads struct{ w *watch }

func (l loads) DialHook(next redis.DialHook) redis.DialHook { return next }

func (l loads) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		l.w.loaded(cmd)
		return err
	}
}

func (l loads) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (w *watch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		w.holdPipe.pass()
		err := next(ctx, cmds)
		w.sent(cmds)
		return err
	}
}

// waitQueued waits until n calls wait in s's queues.
func waitQueued(t *testing.T, s *Store, n int) {
	t.Helper()
	for {
		got := 0
		count := func(l *lane) {
			l.mu.Lock()
			got += len(l.queue)
			l.mu.Unlock()
		}
		count(&s.batch.lane)
		s.batch.lanes.Range(func(_, l any) bool { count(l.(*lane)); return true })
		if got == n {
			return
		}
		if got > n {
			t.Fatalf("%d calls queued, want %d", got, n)
		}
		runtime.Gosched()
	}
}

// TestBatchScriptFlush: 64 goroutines take through one Store (one pipeline
// in flight, so most calls travel in batches) while another client flushes
// the script cache over and over. No call fails, and every decision is
// exact: each goroutine's key counts down by one per take.
func TestBatchScriptFlush(t *testing.T) {
	ctx := context.Background()
	redistest.EachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		t.Parallel()
		c := d.Client(t)
		var w watch
		c.AddHook(&w)
		flusher := d.Client(t)
		clock := storetest.NewClock(storetest.T0)
		s := New(c, &Options{Prefix: redistest.Prefix(t), Clock: clock.Now, MaxInFlight: 1})
		const workers, takes, rate = 64, 25, 100
		stop := make(chan struct{})
		flushes := 0
		var flushErr error
		var fw sync.WaitGroup
		fw.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				if flushErr = flusher.ScriptFlush(ctx).Err(); flushErr != nil {
					return
				}
				flushes++
				time.Sleep(200 * time.Microsecond) // pacing only: let some batches through
			}
		})
		errs := make(chan error, workers)
		var wg sync.WaitGroup
		for g := range workers {
			l := sluice.Limit{Algorithm: sluice.Algorithms()[g%6], Rate: rate, Period: time.Hour}
			wg.Go(func() {
				key := fmt.Sprint("w", g)
				for i := range takes {
					d, err := s.Take(ctx, key, l, 1)
					if err != nil {
						errs <- fmt.Errorf("%v take %d: %w", l.Algorithm, i, err)
						return
					}
					if want := int64(rate - i - 1); !d.Allowed || d.Remaining != want {
						errs <- fmt.Errorf("%v take %d: %+v, want allowed with %d left", l.Algorithm, i, d, want)
						return
					}
				}
			})
		}
		wg.Wait()
		close(stop)
		fw.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		if flushErr != nil {
			t.Fatal(flushErr)
		}
		t.Logf("%d flushes; %d pipelines, %d merged runs, %d NOSCRIPT replies in pipelines, %d script loads, %d EVALs",
			flushes, w.pipelines.Load(), w.merged.Load(), w.noscript.Load(), w.scriptLoads.Load(), w.evals.Load())
		if w.pipelines.Load() == 0 {
			t.Error("no call was batched")
		}
		if _, one := c.(*redis.Client); one && w.merged.Load() == 0 {
			t.Error("no calls were merged into one script run")
		}
	})
}

// TestBatchReload walks the NOSCRIPT path of a batch step by step: the
// script cache is flushed while calls of every algorithm wait for a batch
// (on one server they merge into one script run; on the cluster most go
// alone), and flushed again right after the store reloads the scripts, so
// the retry by EVALSHA misses too and the calls go by EVAL. None fails.
func TestBatchReload(t *testing.T) {
	ctx := context.Background()
	redistest.EachDeployment(t, func(t *testing.T, d redistest.Deployment) {
		t.Parallel()
		c := d.Client(t)
		flusher := d.Client(t)
		w := watch{holdOne: newGate()}
		w.afterLoad = func() {
			if err := flusher.ScriptFlush(ctx).Err(); err != nil {
				t.Error(err)
			}
		}
		clock := storetest.NewClock(storetest.T0)
		s := New(c, &Options{Prefix: redistest.Prefix(t), Clock: clock.Now, MaxInFlight: 1})
		l := sluice.PerMinute(10)
		check := func(what string, d sluice.Decision, err error) {
			if err != nil || !d.Allowed || d.Remaining != 9 {
				t.Errorf("%s: %+v %v, want allowed with 9 left", what, d, err)
			}
		}
		// A cluster batches per master, once the client has a slot map:
		// the queued keys are the held call's master's.
		if _, err := s.Peek(ctx, "warm", l, 1); err != nil {
			t.Fatal(err)
		}
		sameMaster := func(string, sluice.Algorithm) bool { return true }
		if cc, ok := c.(*redis.ClusterClient); ok {
			master := func(key string, a sluice.Algorithm) *redis.Client {
				m, err := cc.MasterForKey(ctx, s.redisKey(key, a))
				if err != nil {
					t.Fatal(err)
				}
				return m
			}
			alone := master("alone", l.Algorithm)
			sameMaster = func(key string, a sluice.Algorithm) bool { return master(key, a) == alone }
		}
		c.AddHook(&w)
		if cc, ok := c.(*redis.ClusterClient); ok {
			err := cc.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error {
				n.AddHook(loads{&w})
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		var wg sync.WaitGroup
		wg.Go(func() { // sent alone, held at the gate
			d, err := s.Take(ctx, "alone", l, 1)
			check("the call sent alone", d, err)
		})
		<-w.holdOne.reached
		const queued = 12
		for i, k := 0, 0; i < queued; k++ {
			l := l.WithAlgorithm(sluice.Algorithms()[i%6])
			key := fmt.Sprint("q", k)
			if !sameMaster(key, l.Algorithm) {
				continue
			}
			wg.Go(func() {
				d, err := s.Take(ctx, key, l, 1)
				check(fmt.Sprintf("batched call %s (%v)", key, l.Algorithm), d, err)
			})
			i++
		}
		waitQueued(t, s, queued)
		if err := flusher.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		close(w.holdOne.open)
		wg.Wait()
		_, one := c.(*redis.Client)
		if w.pipelines.Load() == 0 || (one && w.merged.Load() == 0) || w.noscript.Load() == 0 || w.scriptLoads.Load() == 0 || w.evals.Load() == 0 {
			t.Errorf("pipelines %d, merged runs %d, NOSCRIPT replies %d, script loads %d, EVALs %d: want each path taken",
				w.pipelines.Load(), w.merged.Load(), w.noscript.Load(), w.scriptLoads.Load(), w.evals.Load())
		}
	})
}

// TestBatchContext: a call whose context ends while it waits for a batch
// returns at once and is never sent; one whose context ends while its batch
// is on the wire returns at once too, and its command still runs. Neither
// disturbs the calls beside it.
func TestBatchContext(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	w := watch{holdOne: newGate(), holdPipe: newGate()}
	c.AddHook(&w)
	clock := storetest.NewClock(storetest.T0)
	s := New(c, &Options{Prefix: redistest.Prefix(t), Clock: clock.Now, MaxInFlight: 1})
	l := sluice.PerMinute(10)
	take := func(ctx context.Context, key string) chan error {
		done := make(chan error, 1)
		go func() {
			_, err := s.Take(ctx, key, l, 1)
			done <- err
		}()
		return done
	}

	alone := take(ctx, "alone") // holds the only slot
	<-w.holdOne.reached

	waiting, cancelWaiting := context.WithCancel(ctx)
	gone := take(waiting, "gone")
	waitQueued(t, s, 1)
	cancelWaiting()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Errorf("call cancelled while queued: %v, want context.Canceled", err)
	}
	waitQueued(t, s, 0)

	sent, cancelSent := context.WithCancel(ctx)
	late := take(sent, "late")
	waitQueued(t, s, 1)
	beside := take(ctx, "beside")
	waitQueued(t, s, 2)
	close(w.holdOne.open) // the lone call ends; its slot carries the batch
	if err := <-alone; err != nil {
		t.Errorf("call sent alone: %v", err)
	}
	<-w.holdPipe.reached // the batch is on its way, held
	cancelSent()
	if err := <-late; !errors.Is(err, context.Canceled) {
		t.Errorf("call cancelled in flight: %v, want context.Canceled", err)
	}
	close(w.holdPipe.open)
	if err := <-beside; err != nil {
		t.Errorf("call beside the cancelled one: %v", err)
	}

	for _, tc := range []struct {
		key       string
		remaining int64
	}{{"gone", 10}, {"late", 9}, {"beside", 9}, {"alone", 9}} {
		if d, err := s.Peek(ctx, tc.key, l, 1); err != nil || d.Remaining != tc.remaining {
			t.Errorf("%s: %+v %v, want %d left", tc.key, d, err, tc.remaining)
		}
	}
}

// TestQuietStoreSendsAlone: calls made one after another never wait for a
// batch: each goes at once, on its own.
func TestQuietStoreSendsAlone(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	var w watch
	c.AddHook(&w)
	s := New(c, &Options{Prefix: redistest.Prefix(t)})
	for _, l := range []sluice.Limit{sluice.PerMinute(5), sluice.PerMinute(5).WithAlgorithm(sluice.FixedWindow)} {
		for range 3 {
			if _, err := s.Take(ctx, "k", l, 1); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Peek(ctx, "k", l, 1); err != nil {
				t.Fatal(err)
			}
		}
	}
	if n := w.pipelines.Load(); n != 0 {
		t.Errorf("%d pipelines for calls made one at a time", n)
	}
}

// TestBatchMergedErrors: a decision that fails inside a merged run (a key
// of the wrong type, a corrupt value) fails alone, with its own error; the
// decisions beside it count exactly once.
func TestBatchMergedErrors(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	w := watch{holdOne: newGate()}
	c.AddHook(&w)
	clock := storetest.NewClock(storetest.T0)
	s := New(c, &Options{Prefix: redistest.Prefix(t), Clock: clock.Now, MaxInFlight: 1})
	l := sluice.PerMinute(10)
	if err := c.RPush(ctx, s.redisKey("list", sluice.GCRA), "x").Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Set(ctx, s.redisKey("corrupt", sluice.GCRA), "not a number", 0).Err(); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := s.Take(ctx, "alone", l, 1); err != nil {
			t.Error(err)
		}
	})
	<-w.holdOne.reached
	keys := []string{"a", "list", "b", "corrupt", "c", "d"}
	errs := make([]error, len(keys))
	ds := make([]sluice.Decision, len(keys))
	for i, k := range keys {
		l := l.WithAlgorithm(sluice.Algorithms()[i%2*3]) // gcra and fixed_window
		if k == "list" || k == "corrupt" {
			l = l.WithAlgorithm(sluice.GCRA)
		}
		wg.Go(func() { ds[i], errs[i] = s.Take(ctx, k, l, 2) })
	}
	waitQueued(t, s, len(keys))
	close(w.holdOne.open)
	wg.Wait()
	for i, k := range keys {
		switch k {
		case "list":
			if !errors.Is(errs[i], ErrUnexpectedReply) || !strings.Contains(errs[i].Error(), "WRONGTYPE") {
				t.Errorf("%s: %+v %v, want a WRONGTYPE error", k, ds[i], errs[i])
			}
		case "corrupt":
			if !errors.Is(errs[i], ErrUnexpectedReply) || !strings.Contains(errs[i].Error(), "corrupt state") {
				t.Errorf("%s: %+v %v, want a corrupt state error", k, ds[i], errs[i])
			}
		default:
			if errs[i] != nil || !ds[i].Allowed || ds[i].Remaining != 8 {
				t.Errorf("%s: %+v %v, want allowed with 8 left", k, ds[i], errs[i])
			}
		}
	}
	if w.merged.Load() == 0 {
		t.Error("the calls were not merged into one script run")
	}
}

// TestBatchMatchesMemory holds batched decisions to the memory store, the
// specification: each step moves the clock, then 16 goroutines call at once
// on 16 keys (takes and peeks, random costs, each key under its own random
// limit), so that the calls travel in batches, merged into shared script
// runs (the keys share a hash tag, so they merge on the cluster too). The
// memory store makes the same calls one by one; as the keys are distinct,
// order does not matter, and every decision must be the same.
func TestBatchMatchesMemory(t *testing.T) {
	ctx := context.Background()
	redistest.Each(t, func(t *testing.T, c redis.UniversalClient) {
		t.Parallel()
		var w watch
		c.AddHook(&w)
		rng := rand.New(rand.NewPCG(7, 2026))
		clock := storetest.NewClock(storetest.T0.Add(time.Duration(rng.Int64N(int64(time.Hour)))))
		rs := New(c, &Options{Prefix: redistest.Prefix(t), Clock: clock.Now, MaxInFlight: 1})
		ms := memory.New(&memory.Options{Clock: clock.Now, SweepInterval: -1})
		t.Cleanup(func() { ms.Close() })
		const keys, steps = 16, 300
		limits := make([]sluice.Limit, keys)
		for i := range limits {
			a := sluice.Algorithms()[i%6]
			limits[i] = sluice.Limit{Algorithm: a, Rate: 1 + rng.Int64N(12), Period: []time.Duration{time.Second, 7 * time.Second, time.Minute}[rng.IntN(3)]}
			if i%6 < 3 && rng.IntN(2) == 0 {
				limits[i].Burst = 1 + rng.Int64N(20)
			}
		}
		for step := range steps {
			clock.Advance(time.Duration(rng.Int64N(int64(3*time.Second))) / time.Microsecond * time.Microsecond)
			costs := make([]int64, keys)
			peek := make([]bool, keys)
			for i := range keys {
				costs[i] = 1 + rng.Int64N(min(limits[i].Capacity(), 3))
				peek[i] = rng.IntN(7) == 0
			}
			got := make([]sluice.Decision, keys)
			errs := make([]error, keys)
			var wg sync.WaitGroup
			for i := range keys {
				wg.Go(func() {
					key := fmt.Sprintf("{t}%d", i)
					if peek[i] {
						got[i], errs[i] = rs.Peek(ctx, key, limits[i], costs[i])
					} else {
						got[i], errs[i] = rs.Take(ctx, key, limits[i], costs[i])
					}
				})
			}
			wg.Wait()
			for i := range keys {
				key := fmt.Sprintf("{t}%d", i)
				var want sluice.Decision
				var err error
				if peek[i] {
					want, err = ms.Peek(ctx, key, limits[i], costs[i])
				} else {
					want, err = ms.Take(ctx, key, limits[i], costs[i])
				}
				if err != nil || errs[i] != nil {
					t.Fatalf("step %d key %d: memory %v, redis %v", step, i, err, errs[i])
				}
				if got[i] != want {
					t.Fatalf("step %d key %d %q peek=%v cost %d:\nredis  %+v\nmemory %+v", step, i, limits[i].String(), peek[i], costs[i], got[i], want)
				}
			}
		}
		t.Logf("%d pipelines, %d merged runs", w.pipelines.Load(), w.merged.Load())
		if w.merged.Load() == 0 {
			t.Error("no calls were merged into one script run")
		}
	})
}

// TestLanesPruned: masters that come and go (failovers, resharding) leave
// lanes behind; once they outnumber twice what the last prune kept (plus
// four), the idle ones are dropped, and a lane with calls in flight is kept.
func TestLanesPruned(t *testing.T) {
	dead := redistest.DeadAddr(t) // nothing is dialled
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{dead}})
	t.Cleanup(func() { cc.Close() })
	b := newBatcher(cc, DefaultMaxBatch, DefaultMaxInFlight, newDials())
	node := func() *redis.Client {
		n := redis.NewClient(&redis.Options{Addr: dead})
		t.Cleanup(func() { n.Close() })
		return n
	}
	first := node()
	busy := b.addLane(first)
	busy.busy = 1
	for i := range 100 {
		n := node()
		if l := b.addLane(n); b.addLane(n) != l {
			t.Fatalf("node %d: two lanes", i)
		}
		if b.nLanes > 6 {
			t.Fatalf("%d lanes after %d masters, want at most 6", b.nLanes, i+2)
		}
	}
	if l, ok := b.lanes.Load(first); !ok || l != busy {
		t.Error("the lane with a call in flight was dropped")
	}
	count := 0
	b.lanes.Range(func(any, any) bool { count++; return true })
	if count != b.nLanes {
		t.Errorf("%d lanes, counted %d", count, b.nLanes)
	}
}
