package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/logtest"
	"github.com/sluicehq/sluice/internal/redistest"
)

// TestMain lets the test binary act as the sluice command: a test runs
// os.Args[0] with SLUICE_TEST_MAIN=1 and gets the real program, signals and
// exit codes included.
func TestMain(m *testing.M) {
	if os.Getenv("SLUICE_TEST_MAIN") == "1" {
		os.Exit(Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// proc is a running sluice process.
type proc struct {
	cmd     *exec.Cmd
	records chan logRecord // stderr, a record a line
	stderr  *syncBuffer
	started logRecord // the startup line
	http    string
	grpc    string
}

// logRecord is one log line's attributes, from the text or the JSON
// format, nested groups flattened as "group.key".
type logRecord map[string]string

// parseRecord reads a log line; ok is false for a line that is not a
// record in either format.
func parseRecord(line string) (r logRecord, ok bool) {
	r = logRecord{}
	if strings.HasPrefix(line, "{") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			return nil, false
		}
		var flatten func(prefix string, m map[string]any)
		flatten = func(prefix string, m map[string]any) {
			for k, v := range m {
				if sub, ok := v.(map[string]any); ok {
					flatten(prefix+k+".", sub)
					continue
				}
				r[prefix+k] = fmt.Sprint(v)
			}
		}
		flatten("", m)
		return r, r["msg"] != ""
	}
	for rest := line; rest != ""; {
		k, v, found := strings.Cut(rest, "=")
		if !found || strings.ContainsAny(k, " \"") {
			return nil, false
		}
		if strings.HasPrefix(v, `"`) {
			q, err := strconv.QuotedPrefix(v)
			if err != nil {
				return nil, false
			}
			r[k], _ = strconv.Unquote(q)
			rest = strings.TrimPrefix(v[len(q):], " ")
			continue
		}
		r[k], rest, _ = strings.Cut(v, " ")
	}
	return r, r["msg"] != "" && r["level"] != ""
}

// syncBuffer is the tests' log sink, safe for concurrent writers.
type syncBuffer = logtest.Log

func sluiceCmd(env []string, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "SLUICE_TEST_MAIN=1")
	cmd.Env = append(cmd.Env, env...)
	redistest.DieWithParent(cmd)
	return cmd
}

// startSluice runs `sluice serve` and waits until it prints its addresses.
func startSluice(t *testing.T, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: sluiceCmd(env, append([]string{"serve"}, args...)...)}
	p.start(t)
	return p
}

// start runs p.cmd and waits until it logs its addresses.
func (p *proc) start(t *testing.T) {
	t.Helper()
	p.records, p.stderr = make(chan logRecord, 100), &syncBuffer{}
	out, err := p.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout syncBuffer
	p.cmd.Stdout = &stdout
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	})
	t.Cleanup(func() {
		if stdout.String() != "" {
			t.Errorf("sluice serve wrote to stdout, not through its logger:\n%s", stdout.String())
		}
	})
	go func() {
		sc := bufio.NewScanner(out)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.stderr.Write([]byte(line + "\n"))
			r, ok := parseRecord(line)
			if !ok {
				r = logRecord{"unparsed": line}
			}
			p.records <- r
		}
		close(p.records)
	}()
	for p.http == "" || p.grpc == "" {
		switch r := p.expectAny(t, "sluice started", "http", "grpc"); r["msg"] {
		case "sluice started":
			p.started = r
		case "http":
			p.http = r["addr"]
		case "grpc":
			p.grpc = r["addr"]
		}
	}
}

// expect returns the next log record with message msg.
func (p *proc) expect(t *testing.T, msg string) logRecord {
	t.Helper()
	return p.expectAny(t, msg)
}

// expectAny returns the next log record with one of the messages; every
// line before it must be a log record too.
func (p *proc) expectAny(t *testing.T, msgs ...string) logRecord {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case r, ok := <-p.records:
			if !ok {
				t.Fatalf("sluice exited before logging %q; stderr:\n%s", msgs, p.stderr.String())
			}
			if line, bad := r["unparsed"]; bad {
				t.Errorf("not a log record: %q", line)
				continue
			}
			if slices.Contains(msgs, r["msg"]) {
				return r
			}
		case <-timeout:
			t.Fatalf("sluice did not log %q; stderr:\n%s", msgs, p.stderr.String())
		}
	}
}

