package redisstore

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/storetest"
)

// TestGrantAll: each of a GrantAll's requests is the call it names, its
// result as that call's alone, bad input failing only its own; batched
// and alone.
func TestGrantAll(t *testing.T) {
	ctx := context.Background()
	c := redistest.Client(t)
	clock := storetest.NewClock(storetest.T0)
	l := sluice.PerMinute(10)
	for _, o := range []Options{{}, {MaxBatch: 1}} {
		t.Run(fmt.Sprint("MaxBatch ", o.MaxBatch), func(t *testing.T) {
			o.Prefix, o.Clock = redistest.Prefix(t), clock.Now
			s := New(c, &o)
			g, err := s.Grant(ctx, "a", l, 3)
			if err != nil || g.Granted != 3 {
				t.Fatalf("grant = %+v, %v", g, err)
			}
			res := s.GrantAll(ctx, []sluice.GrantRequest{
				{Key: "a", Limit: l, N: 4, Grant: g, Unused: 3},
				{Key: "b", Limit: l, N: 2},
				{Key: "c", Limit: l, N: 0},
				{Key: "d", Limit: sluice.Limit{Algorithm: sluice.SlidingWindowLog, Rate: 10, Period: l.Period}, N: 1},
				{Key: "e", Limit: l, N: 11},
			})
			if got, want := len(res), 5; got != want {
				t.Fatalf("%d results; want %d", got, want)
			}
			if r := res[0]; r.Err != nil || r.Returned != 3 || r.Grant.Granted != 4 {
				t.Errorf("regrant of a = %+v; want 3 returned, 4 granted", r)
			}
			if r := res[1]; r.Err != nil || r.Returned != 0 || r.Grant.Granted != 2 {
				t.Errorf("grant of b = %+v; want 2 granted", r)
			}
			for i, want := range []error{sluice.ErrInvalidCost, sluice.ErrGrantUnsupported, sluice.ErrCostExceedsBurst} {
				if err := res[2+i].Err; !errors.Is(err, want) {
					t.Errorf("request %d: %v; want %v", 2+i, err, want)
				}
			}
			for key, want := range map[string]int64{"a": 6, "b": 8, "c": 10, "e": 10} {
				d, err := s.Peek(ctx, key, l, 1)
				if err != nil {
					t.Fatal(err)
				}
				if d.Remaining != want {
					t.Errorf("%s: %d left; want %d", key, d.Remaining, want)
				}
			}
		})
	}
	var zero Store
	for i, r := range zero.GrantAll(ctx, []sluice.GrantRequest{{Key: "a", Limit: l, N: 1}, {Key: "b", Limit: l, N: 1}}) {
		if !errors.Is(r.Err, ErrNoClient) {
			t.Errorf("zero Store, request %d: %v; want ErrNoClient", i, r.Err)
		}
	}
}

// TestGrantAllOneBatch: with the default options a GrantAll's grants go
// as one pipeline, one round trip, however many batches MaxInFlight
// allows at once (2 by default: side by side, four grants took two).
func TestGrantAllOneBatch(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	t.Cleanup(func() { c.Close() })
	h := &sendCount{}
	c.AddHook(h)
	s := New(c, &Options{Prefix: redistest.Prefix(t)})
	l := sluice.PerMinute(10)
	reqs := make([]sluice.GrantRequest, 4)
	for i := range reqs {
		reqs[i] = sluice.GrantRequest{Key: fmt.Sprint("k", i), Limit: l, N: 2}
	}
	s.GrantAll(ctx, reqs) // the script loaded
	h.reset()
	for i, r := range s.GrantAll(ctx, reqs) {
		if r.Err != nil || r.Grant.Granted != 2 {
			t.Fatalf("grant %d = %+v", i, r)
		}
	}
	if sends, cmds := h.get(); sends != 1 || cmds != 4 {
		t.Errorf("%d sends of %d commands; want 1 of 4", sends, cmds)
	}
}

// sendCount is a go-redis hook that counts sends (a command alone or a
// pipeline) and the commands in them.
type sendCount struct {
	mu          sync.Mutex
	sends, cmds int
}

func (h *sendCount) reset()          { h.mu.Lock(); h.sends, h.cmds = 0, 0; h.mu.Unlock() }
func (h *sendCount) get() (int, int) { h.mu.Lock(); defer h.mu.Unlock(); return h.sends, h.cmds }

func (h *sendCount) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) { return next(ctx, network, addr) }
}

func (h *sendCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		h.sends++
		h.cmds++
		h.mu.Unlock()
		return next(ctx, cmd)
	}
}

func (h *sendCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.mu.Lock()
		h.sends++
		h.cmds += len(cmds)
		h.mu.Unlock()
		return next(ctx, cmds)
	}
}

// TestGrantAllPastMaxBatch: a GrantAll of more requests than MaxBatch
// answers each once, in batches of MaxBatch that go side by side while
// the lane has free slots. The rest was queued behind the first batch, to
// wait for its round trip with a slot free.
func TestGrantAllPastMaxBatch(t *testing.T) {
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: redistest.Addr(t)})
	t.Cleanup(func() { c.Close() })
	h := &sendCount{}
	meet := &pipelineMeet{met: make(chan struct{})}
	c.AddHook(h)
	c.AddHook(meet)
	s := New(c, &Options{Prefix: redistest.Prefix(t), MaxBatch: 4, MaxInFlight: 2})
	l := sluice.PerMinute(10)
	reqs := make([]sluice.GrantRequest, 10)
	for i := range reqs {
		reqs[i] = sluice.GrantRequest{Key: fmt.Sprint("w", i), Limit: l, N: 2}
	}
	s.GrantAll(ctx, reqs) // the script loaded, the connections dialled
	for i := range reqs {
		reqs[i].Key = fmt.Sprint("k", i)
	}
	h.reset()
	meet.armed.Store(true)
	for i, r := range s.GrantAll(ctx, reqs) {
		if r.Err != nil || r.Grant.Granted != 2 {
			t.Errorf("grant %d = %+v", i, r)
		}
	}
	meet.armed.Store(false)
	// 4 and 4 side by side, then the last 2 on the first slot to finish.
	if sends, cmds := h.get(); sends != 3 || cmds != 10 {
		t.Errorf("%d sends of %d commands; want 3 of 10", sends, cmds)
	}
	if meet.alone.Load() {
		t.Error("the second batch waited for the first with a slot free")
	}
	for _, r := range reqs {
		d, err := s.Peek(ctx, r.Key, l, 1)
		if err != nil {
			t.Fatal(err)
		}
		if d.Remaining != 8 {
			t.Errorf("%s: %d left; want 8 (granted once)", r.Key, d.Remaining)
		}
	}
}

// pipelineMeet is a go-redis hook that, while armed, holds each pipeline
// of scripts until want of them (0: 2) are under way side by side (met
// closed), or for 2 s (alone).
type pipelineMeet struct {
	want  int
	armed atomic.Bool
	alone atomic.Bool
	mu    sync.Mutex
	in    int
	met   chan struct{}
}

func (m *pipelineMeet) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (m *pipelineMeet) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (m *pipelineMeet) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !m.armed.Load() || cmds[0].Name() != "evalsha" {
			return next(ctx, cmds)
		}
		m.mu.Lock()
		if m.in++; m.in == max(m.want, 2) {
			close(m.met)
		}
		m.mu.Unlock()
		select {
		case <-m.met:
		case <-time.After(2 * time.Second):
			m.alone.Store(true)
		}
		return next(ctx, cmds)
	}
}
