package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
)

func TestNewLogger(t *testing.T) {
	t.Parallel()
	tests := []struct {
		format, level string
		err           bool
		debug         bool   // a debug record is written
		prefix        string // of an info record
	}{
		{"", "", false, false, "time="},
		{"text", "debug", false, true, "time="},
		{"json", "info", false, false, `{"time":`},
		{"JSON", "warn", false, false, ""},
		{"xml", "", true, false, ""},
		{"text", "loud", true, false, ""},
	}
	for _, tt := range tests {
		var buf bytes.Buffer
		log, err := NewLogger(&buf, tt.format, tt.level)
		if tt.err {
			if !errors.Is(err, ErrLogOption) || !strings.HasPrefix(err.Error(), "server: ") {
				t.Errorf("NewLogger(%q, %q): error %v, want ErrLogOption", tt.format, tt.level, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("NewLogger(%q, %q): %v", tt.format, tt.level, err)
		}
		log.Debug("d")
		if got := strings.Contains(buf.String(), "d"); got != tt.debug {
			t.Errorf("NewLogger(%q, %q): debug written %v, want %v", tt.format, tt.level, got, tt.debug)
		}
		buf.Reset()
		log.Info("i")
		if got := buf.String(); !strings.HasPrefix(got, tt.prefix) || (tt.prefix == "") != (got == "") {
			t.Errorf("NewLogger(%q, %q): info record %q, want prefix %q", tt.format, tt.level, got, tt.prefix)
		}
	}
}

// Durations are written as read ("1.5s"), not as nanoseconds, in both
// formats, grouped or not.
func TestNewLoggerDurations(t *testing.T) {
	t.Parallel()
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		log, err := NewLogger(&buf, format, "")
		if err != nil {
			t.Fatal(err)
		}
		log.With("every", time.Second).WithGroup("g").Info("i", "took", 1500*time.Millisecond, "n", 3)
		got := buf.String()
		for _, want := range map[string][]string{
			"text": {"every=1s", "g.took=1.5s", "g.n=3"},
			"json": {`"every":"1s"`, `"g":{"took":"1.5s","n":3}`},
		}[format] {
			if !strings.Contains(got, want) {
				t.Errorf("%s: %q, want it to contain %q", format, got, want)
			}
		}
	}
}

// The startup line names the Redis mode, addresses and database, and
// never the password; or the memory store's bound.
func TestStoreAttr(t *testing.T) {
	t.Parallel()
	tests := []struct {
		url  string
		want []string
	}{
		{"redis://:s3cret@10.0.0.1:6380/4", []string{`"mode":"standalone"`, `"addrs":["10.0.0.1:6380"]`, `"db":4`, `"url":"redis://:xxxxx@10.0.0.1:6380/4"`}},
		{"rediss://user:s3cret@redis.example:6380", []string{`"tls":true`, `"db":0`, `user:xxxxx@`}},
		{"redis+cluster://:s3cret@10.0.0.1:7000?addr=10.0.0.2:7000", []string{`"mode":"cluster"`, `"addrs":["10.0.0.1:7000","10.0.0.2:7000"]`}},
		{"redis+sentinel://:s3cret@10.0.0.1:26379?master_name=main&sentinel_password=s3cret&db=2&wait_replicas=1", []string{`"mode":"sentinel"`, `"master":"main"`, `"sentinels":["10.0.0.1:26379"]`, `"db":2`, `:xxxxx@`, `sentinel_password=xxxxx`}},
		{"", []string{`"store":{"kind":"memory","max_keys":1000}`}},
	}
	for _, tt := range tests {
		s := &Server{opts: Options{RedisURL: tt.url, MaxKeys: 1000}}
		if tt.url != "" {
			raw, _, err := storeURLOptions(tt.url) // as the server does
			if err != nil {
				t.Fatal(err)
			}
			c, err := NewRedisClient(raw)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close() // never connected: clients dial lazily
			s.redis = c
		}
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("sluice started", s.storeAttr())
		got := buf.String()
		for _, w := range tt.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: %s lacks %s", tt.url, got, w)
			}
		}
		if strings.Contains(got, "s3cret") {
			t.Errorf("%s: password in %s", tt.url, got)
		}
	}
}

