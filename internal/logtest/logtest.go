// Package logtest holds the tests' log sink: a buffer the goroutines of
// servers, timers and background sends may all write to, read back as
// text or as JSON records.
package logtest

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// Log is a log destination safe for concurrent writers.
type Log struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Logger is a JSON logger writing to l, for Records.
func (l *Log) Logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// TextLogger is a text logger writing to l, for String.
func (l *Log) TextLogger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns what was written so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Records returns the JSON records written so far.
func (l *Log) Records(t testing.TB) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.Lines(l.String()) {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}
