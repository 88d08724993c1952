// Command httpratio measures what the net/http middleware costs a server:
// it serves one trivial handler bare on one loopback port and behind the
// default httplimit middleware (one rule per API key, memory store) on
// another, loads each in turn with wrk, and prints the median requests per
// second of each, their ratio, and the median CPU per request of the
// server (this process) and of wrk.
//
// A third server, the control, runs the same handler setting the same
// rate-limit header fields itself, with fixed values: limited/control is
// what the middleware costs beyond the header fields, and control/bare is
// what sending the fields costs net/http and the client.
//
// wrk is a separate process written in C, so the client's work (including
// parsing the extra header fields) does not run on the Go runtime that
// serves the requests; it still shares the machine's cores. Each round
// starts with the next server, so a change in the machine's load affects
// all alike. Every request carries one of -keys API keys, rotated by a wrk
// Lua script; after the run the store must hold exactly that many keys, or
// the command fails, as it does on any non-2xx response.
//
//	go run ./cmd/httpratio -rounds 5 -duration 5s
//	go run ./cmd/httpratio -allowed-headers all
//	go run ./cmd/httpratio -cpuprofile cpu.out && go tool pprof -top cpu.out
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bench"
	"github.com/sluicehq/sluice/httplimit"
	"github.com/sluicehq/sluice/memory"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "httpratio:", err)
		os.Exit(1)
	}
}

// config is the command line.
type config struct {
	wrk        string
	rounds     int
	duration   time.Duration
	warmup     time.Duration
	threads    int
	conns      int
	keys       int
	header     string
	limit      sluice.Limit
	allowed    httplimit.HeaderSet
	handler    string
	cpuprofile string
}

func parseFlags() (config, error) {
	var c config
	limit := flag.String("limit", "1000000/s", "the per-key limit (sluice.ParseLimit syntax); high enough that every request is allowed")
	flag.StringVar(&c.wrk, "wrk", "wrk", "the wrk binary")
	flag.IntVar(&c.rounds, "rounds", 5, "rounds; each loads both servers once")
	flag.DurationVar(&c.duration, "duration", 5*time.Second, "length of one wrk run")
	flag.DurationVar(&c.warmup, "warmup", 2*time.Second, "length of an unmeasured first run on each server")
	flag.IntVar(&c.threads, "threads", 2, "wrk threads")
	flag.IntVar(&c.conns, "conns", 64, "wrk connections")
	flag.IntVar(&c.keys, "keys", 10_000, "distinct API keys the requests rotate over")
	flag.StringVar(&c.header, "header", "X-Api-Key", "the request header carrying the API key")
	allowed := flag.String("allowed-headers", "standard", "Options.AllowedHeaders: the rate-limit fields of allowed responses (standard, all or none)")
	flag.StringVar(&c.handler, "handler", "trivial", `the handler: "trivial" writes "ok" and never touches the response header; "json" also sets Content-Type, as real handlers do`)
	flag.StringVar(&c.cpuprofile, "cpuprofile", "", "write a CPU profile of the measured rounds (both servers) to this file")
	flag.Parse()
	var err error
	if c.limit, err = sluice.ParseLimit(*limit); err != nil {
		return c, err
	}
	if c.allowed, err = httplimit.ParseHeaderSet(*allowed); err != nil {
		return c, err
	}
	switch {
	case c.rounds < 1, c.threads < 1, c.keys < 1, c.duration < time.Second:
		return c, errors.New("-rounds, -threads and -keys must be positive, -duration at least 1s")
	case c.conns < c.threads:
		return c, errors.New("-conns must be at least -threads")
	case c.handler != "trivial" && c.handler != "json":
		return c, fmt.Errorf("-handler %q: want trivial or json", c.handler)
	case !regexp.MustCompile(`^[A-Za-z0-9-]+$`).MatchString(c.header):
		return c, fmt.Errorf("-header %q is not a plain header name", c.header)
	}
	return c, nil
}