func (p *proc) signal(t *testing.T, sig os.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
}

func (p *proc) post(t *testing.T, path, body string) (int, map[string]any) {
	t.Helper()
	resp, err := http.Post("http://"+p.http+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	json.NewDecoder(resp.Body).Decode(&m)
	return resp.StatusCode, m
}

func (p *proc) get(t *testing.T, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.http + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func (p *proc) policies(t *testing.T) string {
	t.Helper()
	_, body := p.get(t, "/v1/policies")
	var got struct{ Policies []policyJSON }
	if err := json.Unmarshal([]byte(body), &got); err != nil {
		t.Fatalf("policies %q: %v", body, err)
	}
	var names []string
	for _, p := range got.Policies {
		names = append(names, p.Name+"="+p.Limit)
	}
	return strings.Join(names, ",")
}

func (p *proc) stop(t *testing.T) {
	t.Helper()
	p.signal(t, syscall.SIGTERM)
	p.expect(t, "stopped")
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("exit after SIGTERM: %v; stderr:\n%s", err, p.stderr.String())
	}
}

// TestCLIServeWithoutFlags: the README's first command. The addresses come
// from the environment (port 0), so no flag is given.
func TestCLIServeWithoutFlags(t *testing.T) {
	p := startSluice(t, []string{"SLUICE_HTTP_ADDR=127.0.0.1:0", "SLUICE_GRPC_ADDR=127.0.0.1:0"})
	code, page := p.get(t, "/")
	if code != 200 || !strings.Contains(page, "<html") {
		t.Errorf("dashboard: %d %.200q", code, page)
	}
	if got := p.policies(t); !strings.Contains(got, "fixed_window=fixed_window 5/10s") || strings.Count(got, "=") != 6 {
		t.Errorf("demo policies: %s", got)
	}
	// Burst 10 as the dashboard sends it: a sliding log admits exactly 5
	// of 10 in any 10 seconds, wherever the burst falls.
	allowed, denied := 0, 0
	for range 10 {
		switch code, _ := p.post(t, "/v1/check", `{"policy":"sliding_window_log","key":"burst"}`); code {
		case 200:
			allowed++
		case 429:
			denied++
		default:
			t.Fatalf("check: %d", code)
		}
	}
	if allowed != 5 || denied != 5 {
		t.Errorf("burst of 10: %d allowed, %d denied; want 5, 5", allowed, denied)
	}
	if code, body := p.post(t, "/v1/reset", `{"policy":"sliding_window_log","key":"burst"}`); code != 204 {
		t.Errorf("reset from loopback: %d %v", code, body)
	}
	if code, _ := p.get(t, "/readyz"); code != 200 {
		t.Errorf("readyz %d", code)
	}
	if code, body := p.get(t, "/metrics"); code != 200 || !strings.Contains(body, `sluice_decisions_total{outcome="denied",policy="sliding_window_log"} 5`) {
		t.Errorf("metrics: %d", code)
	}
	p.stop(t)
}

func TestCLIBadConfig(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("policies:\n  - name: api\n    limit: 10/fortnight\n"), 0o644)
	good := filepath.Join(dir, "good.yaml")
	os.WriteFile(good, []byte("policies:\n  - name: api\n    limit: 10/min\n"), 0o644)
	stale := filepath.Join(dir, "stale.yaml")
	os.WriteFile(stale, []byte("policies:\n  - name: api\n    limit: 10/s\n    lease: 2s\n"), 0o644)
	leased := filepath.Join(dir, "leased.yaml")
	os.WriteFile(leased, []byte("policies:\n  - name: api\n    limit: 10/s\n    lease: 50ms\n"), 0o644)
	tests := []struct {
		name   string
		args   []string
		code   int
		stdout string
		stderr string
	}{
		{"serve refuses a bad config", []string{"serve", "--config", bad, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 1, "", bad + ":3:12: sluice: invalid limit"},
		{"check-config names file:line", []string{"check-config", bad}, 1, "", bad + ":3:12:"},
		{"check-config prints what it understood", []string{"check-config", good}, 0, "policy api: 10/min", ""},
		{"check-config counts in the singular", []string{"check-config", good}, 0, "1 policy in 1 domain\n", ""},
		{"check-config names a lease longer than the period", []string{"check-config", stale}, 1, "", stale + ":4:12: lease 2s is longer than the period"},
		{"check-config shows a lease", []string{"check-config", leased}, 0, "policy api: 10/s, lease 50ms\n", ""},
		{"check-config --help is help", []string{"check-config", "--help"}, 0, "Usage: sluice check-config FILE|DIR", ""},
		{"serve -h describes the connection cap as the README does", []string{"serve", "-h"}, 0, "", "one more takes the place of the oldest silent one (no request yet, 1s after it was accepted), else of the one stalled longest"},
		{"check-config reads envoy's format", []string{"check-config", "testdata/envoy-example.yaml"}, 0, "foo: fixed_window 2/min", ""},
		{"missing file", []string{"check-config", filepath.Join(dir, "none.yaml")}, 1, "", "no such file"},
		{"bad redis URL", []string{"serve", "--redis", "http://x", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "invalid redis URL"},
		// go-redis takes these, then panics or fails every dial for good.
		{"negative pool size", []string{"serve", "--redis", "redis://127.0.0.1:1?pool_size=-5", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", `pool_size=\"-5\": want a whole number`},
		{"negative dial timeout", []string{"serve", "--redis", "redis://127.0.0.1:1?dial_timeout=-1s", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", `dial_timeout=\"-1s\": want a positive duration`},
		{"newline in client name", []string{"serve", "--redis", "redis://127.0.0.1:1?client_name=%0A", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", `client_name=\"\\n\": Redis takes printable ASCII`},
		{"addr on redis://", []string{"serve", "--redis", "redis://127.0.0.1:1?addr=127.0.0.1:2", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "for Redis Cluster use redis+cluster://"},
		{"cluster URL without a host", []string{"serve", "--redis", "redis+cluster://", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "no host: want redis://host:port"},
		{"bad failure policy", []string{"serve", "--failure-policy", "maybe"}, 2, "", "failure policy"},
		{"unknown command", []string{"launch"}, 2, "", "unknown command"},
		{"bad environment", []string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "SLUICE_DECISION_TIMEOUT"},
		// The flag wins, so the bad variable is never read: the run gets as
		// far as the bad Redis URL.
		{"flag over a bad environment", []string{"serve", "--decision-timeout", "10ms", "--redis", "http://x", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "invalid redis URL"},
		{"no command", nil, 2, "", "Usage:"},
		// Refused before Redis (nothing listens on port 1) is asked.
		{"negative decision timeout", []string{"serve", "--decision-timeout", "-1s", "--redis", "redis://127.0.0.1:1", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "--decision-timeout -1s: want a positive duration"},
		{"negative watch interval", []string{"serve", "--watch-interval", "-1s", "--redis", "redis://127.0.0.1:1", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "--watch-interval -1s: want 0 (never) or at least 100ms"},
		{"tiny watch interval", []string{"serve", "--watch-interval", "1us", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "--watch-interval 1µs: want 0 (never) or at least 100ms"},
		{"no connections", []string{"serve", "--max-connections", "0", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "--max-connections 0: want 1 or more"},
		{"empty --config", []string{"serve", "--config", "", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "--config is empty"},
		{"empty config in the environment", []string{"serve", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "SLUICE_CONFIG is set but empty"},
		{"negative decision timeout in the environment", []string{"serve", "--redis", "redis://127.0.0.1:1", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0"}, 2, "", "SLUICE_DECISION_TIMEOUT -5s: want a positive duration"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			var env []string
			if strings.HasPrefix(tt.name, "bad environment") || strings.HasPrefix(tt.name, "flag over") {
				env = []string{"SLUICE_DECISION_TIMEOUT=soon"}
			}
			if strings.HasSuffix(tt.name, "in the environment") {
				env = []string{"SLUICE_DECISION_TIMEOUT=-5s"}
			}
			if tt.name == "empty config in the environment" {
				env = []string{"SLUICE_CONFIG="}
			}
			cmd := sluiceCmd(env, tt.args...)
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			// A case that wrongly starts serving would otherwise hang.
			kill := time.AfterFunc(20*time.Second, func() { cmd.Process.Kill() })
			err := cmd.Wait()
			kill.Stop()
			code := 0
			if ee, ok := err.(*exec.ExitError); ok {
				code = ee.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if code != tt.code {
				t.Errorf("exit code %d, want %d; stderr:\n%s", code, tt.code, stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.stdout) {
				t.Errorf("stdout lacks %q:\n%s", tt.stdout, stdout.String())
			}
			if !strings.Contains(stderr.String(), tt.stderr) {
				t.Errorf("stderr lacks %q:\n%s", tt.stderr, stderr.String())
			}
		})
	}
}

// TestCLIReload: SIGHUP reloads; a bad new config is rejected and the old
// one stays; with watching on, editing the file is enough.
func TestCLIReload(t *testing.T) {
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "sluice.yaml")
	write := func(s string) {
		t.Helper()
		// Write beside and rename, as editors and config management do, so
		// the watcher never reads half a file.
		tmp := cfgFile + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, cfgFile); err != nil {
			t.Fatal(err)
		}
	}
	write("policies:\n  - name: a\n    limit: sliding_window_log 1/h\n")
	t.Run("SIGHUP", func(t *testing.T) {
		p := startSluice(t, nil, "--config", cfgFile, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0")
		if code, _ := p.post(t, "/v1/check", `{"policy":"a","key":"k"}`); code != 200 {
			t.Fatalf("first check %d", code)
		}
		if code, _ := p.post(t, "/v1/check", `{"policy":"a","key":"k"}`); code != 429 {
			t.Fatalf("second check %d", code)
		}
		write("policies:\n  - name: a\n    limit: sliding_window_log 3/h\n  - name: b\n    limit: fixed_window 2/s\n")
		p.signal(t, syscall.SIGHUP)
		p.expect(t, "config reloaded")
		if got, want := p.policies(t), "a=sliding_window_log 3/h,b=fixed_window 2/s"; got != want {
			t.Errorf("after reload: %s, want %s", got, want)
		}
		// The changed limit counts in keys of its own: the check is the
		// first of 3.
		if code, m := p.post(t, "/v1/check", `{"policy":"a","key":"k"}`); code != 200 || m["remaining"] != float64(2) {
			t.Errorf("after reload: %d %v", code, m)
		}
		write("policies:\n  - name: a\n    limit: sliding_window_log 3/h\n  - name: b\n    limit: 2/s\n    colour: blue\n")
		p.signal(t, syscall.SIGHUP)
		if r := p.expect(t, "config reload rejected; keeping the configuration in force"); !strings.Contains(r["err"], cfgFile+":6:5: unknown field \"colour\"") {
			t.Errorf("rejected reload: err %q lacks file:line:column", r["err"])
		}
		if got, want := p.policies(t), "a=sliding_window_log 3/h,b=fixed_window 2/s"; got != want {
			t.Errorf("after a bad reload: %s, want the old %s", got, want)
		}
		p.stop(t)
		// Each event logged once.
		for msg, want := range map[string]int{`msg="config reloaded"`: 1, `msg="config reload rejected`: 1} {
			if n := strings.Count(p.stderr.String(), msg); n != want {
				t.Errorf("%s logged %d times, want %d:\n%s", msg, n, want, p.stderr.String())
			}
		}
	})
	t.Run("file change", func(t *testing.T) {
		write("policies:\n  - name: a\n    limit: 1/min\n")
		p := startSluice(t, nil, "--config", cfgFile, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "100ms")
		write("policies:\n  - name: c\n    limit: 7/h\n")
		deadline := time.Now().Add(20 * time.Second)
		for p.policies(t) != "c=7/h" {
			if time.Now().After(deadline) {
				t.Fatalf("no reload after the file changed; policies %s", p.policies(t))
			}
			time.Sleep(20 * time.Millisecond)
		}
		p.stop(t)
	})
}
