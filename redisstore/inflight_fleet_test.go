package redisstore_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// The in-flight fleet test: fleetProcesses OS processes (this test binary
// re-executed as TestFleetInFlightWorker) × concGoroutines goroutines hold
// slots of one key on one real Redis (its own clock) for fleetRun, each
// hold 1-20ms, far inside the hold timeout. Every holder records the
// machine's clock once its Acquire has returned and again before it calls
// Release: an interval inside the one Redis counts it for, so at no
// instant may more than fleetMax recorded intervals overlap.
//
// Then one process takes every slot and is killed with SIGKILL: its slots
// must be free again within the hold timeout of the kill.
const (
	fleetProcesses = 4
	fleetMax       = 10
	fleetHold      = 2 * time.Second // ≥ 100× the longest hold
	fleetLongest   = 20 * time.Millisecond
	fleetRun       = 3 * time.Second
	fleetKey       = "inflight"
	fleetWorkerEnv = "SLUICE_INFLIGHT_WORKER" // the key prefix
	// fleetSlack is how late after the hold timeout the freed slots may be
	// seen: the polling interval and a loaded machine's scheduling.
	fleetSlack = 500 * time.Millisecond
)

var fleetLimit = sluice.Concurrent(fleetMax, fleetHold)

func TestFleetInFlight(t *testing.T) {
	race.SkipTiming(t)
	if os.Getenv(fleetWorkerEnv) != "" {
		t.Skip("in a worker process")
	}
	ctx := context.Background()
	client := concClient(t, "standalone")
	prefix := redistest.Prefix(t)
	store := redisstore.New(client, &redisstore.Options{Prefix: prefix})

	workers := make([]*concWorker, fleetProcesses)
	for i := range workers {
		workers[i] = startWorker(t, i, "TestFleetInFlightWorker", time.Minute, fleetWorkerEnv+"="+prefix)
	}
	for _, w := range workers {
		w.expect(t, "ready")
	}
	for _, w := range workers {
		w.send(t, "go")
	}
	var ivs [][2]int64
	for _, w := range workers {
		n, err := strconv.Atoi(strings.TrimPrefix(w.line(t), "intervals "))
		if err != nil {
			t.Fatalf("worker %d: %v", w.id, err)
		}
		for range n {
			f := strings.Fields(w.line(t))
			in, _ := strconv.ParseInt(f[0], 10, 64)
			out, _ := strconv.ParseInt(f[1], 10, 64)
			ivs = append(ivs, [2]int64{in, out})
		}
	}
	peak := fleetPeak(ivs)
	t.Logf("%d holds by %d×%d goroutines; at most %d held at once (limit %d)", len(ivs), fleetProcesses, concGoroutines, peak, fleetMax)
	if peak > fleetMax {
		t.Errorf("%d holders at once, more than the limit %d", peak, fleetMax)
	}
	if peak < fleetMax/2 || len(ivs) < 100 {
		t.Errorf("%d holds, at most %d at once: too little contention to tell", len(ivs), peak)
	}
	for _, w := range workers[1:] {
		w.wait(t)
	}

	// The crash: worker 0 holds every slot, and dies.
	victim := workers[0]
	victim.send(t, "hog")
	victim.expect(t, "holding")
	victim.cmd.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	victim.cmd.Wait()
	if d, err := store.Acquire(ctx, fleetKey, fleetLimit, 1, "probe"); err != nil || d.Allowed {
		t.Fatalf("right after the kill: Acquire = %+v, %v; want the dead process's slots still held", d, err)
	}
	for {
		d, err := store.Acquire(ctx, fleetKey, fleetLimit, fleetMax, "after")
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			break
		}
		if time.Since(killed) > fleetHold+fleetSlack {
			t.Fatalf("%v after the kill the dead process's slots are still held (hold timeout %v)", time.Since(killed), fleetHold)
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("the killed process's slots were free %v after SIGKILL (hold timeout %v)", time.Since(killed), fleetHold)
}

// fleetPeak returns the most intervals that overlap at any instant; an
// interval starting when another ends counts as overlapping it.
func fleetPeak(ivs [][2]int64) int {
	type event struct {
		at    int64
		delta int
	}
	var evs []event
	for _, iv := range ivs {
		evs = append(evs, event{iv[0], 1}, event{iv[1], -1})
	}
	slices.SortFunc(evs, func(a, b event) int {
		if a.at != b.at {
			return int(min(max(a.at-b.at, -1), 1))
		}
		return b.delta - a.delta // entries first
	})
	n, peak := 0, 0
	for _, e := range evs {
		n += e.delta
		peak = max(peak, n)
	}
	return peak
}

// startWorker starts this test binary as a worker process running only
// the test run, with env added, killed after timeout or with its parent.
func startWorker(t *testing.T, id int, run string, timeout time.Duration, env ...string) *concWorker {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+run+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), env...)
	redistest.DieWithParent(cmd)
	w := &concWorker{id: id, cmd: cmd}
	cmd.Stderr = &w.stderr
	var err error
	if w.in, err = cmd.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w.out = bufio.NewReader(stdout)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w.in.Close()
		cmd.Wait() // ends at once if wait already ran; the context kills a stuck worker
	})
	return w
}