func run() error {
	c, err := parseFlags()
	if err != nil {
		return err
	}
	if _, err := exec.LookPath(c.wrk); err != nil {
		return fmt.Errorf("%w (install wrk, e.g. apt-get install wrk)", err)
	}
	// The sweeper is off so that Len counts every key the run touched: with
	// a limit this high a key's state is fresh again moments after each of
	// its requests, and a sweep would remove it.
	store := memory.New(&memory.Options{SweepInterval: -1})
	defer store.Close()
	mw, err := httplimit.New(store, []httplimit.Rule{{
		Name:  "per-key",
		Limit: c.limit,
		Key:   httplimit.Header(c.header),
	}}, &httplimit.Options{AllowedHeaders: c.allowed})
	if err != nil {
		return err
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "ok") })
	if c.handler == "json" {
		ok = func(w http.ResponseWriter, _ *http.Request) {
			w.Header()["Content-Type"] = []string{"application/json"}
			io.WriteString(w, `{"ok":true}`)
		}
	}
	bare, err := newTarget("bare", ok)
	if err != nil {
		return err
	}
	defer bare.stop()
	limited, err := newTarget("limited", mw.Handler(ok))
	if err != nil {
		return err
	}
	defer limited.stop()
	fixed, err := probe(limited.url, c)
	if err != nil {
		return err
	}
	if err := store.Reset(context.Background(), "httplimit:per-key:probe", c.limit); err != nil { // not one of the run's keys
		return err
	}
	targets := []*target{bare, limited}
	var static *target
	if c.allowed != httplimit.NoHeaders {
		// The control: the trivial handler setting the probe's rate-limit
		// header fields itself. It costs the server and the client what
		// the header fields cost, without the middleware.
		static, err = newTarget("static-headers", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			h := w.Header()
			for k, v := range fixed {
				h[k] = v
			}
			ok(w, r)
		}))
		if err != nil {
			return err
		}
		defer static.stop()
		targets = append(targets, static)
	}

	dir, err := os.MkdirTemp("", "httpratio")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "keys.lua")
	if err := os.WriteFile(script, []byte(luaScript(c)), 0o600); err != nil {
		return err
	}

	for _, t := range targets {
		if _, err := t.load(c, script, c.warmup, false); err != nil {
			return err
		}
	}
	if c.cpuprofile != "" {
		f, err := os.Create(c.cpuprofile)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Printf("wrk -t%d -c%d -d%v, %d keys in header %s, limit %v, %s handler, allowed-headers=%v, GOMAXPROCS=%d, %d rounds\n",
		c.threads, c.conns, c.duration, c.keys, c.header, c.limit, c.handler, c.allowed, runtime.GOMAXPROCS(0), c.rounds)
	fmt.Printf("%-6s %-15s %10s %14s %14s\n", "round", "server", "req/s", "server µs/req", "wrk µs/req")
	var ratios []float64
	for i := range c.rounds {
		for j := range targets { // each round starts with the next target
			t := targets[(i+j)%len(targets)]
			r, err := t.load(c, script, c.duration, true)
			if err != nil {
				return err
			}
			fmt.Printf("%-6d %-15s %10.0f %14.1f %14.1f\n", i+1, t.name, r.rps, r.server, r.client)
		}
		ratios = append(ratios, limited.rps[i]/bare.rps[i])
	}
	if got := store.Len(); got != c.keys {
		return fmt.Errorf("the store holds %d keys, the run claims %d", got, c.keys)
	}
	fmt.Printf("\nmedians over %d rounds:\n", c.rounds)
	fmt.Printf("%-15s %10s %14s %14s\n", "server", "req/s", "server µs/req", "wrk µs/req")
	for _, t := range targets {
		fmt.Printf("%-15s %10.0f %14.1f %14.1f\n", t.name, median(t.rps), median(t.server), median(t.client))
	}
	fmt.Printf("limited/bare req/s: %.3f (ratio of medians), %.3f (median of round ratios)\n",
		median(limited.rps)/median(bare.rps), median(ratios))
	if static != nil {
		fmt.Printf("limited/static-headers req/s: %.3f (ratio of medians)\n", median(limited.rps)/median(static.rps))
	}
	// When server and wrk saturate the cores they share, throughput is
	// inverse to their CPU per request; these ratios barely move with the
	// load of other processes, which req/s does.
	fmt.Printf("CPU (server + wrk) per request, bare/limited: %.3f", cpuRatio(bare, limited))
	if static != nil {
		fmt.Printf("; static-headers/limited: %.3f; bare/static-headers: %.3f", cpuRatio(static, limited), cpuRatio(bare, static))
	}
	fmt.Println()
	fmt.Printf("store holds %d keys, as claimed\n", store.Len())
	return nil
}

// target is one server under load and its measurements, one per round.
type target struct {
	name                string
	url                 string
	stop                func()
	rps, server, client []float64
}

// result is one wrk run: requests per second, and CPU per request of this
// process (the servers) and of wrk.
type result struct{ rps, server, client float64 }

func newTarget(name string, h http.Handler) (*target, error) {
	url, stop, err := serve(h)
	if err != nil {
		return nil, err
	}
	return &target{name: name, url: url, stop: stop}, nil
}

