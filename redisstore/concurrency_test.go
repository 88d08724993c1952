package redisstore_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// The concurrency test runs concProcesses real OS processes (this test
// binary re-executed as TestConcurrencyWorker), each with concGoroutines
// goroutines taking one unit at a time from one key until denied, on the
// real standalone server and on the cluster, with Redis's own clock. Every
// exact algorithm must admit exactly the limit; the sliding window counter
// never more.
//
// The limits are out of reach of time: one unit per 43 minutes comes back
// under the bucket algorithms, the log's entries live 30 days, and the
// window algorithms' period is chosen so that the current window ends more
// than an hour from now. So any admission above the limit is a race, and any
// below it a lost update.
//
// Parent and workers talk over pipes, one line each way per algorithm:
// "ready" when every goroutine waits at the start line, "go" to release them
// all at once, then "admitted N".
const (
	concProcesses  = 4
	concGoroutines = 32
	concRate       = 1000
	concWorkerEnv  = "SLUICE_CONCURRENCY_WORKER" // target: "standalone" or "cluster"
	concPrefixEnv  = "SLUICE_CONCURRENCY_PREFIX"
	concWindowEnv  = "SLUICE_CONCURRENCY_WINDOW" // the window algorithms' period
	concLine       = "sluice-worker "            // prefix of protocol lines on stdout
	concKey        = "hot"
	concTimeout    = 3 * time.Minute
)

// concLimits are the limits of one run, one per algorithm, in
// sluice.Algorithms order.
func concLimits(window time.Duration) []sluice.Limit {
	var ls []sluice.Limit
	for _, a := range sluice.Algorithms() {
		l := sluice.Limit{Algorithm: a, Rate: concRate, Period: 30 * 24 * time.Hour}
		if a == sluice.FixedWindow || a == sluice.SlidingWindowCounter {
			l.Period = window
		}
		ls = append(ls, l)
	}
	return ls
}

// concWindow returns a period of a day or a little more whose current window
// (windows are counted from the Unix epoch) ends more than an hour after now.
func concWindow(now time.Time) time.Duration {
	for p := 24 * time.Hour; ; p += time.Hour {
		if left := p - time.Duration(now.UnixMicro()%p.Microseconds())*time.Microsecond; left > time.Hour {
			return p
		}
	}
}

func concClient(t *testing.T, target string) redis.UniversalClient {
	t.Helper()
	var c redis.UniversalClient
	switch target {
	case "standalone":
		c = redis.NewClient(&redis.Options{Addr: redistest.Addr(t), PoolSize: concGoroutines})
	case "cluster":
		c = redis.NewClusterClient(&redis.ClusterOptions{Addrs: redistest.ClusterAddrs(t), PoolSize: concGoroutines})
	default:
		t.Fatalf("unknown target %q", target)
	}
	t.Cleanup(func() { c.Close() })
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("redis: %v", err)
	}
	return c
}