// TestFleetInFlightWorker is a worker process of TestFleetInFlight; run
// directly it skips.
func TestFleetInFlightWorker(t *testing.T) {
	prefix := os.Getenv(fleetWorkerEnv)
	if prefix == "" {
		t.Skip("a helper process of TestFleetInFlight")
	}
	client := concClient(t, "standalone")
	store := redisstore.New(client, &redisstore.Options{Prefix: prefix})
	ctx := context.Background()
	var wg sync.WaitGroup
	warm := func() { client.Ping(ctx) } // every connection open before the race
	for range concGoroutines {
		wg.Go(warm)
	}
	wg.Wait()

	in := bufio.NewScanner(os.Stdin)
	fmt.Printf("%sready\n", concLine)
	if !in.Scan() || in.Text() != "go" {
		t.Fatalf("expected \"go\" on stdin, got %q (%v)", in.Text(), in.Err())
	}
	ivs := make([][][2]int64, concGoroutines)
	errs := make([]error, concGoroutines)
	end := time.Now().Add(fleetRun)
	for g := range concGoroutines {
		wg.Go(func() { ivs[g], errs[g] = fleetHolder(ctx, store, end) })
	}
	wg.Wait()
	var all [][2]int64
	for g := range concGoroutines {
		if errs[g] != nil {
			t.Fatalf("goroutine %d: %v", g, errs[g])
		}
		all = append(all, ivs[g]...)
	}
	var out strings.Builder
	fmt.Fprintf(&out, "%sintervals %d\n", concLine, len(all))
	for _, iv := range all {
		fmt.Fprintf(&out, "%s%d %d\n", concLine, iv[0], iv[1])
	}
	os.Stdout.WriteString(out.String())

	if !in.Scan() || in.Text() != "hog" {
		return // released by the parent
	}
	for i := range fleetMax {
		for {
			d, err := store.Acquire(ctx, fleetKey, fleetLimit, 1, fmt.Sprint("hog", i))
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
	fmt.Printf("%sholding\n", concLine)
	time.Sleep(time.Minute) // until SIGKILL
}

// fleetHolder acquires, holds and releases slots until end, returning the
// intervals it held them.
func fleetHolder(ctx context.Context, store *redisstore.Store, end time.Time) ([][2]int64, error) {
	var ivs [][2]int64
	for time.Now().Before(end) {
		slot, d, err := sluice.AcquireSlot(ctx, store, fleetKey, fleetLimit, 1)
		if err != nil {
			return nil, err
		}
		if !d.Allowed {
			time.Sleep(time.Duration(1+rand.IntN(2000)) * time.Microsecond)
			continue
		}
		in := time.Now().UnixNano()
		time.Sleep(time.Millisecond + rand.N(fleetLongest-time.Millisecond))
		out := time.Now().UnixNano()
		if err := slot.Release(ctx); err != nil {
			return nil, err
		}
		ivs = append(ivs, [2]int64{in, out})
	}
	return ivs, nil
}

// fleetPeak counts what the fleet test relies on it to count.
func TestPeakOverlapCounts(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		ivs  [][2]int64
		want int
	}{
		{nil, 0},
		{[][2]int64{{0, 10}}, 1},
		{[][2]int64{{0, 10}, {10, 20}}, 2}, // touching intervals overlap
		{[][2]int64{{0, 10}, {11, 20}}, 1},
		{[][2]int64{{0, 100}, {10, 20}, {15, 30}, {25, 40}}, 3},
	} {
		if got := fleetPeak(c.ivs); got != c.want {
			t.Errorf("fleetPeak(%v) = %d, want %d", c.ivs, got, c.want)
		}
	}
}