// load runs wrk against t for d and, if record, keeps the result.
func (t *target) load(c config, script string, d time.Duration, record bool) (result, error) {
	cpu0 := bench.ProcessCPU()
	rps, n, client, err := runWrk(c, script, t.url, d)
	if err != nil {
		return result{}, err
	}
	perReq := func(cpu time.Duration) float64 { return float64(cpu.Nanoseconds()) / 1e3 / n }
	r := result{rps: rps, server: perReq(bench.ProcessCPU() - cpu0), client: perReq(client)}
	if record {
		t.rps, t.server, t.client = append(t.rps, r.rps), append(t.server, r.server), append(t.client, r.client)
	}
	return r, nil
}

// serve serves h on a fresh loopback port.
func serve(h http.Handler) (url string, stop func(), err error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String() + "/", func() { srv.Close() }, nil
}

// wantFields is how many rate-limit fields an allowed response carries.
var wantFields = map[httplimit.HeaderSet]int{httplimit.StandardHeaders: 2, httplimit.AllHeaders: 5, httplimit.NoHeaders: 0}

// probe makes one request to the limited server, checks that the
// middleware answers as configured, so a run cannot measure a misconfigured
// middleware, and returns the rate-limit header fields it set.
func probe(url string, c config) (http.Header, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set(c.header, "probe")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	fixed := http.Header{}
	for _, k := range []string{httplimit.HeaderLimit, httplimit.HeaderRemaining, httplimit.HeaderReset, httplimit.HeaderRateLimitPolicy, httplimit.HeaderRateLimit} {
		if v := resp.Header.Values(k); len(v) > 0 {
			fixed[http.CanonicalHeaderKey(k)] = v
		}
	}
	switch {
	case resp.StatusCode != http.StatusOK:
		return nil, fmt.Errorf("limited server answered %s", resp.Status)
	case len(fixed) != wantFields[c.allowed]:
		return nil, fmt.Errorf("limited server set %d rate-limit header fields with allowed-headers=%v", len(fixed), c.allowed)
	}
	return fixed, nil
}

// luaScript rotates the API key header over c.keys keys. The requests are
// formatted once per thread in init, so the client's cost per request is a
// table lookup, the same for both servers. Thread t starts at key
// t·keys/threads; every thread cycles through all keys.
func luaScript(c config) string {
	return fmt.Sprintf(`local keys, threads, header = %d, %d, %q
local n = 0
function setup(thread)
  thread:set("id", n)
  n = n + 1
end
function init(args)
  reqs = {}
  for k = 0, keys - 1 do
    reqs[k] = wrk.format(nil, nil, {[header] = string.format("key-%%06d", k)})
  end
  i = math.floor(id * keys / threads)
end
function request()
  local r = reqs[i]
  i = (i + 1) %% keys
  return r
end
`, c.keys, c.threads, c.header)
}

var (
	reqPerSec = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	total     = regexp.MustCompile(`(\d+) requests in`)
	non2xx    = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
	sockErr   = regexp.MustCompile(`Socket errors: .*`)
)

// runWrk loads url for d and returns requests per second, the number of
// requests and wrk's CPU time. Any non-2xx response or socket error fails
// the run: a denied or failed request would not measure the allowed path.
func runWrk(c config, script, url string, d time.Duration) (rps, n float64, cpu time.Duration, err error) {
	cmd := exec.Command(c.wrk, "-t"+strconv.Itoa(c.threads), "-c"+strconv.Itoa(c.conns),
		"-d"+strconv.Itoa(int(d.Round(time.Second)/time.Second))+"s", "-s", script, url)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return 0, 0, 0, fmt.Errorf("wrk: %w: %s", err, out.Bytes())
	}
	if m := non2xx.Find(out.Bytes()); m != nil {
		return 0, 0, 0, fmt.Errorf("wrk %s: %s", url, m)
	}
	if m := sockErr.Find(out.Bytes()); m != nil {
		return 0, 0, 0, fmt.Errorf("wrk %s: %s", url, m)
	}
	m, t := reqPerSec.FindSubmatch(out.Bytes()), total.FindSubmatch(out.Bytes())
	if m == nil || t == nil {
		return 0, 0, 0, fmt.Errorf("wrk: unexpected output: %s", out.Bytes())
	}
	if rps, err = strconv.ParseFloat(string(m[1]), 64); err != nil {
		return 0, 0, 0, fmt.Errorf("wrk: %w", err)
	}
	if n, err = strconv.ParseFloat(string(t[1]), 64); err != nil || n == 0 {
		return 0, 0, 0, fmt.Errorf("wrk: %q requests", t[1])
	}
	return rps, n, cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}

// cpuRatio is the median over rounds of a's CPU per request over b's,
// server and wrk together.
func cpuRatio(a, b *target) float64 {
	rs := make([]float64, len(a.server))
	for i := range rs {
		rs[i] = (a.server[i] + a.client[i]) / (b.server[i] + b.client[i])
	}
	return median(rs)
}

func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
