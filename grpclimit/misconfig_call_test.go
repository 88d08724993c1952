package grpclimit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/memory"
)

// logBuffer is a slog JSON sink safe for the server's goroutines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// lines returns the records written so far.
func (b *logBuffer) lines(t *testing.T) []map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(b.buf.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

// A call a rule cannot weigh (Cost below 1) or key (its key function
// fails) gets Internal with a generic message: no rule name, package or
// error reaches the client. The detail goes to the Observer (an error for
// the rule) and to the log, once, saying which it was. Over a real server
// and client.
func TestMisconfiguredCallIsGeneric(t *testing.T) {
	t.Parallel()
	store := memory.New(nil)
	t.Cleanup(func() { store.Close() })
	for _, tt := range []struct {
		name, msg, detail string
		rule              Rule
	}{
		{
			name: "cost", msg: "grpclimit: rule cannot weigh call", detail: "invalid cost",
			rule: Rule{Name: "per-key", Limit: sluice.PerMinute(10), Key: Global(),
				Cost: func(context.Context, string) int64 { return 0 }},
		},
		{
			name: "key", msg: "grpclimit: rule cannot key call", detail: "vault sealed",
			rule: Rule{Name: "per-key", Limit: sluice.PerMinute(10),
				Key: func(context.Context, string) (string, error) { return "", errors.New("vault sealed") }},
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var logs logBuffer
			obs := &errorCount{}
			client := serve(t, store, []Rule{tt.rule}, &Options{
				Observer: obs,
				Logger:   slog.New(slog.NewJSONHandler(&logs, nil)),
			})
			for i := range 3 {
				_, err := client.Check(context.Background(), &healthpb.HealthCheckRequest{})
				st, _ := status.FromError(err)
				if st.Code() != codes.Internal || st.Message() != "grpclimit: rate limiter misconfigured" {
					t.Fatalf("call %d: %v, want Internal \"grpclimit: rate limiter misconfigured\"", i, err)
				}
				if len(st.Details()) != 0 {
					t.Errorf("call %d: details %v, want none", i, st.Details())
				}
			}
			if got := obs.n.Load(); got != 3 {
				t.Errorf("observed errors %d, want 3", got)
			}
			lines := logs.lines(t)
			if len(lines) != 1 {
				t.Fatalf("log lines %v, want one (the next within a minute are counted, not written)", lines)
			}
			l := lines[0]
			errText, _ := l["error"].(string)
			if l["level"] != "ERROR" || l["msg"] != tt.msg || l["method"] != "/grpc.health.v1.Health/Check" ||
				!strings.Contains(errText, `rule "per-key"`) || !strings.Contains(errText, tt.detail) {
				t.Errorf("log line %v, want ERROR %q naming the method, the rule and %q", l, tt.msg, tt.detail)
			}
		})
	}
}
