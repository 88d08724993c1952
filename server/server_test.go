package server

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/promtest"
	"github.com/sluicehq/sluice/memory"
)

// blockingStore holds every Take until release is closed, so a test can
// keep a request in flight.
type blockingStore struct {
	*memory.Store
	entered chan struct{}
	release chan struct{}
}

func (b *blockingStore) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	b.entered <- struct{}{}
	<-b.release
	return b.Store.Take(ctx, key, l, cost)
}

// startServer starts a Server, on loopback ports and without a log unless
// opts say otherwise.
func startServer(t *testing.T, opts Options) *Server {
	t.Helper()
	opts.HTTPAddr, opts.GRPCAddr = cmp.Or(opts.HTTPAddr, "127.0.0.1:0"), cmp.Or(opts.GRPCAddr, "127.0.0.1:0")
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	srv, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestShutdownWaitsForInFlight: a request inside the store when shutdown
// begins still gets its answer; new connections are refused.
func TestShutdownWaitsForInFlight(t *testing.T) {
	store := &blockingStore{Store: memory.New(nil), entered: make(chan struct{}), release: make(chan struct{})}
	defer store.Store.Close()
	srv := startServer(t, Options{Store: store})
	url := "http://" + srv.HTTPAddr()
	got := make(chan int, 1)
	go func() {
		resp, err := http.Post(url+"/v1/check", "application/json", strings.NewReader(`{"policy":"gcra","key":"k"}`))
		if err != nil {
			t.Error(err)
			got <- 0
			return
		}
		resp.Body.Close()
		got <- resp.StatusCode
	}()
	<-store.entered
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		t.Fatalf("Shutdown returned (%v) with a request in flight", err)
	case <-time.After(100 * time.Millisecond): // not a timing assertion: a failure would show as an early return
	}
	close(store.release)
	if code := <-got; code != 200 {
		t.Errorf("in-flight request got %d, want 200", code)
	}
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if _, err := http.Get(url + "/healthz"); err == nil {
		t.Error("still accepting connections after Shutdown")
	}
}

// TestReloadUnderLoad: configurations are swapped while requests flow; no
// request fails, and each is decided under one whole configuration.
func TestReloadUnderLoad(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "sluice.yaml")
	configs := []string{
		"policies:\n  - name: p\n    limit: 1000000/s\n",
		"policies:\n  - name: p\n    limit: token_bucket 1000000/s\n  - name: q\n    limit: 1/s\n",
	}
	os.WriteFile(cfgFile, []byte(configs[0]), 0o644)
	srv := startServer(t, Options{ConfigFile: cfgFile, WatchInterval: -1})
	defer srv.Shutdown(context.Background())
	url := "http://" + srv.HTTPAddr() + "/v1/check"
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var mu sync.Mutex
	bad := map[int]int{}
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			client := &http.Client{}
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp, err := client.Post(url, "application/json", strings.NewReader(`{"policy":"p","key":"k"}`))
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					mu.Lock()
					bad[resp.StatusCode]++
					mu.Unlock()
				}
			}
		}()
	}
	for i := range 40 {
		os.WriteFile(cfgFile, []byte(configs[i%2]), 0o644)
		if err := srv.Reload(); err != nil {
			t.Fatal(err)
		}
	}
	close(stop)
	wg.Wait()
	if len(bad) > 0 {
		t.Errorf("responses other than 200 during reloads: %v", bad)
	}
	os.WriteFile(cfgFile, []byte("policies: [oops"), 0o644)
	if err := srv.Reload(); err == nil {
		t.Error("a bad config was accepted")
	}
	if srv.Service().Config().Policy("p") == nil {
		t.Error("the old config did not stay after a bad reload")
	}
}

// ratelimitVersion is the envoyproxy/ratelimit version whose client_cmd
// the compatibility test installs.
const ratelimitVersion = "v1.4.1-0.20260122083618-3fb702589d36"

// installClientCmd builds envoyproxy/ratelimit's client_cmd (once per
// machine: it is cached under the user cache directory).
func installClientCmd(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("SLUICE_RATELIMIT_CLIENT"); p != "" {
		return p
	}
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "sluice-test", "ratelimit-"+ratelimitVersion)
	bin := filepath.Join(dir, "client_cmd")
	if _, err := os.Stat(bin); err == nil {
		return bin
	}
	cmd := exec.Command("go", "install", "github.com/envoyproxy/ratelimit/src/client_cmd@"+ratelimitVersion)
	cmd.Dir = t.TempDir() // outside this module
	cmd.Env = append(os.Environ(), "GOBIN="+dir, "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		msg := "cannot install envoyproxy/ratelimit's client_cmd: " + err.Error() + "\n" + string(out)
		if os.Getenv("CI") == "true" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	return bin
}

// TestEnvoyClientCmd runs envoyproxy/ratelimit's own client, unchanged,
// against sluice serve with envoyproxy/ratelimit's example config.
func TestEnvoyClientCmd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds envoyproxy/ratelimit's client")
	}
	client := installClientCmd(t)
	p := startSluice(t, nil, "--config", "testdata/envoy-example.yaml", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(client, append([]string{"-dial_string", p.grpc}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("client_cmd %v: %v\n%s", args, err, out)
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.HasPrefix(line, "response: ") {
				return line
			}
		}
		t.Fatalf("client_cmd printed no response:\n%s", out)
		return ""
	}
	steps := []struct {
		args []string
		want []string // substrings of the printed response
	}{
		{[]string{"-domain", "rl", "-descriptors", "source_cluster=proxy,destination_cluster=mock"},
			[]string{"overall_code:OK", "requests_per_unit:1", "unit:MINUTE"}},
		{[]string{"-domain", "rl", "-descriptors", "source_cluster=proxy,destination_cluster=mock"},
			[]string{"overall_code:OVER_LIMIT", "code:OVER_LIMIT", `key:"Retry-After"`}},
		{[]string{"-domain", "rl", "-descriptors", "foo=a", "-descriptors", "qux=b"},
			[]string{"overall_code:OK", "limit_remaining:1 ", "limit_remaining:4294967295"}},
		{[]string{"-domain", "rl", "-descriptors", "foo=a,bar=banned"},
			[]string{"overall_code:OVER_LIMIT"}},
		{[]string{"-domain", "nowhere", "-descriptors", "a=b"},
			[]string{"overall_code:OK"}},
	}
	for _, s := range steps {
		got := run(s.args...)
		for _, w := range s.want {
			if !strings.Contains(strings.ReplaceAll(got, "  ", " "), w) {
				t.Errorf("client_cmd %v:\n  %s\nlacks %q", s.args, got, w)
			}
		}
	}
	p.stop(t)
}