func TestConcurrency(t *testing.T) {
	if os.Getenv(concWorkerEnv) != "" {
		t.Skip("in a worker process")
	}
	for _, target := range []string{"standalone", "cluster"} {
		t.Run(target, func(t *testing.T) {
			ctx := context.Background()
			client := concClient(t, target)
			now, err := client.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			window := concWindow(now)
			limits := concLimits(window)
			prefix := redistest.Prefix(t)
			store := redisstore.New(client, &redisstore.Options{Prefix: prefix})
			t.Cleanup(func() {
				for _, l := range limits {
					store.Reset(context.Background(), concKey, l)
				}
			})

			workers := make([]*concWorker, concProcesses)
			for i := range workers {
				workers[i] = startConcWorker(t, i, target, prefix, window)
			}
			for _, l := range limits {
				for _, w := range workers {
					w.expect(t, "ready "+l.Algorithm.String())
				}
				for _, w := range workers {
					w.send(t, "go")
				}
				var total int64
				var each []string
				for _, w := range workers {
					n := w.admitted(t, l.Algorithm)
					total += n
					each = append(each, strconv.FormatInt(n, 10))
				}
				t.Logf("%v: %d admitted (%s by process) under %q", l.Algorithm, total, strings.Join(each, " + "), l.String())
				if total > concRate {
					t.Errorf("%v: %d admitted, more than the limit %d", l.Algorithm, total, concRate)
				}
				if l.Algorithm != sluice.SlidingWindowCounter && total != concRate {
					t.Errorf("%v: %d admitted, want exactly %d", l.Algorithm, total, concRate)
				}
				d, err := store.Peek(ctx, concKey, l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Allowed || d.Remaining != concRate-total {
					t.Errorf("%v: after the run Peek = %+v, want denied with Remaining %d", l.Algorithm, d, concRate-total)
				}
			}
			for _, w := range workers {
				w.wait(t)
			}
		})
	}
}

// concWorker is the parent's handle on one worker process.
type concWorker struct {
	id     int
	cmd    *exec.Cmd
	in     io.WriteCloser
	out    *bufio.Reader
	stderr bytes.Buffer
}

func startConcWorker(t *testing.T, id int, target, prefix string, window time.Duration) *concWorker {
	t.Helper()
	return startWorker(t, id, "TestConcurrencyWorker", concTimeout,
		concWorkerEnv+"="+target, concPrefixEnv+"="+prefix, concWindowEnv+"="+window.String())
}

// line returns the worker's next protocol line, skipping the test
// framework's own output.
func (w *concWorker) line(t *testing.T) string {
	t.Helper()
	var seen []string
	for {
		s, err := w.out.ReadString('\n')
		if err != nil {
			w.cmd.Wait()
			t.Fatalf("worker %d: %v; its output:\n%s\n%s", w.id, err, strings.Join(seen, ""), w.stderr.String())
		}
		if rest, ok := strings.CutPrefix(s, concLine); ok {
			return strings.TrimSpace(rest)
		}
		seen = append(seen, s)
	}
}

func (w *concWorker) expect(t *testing.T, want string) {
	t.Helper()
	if got := w.line(t); got != want {
		t.Fatalf("worker %d said %q, want %q", w.id, got, want)
	}
}

func (w *concWorker) send(t *testing.T, s string) {
	t.Helper()
	if _, err := io.WriteString(w.in, s+"\n"); err != nil {
		t.Fatalf("worker %d: %v", w.id, err)
	}
}

func (w *concWorker) admitted(t *testing.T, a sluice.Algorithm) int64 {
	t.Helper()
	got := w.line(t)
	f := strings.Fields(got)
	if len(f) != 3 || f[0] != "admitted" || f[1] != a.String() {
		t.Fatalf("worker %d said %q, want \"admitted %v N\"", w.id, got, a)
	}
	n, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		t.Fatalf("worker %d said %q: %v", w.id, got, err)
	}
	return n
}

func (w *concWorker) wait(t *testing.T) {
	t.Helper()
	w.in.Close()
	if err := w.cmd.Wait(); err != nil {
		t.Errorf("worker %d: %v\n%s", w.id, err, w.stderr.String())
	}
}

// TestConcurrencyWorker is a worker process of TestConcurrency; run
// directly it skips.
func TestConcurrencyWorker(t *testing.T) {
	target := os.Getenv(concWorkerEnv)
	if target == "" {
		t.Skip("a helper process of TestConcurrency")
	}
	window, err := time.ParseDuration(os.Getenv(concWindowEnv))
	if err != nil {
		t.Fatalf("%s: %v", concWindowEnv, err)
	}
	client := concClient(t, target)
	store := redisstore.New(client, &redisstore.Options{Prefix: os.Getenv(concPrefixEnv)})
	ctx := context.Background()

	// Open every connection now, so the race starts with all 32 ready.
	var wg sync.WaitGroup
	for range concGoroutines {
		wg.Go(func() { client.Ping(ctx) })
	}
	wg.Wait()

	in := bufio.NewScanner(os.Stdin)
	for _, l := range concLimits(window) {
		start := make(chan struct{})
		counts := make([]int64, concGoroutines)
		errs := make([]error, concGoroutines)
		for g := range concGoroutines {
			wg.Go(func() {
				<-start
				for {
					d, err := store.Take(ctx, concKey, l, 1)
					if err != nil {
						errs[g] = err
						return
					}
					if !d.Allowed {
						return
					}
					counts[g]++
				}
			})
		}
		fmt.Printf("%sready %v\n", concLine, l.Algorithm)
		if !in.Scan() || in.Text() != "go" {
			close(start)
			wg.Wait()
			t.Fatalf("expected \"go\" on stdin, got %q (%v)", in.Text(), in.Err())
		}
		close(start)
		wg.Wait()
		var total int64
		for g := range concGoroutines {
			if errs[g] != nil {
				t.Fatalf("%v: goroutine %d: %v", l.Algorithm, g, errs[g])
			}
			total += counts[g]
		}
		fmt.Printf("%sadmitted %v %d\n", concLine, l.Algorithm, total)
	}
}
