//go:build unix

package server

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/race"
	"github.com/sluicehq/sluice/internal/redistest"
)

// The fleet harness: N real `sluice serve` processes (this test binary run
// as the program, see TestMain) sharing one private redis-server, load
// driven at all of them at once, and the admitted requests counted per
// instance and per policy.

// redisProc is a private redis-server that a test can pause (SIGSTOP),
// resume, kill and restart.
type redisProc struct {
	*redistest.Server
	pid int
}

// startRedis starts a private redis-server with args on its command line.
func startRedis(t *testing.T, args ...string) *redisProc {
	t.Helper()
	r := &redisProc{Server: redistest.StartServer(t, args...)}
	r.readPID(t)
	// A SIGSTOPped server would outlive a failed test's cleanup otherwise:
	// SIGKILL works on a stopped process, but resume first to be kind to
	// anything still connected.
	t.Cleanup(func() { syscall.Kill(r.pid, syscall.SIGCONT) })
	return r
}

func (r *redisProc) readPID(t *testing.T) {
	t.Helper()
	c := r.client()
	defer c.Close()
	info, err := c.Info(context.Background(), "server").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			if r.pid, err = strconv.Atoi(v); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatal("redis INFO has no process_id")
}

func (r *redisProc) client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: r.Addr, MaxRetries: -1})
}

func (r *redisProc) url() string { return "redis://" + r.Addr }

func (r *redisProc) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := syscall.Kill(r.pid, sig); err != nil {
		t.Fatal(err)
	}
}

// pause stops the server without closing its connections: calls hang.
func (r *redisProc) pause(t *testing.T) { r.signal(t, syscall.SIGSTOP) }

func (r *redisProc) resume(t *testing.T) { r.signal(t, syscall.SIGCONT) }

// restart starts the server again on its address after Stop.
func (r *redisProc) restart(t *testing.T) {
	t.Helper()
	r.Start(t)
	r.readPID(t)
}

// fleet is N sluice serve processes sharing one Redis.
type fleet struct {
	args  []string
	procs []*proc
}

// startFleet starts n instances of `sluice serve --config cfg --redis url
// args...`.
func startFleet(t *testing.T, url string, n int, cfg string, args ...string) *fleet {
	t.Helper()
	file := writeConfig(t, strings.TrimLeft(cfg, "\n"))
	f := &fleet{args: append([]string{"--config", file, "--redis", url,
		"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0"}, args...)}
	for range n {
		f.add(t)
	}
	return f
}

// add starts one more instance.
func (f *fleet) add(t *testing.T, args ...string) *proc {
	t.Helper()
	p := startSluice(t, nil, append(append([]string{}, f.args...), args...)...)
	f.procs = append(f.procs, p)
	return p
}

// metric returns the value of the first sample of the named metric
// (with labels, as exposed: `name{a="b"}`) on instance p, or -1.
func metric(t *testing.T, p *proc, name string) float64 {
	t.Helper()
	code, body := p.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("metrics: %d", code)
	}
	for line := range strings.SplitSeq(body, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatalf("metric %s: %v", line, err)
			}
			return f
		}
	}
	return -1
}