// TestWatchMissingFile: a config file that goes missing is one rejected
// reload (logged and counted once, however many polls see it), and the
// configuration in force stays; its return is reloaded.
func TestWatchMissingFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "sluice.yaml")
	if err := os.WriteFile(file, []byte("policies:\n  - name: a\n    limit: 5/s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	var logs syncBuffer
	srv := startServer(t, Options{ConfigFile: file, WatchInterval: 10 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	t.Cleanup(func() { srv.Shutdown(context.Background()) })
	failures := func() float64 {
		v, _ := promtest.Value(t, srv.Metrics().Registry(), "sluice_config_reloads_total", map[string]string{"result": "failure"})
		return v
	}
	const rejected = `level=ERROR msg="config reload rejected; keeping the configuration in force" file=` + "%s"
	if err := os.Rename(file, file+".away"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "config reload rejected") })
	time.Sleep(100 * time.Millisecond) // ten more polls
	if n := strings.Count(logs.String(), fmt.Sprintf(rejected, file)); n != 1 || failures() != 1 {
		t.Errorf("missing file: %d lines, %v failures counted; want 1 and 1:\n%s", n, failures(), logs.String())
	}
	// The alert on a rejected file lasts while it is rejected.
	successful := func() float64 {
		v, _ := promtest.Value(t, srv.Metrics().Registry(), "sluice_config_last_reload_successful", nil)
		return v
	}
	if v := successful(); v != 0 {
		t.Errorf("sluice_config_last_reload_successful = %v with the file missing, want 0", v)
	}
	if n := len(srv.Service().Config().Policies); n != 1 {
		t.Errorf("%d policies in force, want the 1 loaded", n)
	}
	if err := os.Rename(file+".away", file); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return strings.Contains(logs.String(), "config reloaded") })
	if n := strings.Count(logs.String(), "config reload rejected"); n != 1 || failures() != 1 {
		t.Errorf("after the file came back: %d rejections, %v failures:\n%s", n, failures(), logs.String())
	}
	if v := successful(); v != 1 {
		t.Errorf("sluice_config_last_reload_successful = %v after the file came back, want 1", v)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("timed out")
		}
	}
}

// TestReloadsCountReloads: sluice_config_reloads_total counts reloads,
// not the load at start, whose time is still the last successful load's.
func TestReloadsCountReloads(t *testing.T) {
	file := writeConfig(t, "policies:\n  - name: a\n    limit: 5/s\n")
	srv := runServer(t, Options{ConfigFile: file, WatchInterval: 10 * time.Millisecond})
	reg := srv.Metrics().Registry()
	value := func(name string, labels map[string]string) float64 {
		v, _ := promtest.Value(t, reg, name, labels)
		return v
	}
	if s, f := value("sluice_config_reloads_total", map[string]string{"result": "success"}), value("sluice_config_reloads_total", map[string]string{"result": "failure"}); s != 0 || f != 0 {
		t.Errorf("after start: %v successful and %v failed reloads, want none", s, f)
	}
	if at := value("sluice_config_last_reload_success_timestamp_seconds", nil); at <= 0 {
		t.Errorf("last successful load at %v, want the start's time", at)
	}
	if ok := value("sluice_config_last_reload_successful", nil); ok != 1 {
		t.Errorf("sluice_config_last_reload_successful = %v after start, want 1", ok)
	}
	if err := os.WriteFile(file, []byte("policies:\n  - name: a\n    limit: 6/s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return value("sluice_config_reloads_total", map[string]string{"result": "success"}) == 1 })
}

// TestMethodNotAllowedRoute: a 405 is counted under its endpoint's route,
// as /json's always was; the index's (/v1/, without the router's {$}) shares
// its label with the unknown paths' 404s, told apart by the code.
func TestMethodNotAllowedRoute(t *testing.T) {
	srv := runServer(t, Options{})
	base := "http://" + srv.HTTPAddr()
	for _, c := range []struct{ method, path string }{{"GET", "/v1/check"}, {"POST", "/v1/stats"}, {"POST", "/v1/"}, {"GET", "/json"}, {"GET", "/v1/nope"}} {
		req, _ := http.NewRequest(c.method, base+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	for _, want := range []struct {
		endpoint, code string
		n              float64
	}{{"/v1/check", "405", 1}, {"/v1/stats", "405", 1}, {"/v1/", "405", 1}, {"/json", "405", 1}, {"/v1/", "404", 1}, {"/v1/{$}", "405", -1}} {
		v, ok := promtest.Value(t, srv.Metrics().Registry(), "sluice_api_requests_total", map[string]string{"api": "http", "endpoint": want.endpoint, "code": want.code})
		if !ok {
			v = -1
		}
		if v != want.n {
			t.Errorf("requests{endpoint=%q,code=%s} = %v, want %v", want.endpoint, want.code, v, want.n)
		}
	}
}
