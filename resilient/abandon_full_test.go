package resilient

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/releasetest"
	"github.com/sluicehq/sluice/redisstore"
)

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// With sluice.MaxBackgroundReleases at work, the backend release of a
// holder whose backend Acquire failed is not sent, and says so:
// TryAbandonSlot returns ErrRetriesFull, AcquireSlot sets ReleaseDropped
// on the policy's denial, and a release of a fallback slot whose backend
// release is dropped logs a line. Before, all three were silent. Not
// parallel: it fills the process's bound.
func TestAbandonNotSentSaysSo(t *testing.T) {
	ctx := context.Background()
	client := redis.NewClient(&redis.Options{Addr: redistest.DeadAddr(t), MaxRetries: -1, DialerRetries: 1})
	t.Cleanup(func() { client.Close() })
	backend := redisstore.New(client, &redisstore.Options{Prefix: redistest.Prefix(t)})
	l := sluice.Concurrent(5, time.Minute)

	closed, err := New(backend, &Options{Policy: FailClosed, Logger: discard})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closed.Close() })
	if _, err := closed.Acquire(ctx, "k", l, 1, "sent"); err != nil {
		t.Fatal(err)
	}
	logs := &lockedBuffer{}
	local, err := New(backend, &Options{Policy: FallbackLocal, Name: "local", Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { local.Close() })
	if d, err := local.Acquire(ctx, "k", l, 1, "fallback"); err != nil || !d.Allowed || d.Source != sluice.SourceFallback {
		t.Fatalf("Acquire = %+v, %v; want allowed by the fallback", d, err)
	}

	releasetest.Fill(t, time.Now().Add(2*time.Second))
	if err := closed.TryAbandonSlot("k", "sent"); !errors.Is(err, sluice.ErrRetriesFull) {
		t.Errorf("TryAbandonSlot with the bound full = %v, want ErrRetriesFull", err)
	}
	if err := closed.TryAbandonSlot("k", "never"); err != nil {
		t.Errorf("TryAbandonSlot of a holder never sent = %v, want nil (nothing to send)", err)
	}
	slot, d, err := sluice.AcquireSlot(ctx, closed, "k", l, 1)
	if err != nil || slot != nil || d.Source != sluice.SourceFailClosed {
		t.Fatalf("AcquireSlot = %v, %+v, %v; want FailClosed's denial", slot, d, err)
	}
	if !d.ReleaseDropped {
		t.Error("AcquireSlot's denial after a failed backend acquire, its release not sent: ReleaseDropped false")
	}
	if ok, err := local.Release(ctx, "k", "fallback"); err != nil || !ok {
		t.Fatalf("Release of the fallback slot = %v, %v", ok, err)
	}
	want := `level=WARN msg="resilient: release of a slot the backend may hold not sent: too many being sent in the background; it frees at its hold timeout" store=local dropped=1 max_background=1024`
	if got := logs.String(); !strings.Contains(got, want) {
		t.Errorf("log:\n%s\nwant a line with %q", got, want)
	}
}