// TestCLILogJSON: under --log-format json every line the process writes
// is a JSON record, go-redis's own lines included (its Sentinel client
// logs the master it found).
func TestCLILogJSON(t *testing.T) {
	url := "redis+sentinel://" + redistest.SentinelAddr(t) + "?master_name=" + redistest.SentinelMaster
	p := startSluice(t, nil, "--redis", url, "--log-format", "json", "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
	if got := p.started["store.mode"] + " " + p.started["store.master"]; got != "sentinel "+redistest.SentinelMaster {
		t.Errorf("startup line: store mode and master %q; record %v", got, p.started)
	}
	if code, _ := p.post(t, "/v1/check", `{"policy":"gcra","key":"`+redistest.Prefix(t)+`"}`); code != 200 {
		t.Errorf("check: %d", code)
	}
	p.stop(t)
	redisLines := 0
	for line := range strings.Lines(p.stderr.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Errorf("not a JSON record: %q", line)
			continue
		}
		if rec["logger"] == "go-redis" {
			redisLines++
		}
	}
	if redisLines == 0 {
		t.Errorf("no go-redis record; stderr:\n%s", p.stderr.String())
	}
}

// go-redis's lines of one format go out once per quietFor, the next with
// the count of those held back: a Redis refusing connections costs a line
// every ten seconds, not one per failed call.
func TestRedisLoggerQuiet(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := redisLogger{slog.New(slog.NewTextHandler(&buf, nil)), &quiet{lines: map[string]*quietLine{}}}
	const dial = "redis: connection pool: failed to dial after %d attempts: %v"
	refused := "dial tcp 127.0.0.1:6379: connect: connection refused"
	for range 50 {
		l.Printf(context.Background(), dial, 5, refused)
	}
	l.Printf(context.Background(), "redis: sentinel: new master=%q addr=%q", "mymaster", "10.0.0.1:6379")
	l.Printf(context.Background(), "redis: sentinel: new master=%q addr=%q", "mymaster", "10.0.0.2:6379")
	if n := strings.Count(buf.String(), "failed to dial"); n != 1 {
		t.Errorf("%d dial lines, want 1:\n%s", n, buf.String())
	}
	if n := strings.Count(buf.String(), "new master"); n != 2 {
		t.Errorf("%d new-master lines, want both (they differ):\n%s", n, buf.String())
	}
	l.Printf(context.Background(), dial, 3, refused) // a different count: the same news
	if n := strings.Count(buf.String(), "failed to dial"); n != 1 {
		t.Errorf("%d dial lines after one with another count, want 1:\n%s", n, buf.String())
	}
	l.lines[dial].at = time.Now().Add(-quietFor)
	l.Printf(context.Background(), dial, 5, refused)
	if !strings.Contains(buf.String(), "repeats_not_logged=50") {
		t.Errorf("the next line does not count the 50 held back:\n%s", buf.String())
	}
}

// grpc-go's warnings repeated word for word go out once per quietFor, the
// next with the count of those held back: the connection cap closing
// stalled calls' connections costs a line every ten seconds, not one per
// call whose status could not be written. Other warnings still go out.
func TestGRPCLoggerQuiet(t *testing.T) {
	t.Parallel()
	var buf bytes.Buffer
	l := grpcLogger{slog.New(slog.NewTextHandler(&buf, nil)), &quiet{lines: map[string]*quietLine{}}}
	const closing = `[core] [Server #1] grpc: Server.processRPC failed to write status: connection error: desc = "transport is closing"`
	for range 30 {
		l.Warningf("[core] [Server #1] grpc: Server.processRPC failed to write status: %v", `connection error: desc = "transport is closing"`)
	}
	l.Warningln("[core]", "something else")
	if n := strings.Count(buf.String(), "failed to write status"); n != 1 {
		t.Errorf("%d lines of the same warning, want 1:\n%s", n, buf.String())
	}
	if !strings.Contains(buf.String(), "something else") {
		t.Errorf("another warning held back:\n%s", buf.String())
	}
	l.lines[closing].at = time.Now().Add(-quietFor)
	l.Warning(closing)
	if !strings.Contains(buf.String(), "repeats_not_logged=29") {
		t.Errorf("the next line does not count the 29 held back:\n%s", buf.String())
	}
}