// awaitFleetSize waits until every instance reports sluice_fleet_size n,
// and returns how long that took.
func (f *fleet) awaitFleetSize(t *testing.T, n int, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	for {
		done := true
		var got []float64
		for _, p := range f.procs {
			v := metric(t, p, "sluice_fleet_size")
			got = append(got, v)
			done = done && v == float64(n)
		}
		if done {
			return time.Since(start)
		}
		if time.Since(start) > within {
			t.Fatalf("fleet sizes %v after %v, want %d everywhere", got, within, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// awaitLogs waits until every instance has logged each line once, and
// fails if one logged it more often.
func (f *fleet) awaitLogs(t *testing.T, within time.Duration, lines ...string) {
	t.Helper()
	deadline := time.Now().Add(within)
	for i, p := range f.procs {
		for _, line := range lines {
			for {
				n := strings.Count(p.stderr.String(), line)
				if n > 1 {
					t.Errorf("instance %d logged %q %d times, want once; log:\n%s", i, line, n, p.stderr.String())
				}
				if n >= 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("instance %d did not log %q; log:\n%s", i, line, p.stderr.String())
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
	}
}

// awaitRegistry waits until every instance has registered in Redis.
func (f *fleet) awaitRegistry(t *testing.T) {
	t.Helper()
	for _, p := range f.procs {
		for deadline := time.Now().Add(10 * time.Second); metric(t, p, "sluice_fleet_registry_reachable") != 1; {
			if time.Now().After(deadline) {
				t.Fatal("an instance did not register in Redis")
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// tally counts one instance's answers for one policy.
type tally struct {
	allowed, denied, failed atomic.Int64
	lastFailed              atomic.Int64           // when the last failure came, in Unix ns
	why                     atomic.Pointer[string] // the last failure
}

func (c *tally) fail(why string) {
	c.failed.Add(1)
	c.lastFailed.Store(time.Now().UnixNano())
	c.why.Store(&why)
}

// load is checks driven at every instance of a fleet until finish.
type load struct {
	policies []string
	counts   [][]*tally // [instance][policy]
	stop     chan struct{}
	wg       sync.WaitGroup
	start    time.Time
	took     time.Duration
}

// drive starts workers goroutines per instance, each sending POST
// /v1/check for key under every policy in turn, as fast as answers come.
func (f *fleet) drive(workers int, key string, policies ...string) *load {
	l := &load{policies: policies, stop: make(chan struct{}), start: time.Now()}
	tr := &http.Transport{MaxIdleConnsPerHost: workers, DisableCompression: true}
	client := &http.Client{Transport: tr, Timeout: 5 * time.Second}
	for _, p := range f.procs {
		row := make([]*tally, len(policies))
		for i := range row {
			row[i] = &tally{}
		}
		l.counts = append(l.counts, row)
		for w := range workers {
			l.wg.Add(1)
			go func() {
				defer l.wg.Done()
				for i := w; ; i++ {
					select {
					case <-l.stop:
						return
					default:
					}
					j := i % len(policies)
					body := fmt.Sprintf(`{"policy":%q,"key":%q}`, policies[j], key)
					resp, err := client.Post("http://"+p.http+"/v1/check", "application/json", strings.NewReader(body))
					if err != nil {
						row[j].fail(err.Error())
						continue
					}
					switch resp.StatusCode {
					case http.StatusOK:
						row[j].allowed.Add(1)
					case http.StatusTooManyRequests:
						row[j].denied.Add(1)
					default:
						b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
						row[j].fail(resp.Status + ": " + string(b))
					}
					resp.Body.Close()
				}
			}()
		}
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		<-l.stop
		tr.CloseIdleConnections()
	}()
	return l
}

// finish stops the load and waits for the answers in flight.
func (l *load) finish() {
	close(l.stop)
	l.wg.Wait()
	l.took = time.Since(l.start)
}

// admitted returns the fleet's allowed count for policy i, and the
// instances' counts.
func (l *load) admitted(i int) (total int64, per []int64) {
	for _, row := range l.counts {
		n := row[i].allowed.Load()
		per = append(per, n)
		total += n
	}
	return total, per
}

// sum returns the fleet's totals over every policy.
func (l *load) sum() (allowed, denied, failed int64) {
	for _, row := range l.counts {
		for _, c := range row {
			allowed += c.allowed.Load()
			denied += c.denied.Load()
			failed += c.failed.Load()
		}
	}
	return allowed, denied, failed
}

// lastFailure returns when the fleet's last failed answer came (zero if
// none did) and what it was.
func (l *load) lastFailure() (at time.Time, why string) {
	var last int64
	for _, row := range l.counts {
		for _, c := range row {
			if n := c.lastFailed.Load(); n > last {
				last, why = n, *c.why.Load()
			}
		}
	}
	if last == 0 {
		return time.Time{}, ""
	}
	return time.Unix(0, last), why
}

// stallDecisionTimeout is the lease stall tests' --decision-timeout: their
// latency bounds are small multiples of it.
const stallDecisionTimeout = 50 * time.Millisecond

// leaseStall is one `sluice serve` on a private Redis, under a failure
// policy, whose answers on leased keys a test times while it stalls that
// Redis.
type leaseStall struct {
	redis   *redisProc
	client  *http.Client
	url     string
	timeout time.Duration // its --decision-timeout
}

// startLeaseStall starts the instance with cfg under --failure-policy
// policy and a decision timeout of timeout. The test's bounds are on
// timers, so it skips under the race detector.
func startLeaseStall(t *testing.T, policy, cfg string, timeout time.Duration) *leaseStall {
	t.Helper()
	race.SkipTiming(t)
	r := startRedis(t)
	f := startFleet(t, r.url(), 1, cfg, "--failure-policy", policy, "--decision-timeout", timeout.String())
	return &leaseStall{
		redis:   r,
		client:  &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}, Timeout: 5 * time.Second},
		url:     "http://" + f.procs[0].http + "/v1/check",
		timeout: timeout,
	}
}

// check sends one check for key "stall" under policy, and returns its
// status and how long the answer took.
func (s *leaseStall) check(policy string) (code int, took time.Duration, err error) {
	t0 := time.Now()
	resp, err := s.client.Post(s.url, "application/json", strings.NewReader(fmt.Sprintf(`{"policy":%q,"key":"stall"}`, policy)))
	took = time.Since(t0)
	if err != nil {
		return 0, took, err
	}
	resp.Body.Close()
	return resp.StatusCode, took, nil
}

// stallTimes collects answers' latencies and status codes from many
// goroutines.
type stallTimes struct {
	mu    sync.Mutex
	took  []time.Duration
	codes map[int]int
}

func (s *stallTimes) add(took time.Duration, code int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.codes == nil {
		s.codes = map[int]int{}
	}
	s.took = append(s.took, took)
	s.codes[code]++
}

// len is the number of answers collected; call it after the goroutines
// adding them are done, as bound.
func (s *stallTimes) len() int { return len(s.took) }

// bound logs the latencies and fails the test when their pct-th percentile
// is above pBound or the slowest above maxBound. what names the
// measurement in both; timeout is the instance's decision timeout.
func (s *stallTimes) bound(t *testing.T, what string, timeout time.Duration, pct int, pBound, maxBound time.Duration) {
	t.Helper()
	slices.Sort(s.took)
	n := len(s.took)
	if n == 0 {
		t.Fatalf("%s: no answers", what)
	}
	p, worst := s.took[n*pct/100], s.took[n-1]
	t.Logf("%s: %d answers, median %v, p%d %v, max %v; codes %v", what, n, s.took[n/2], pct, p, worst, s.codes)
	if p > pBound || worst > maxBound {
		t.Errorf("%s: p%d %v, max %v; want p%d ≤ %v, max ≤ %v (decision timeout %v)", what, pct, p, worst, pct, pBound, maxBound, timeout)
	}
}
