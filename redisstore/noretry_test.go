package redisstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/resilient"
	"github.com/sluicehq/sluice/storetest"
)

// cutProxy forwards TCP connections to a Redis server. Once armed, it lets
// the next script call through to Redis and then closes that connection as
// Redis's reply comes back, so the client loses the reply of a script the
// server ran: what a dropped connection or a read timeout does.
type cutProxy struct {
	Addr   string
	target string
	armed  atomic.Bool
	cuts   atomic.Int64
	l      net.Listener
	wg     sync.WaitGroup
}

func startCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	l := redistest.Listen(t)
	p := &cutProxy{Addr: l.Addr().String(), target: target, l: l}
	p.wg.Go(p.serve)
	t.Cleanup(func() { l.Close(); p.wg.Wait() })
	return p
}

func (p *cutProxy) serve() {
	for {
		in, err := p.l.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.target)
		if err != nil {
			in.Close()
			continue
		}
		var sentScript atomic.Bool // a script call went to Redis on this connection
		p.wg.Go(func() {
			defer out.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := in.Read(buf)
				if n > 0 {
					if bytes.Contains(bytes.ToLower(buf[:n]), []byte("eval")) {
						sentScript.Store(true)
					}
					if _, werr := out.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
		p.wg.Go(func() {
			defer in.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := out.Read(buf)
				if n > 0 && sentScript.Load() && p.armed.CompareAndSwap(true, false) {
					p.cuts.Add(1)
					out.Close()
					return // the reply is dropped with the connection
				}
				if n > 0 {
					if _, werr := in.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					if !errors.Is(err, io.EOF) {
						out.Close()
					}
					return
				}
			}
		})
	}
}

// TestChargedOnce: a take whose reply is lost after Redis ran it fails,
// and is charged exactly once: go-redis does not send it again, alone or in
// a pipeline, on a standalone client or a cluster client. Wrapped in
// resilient.Store, the caller gets the failure policy's answer.
func TestChargedOnce(t *testing.T) {
	ctx := context.Background()
	direct := redistest.Client(t)
	proxy := startCutProxy(t, redistest.Addr(t))
	clock := storetest.NewClock(storetest.T0)
	l := sluice.PerMinute(10)

	// A one-master cluster behind the proxy: the cluster client learns its
	// node (the proxy) from ClusterSlots, so every command crosses it.
	cluster := redistest.StartCluster(t, &redistest.ClusterOptions{Masters: 1})
	clusterProxy := startCutProxy(t, cluster.Nodes[0].Addr)
	clusterDirect := redis.NewClient(&redis.Options{Addr: cluster.Nodes[0].Addr})
	t.Cleanup(func() { clusterDirect.Close() })

	clients := []struct {
		name   string
		proxy  *cutProxy
		direct redis.UniversalClient
		client func() redis.UniversalClient
	}{
		{"standalone", proxy, direct, func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: proxy.Addr})
		}},
		{"cluster", clusterProxy, clusterDirect, func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{
				ClusterSlots: func(context.Context) ([]redis.ClusterSlot, error) {
					return []redis.ClusterSlot{{Start: 0, End: 16383, Nodes: []redis.ClusterNode{{Addr: clusterProxy.Addr}}}}, nil
				},
			})
		}},
	}
	for _, cl := range clients {
		c := cl.client()
		t.Cleanup(func() { c.Close() })
		prefix := redistest.Prefix(t) + cl.name + ":"
		charged := func(t *testing.T, s *Store, key string) int64 {
			t.Helper()
			peek := New(cl.direct, &Options{Prefix: prefix, Clock: clock.Now})
			d, err := peek.Peek(ctx, key, l, 1)
			if err != nil {
				t.Fatal(err)
			}
			return l.Rate - d.Remaining
		}
		for _, mode := range []struct {
			name string
			opts Options
		}{
			{"alone", Options{MaxBatch: 1}},
			{"batched", Options{}},
		} {
			t.Run(cl.name+"/"+mode.name, func(t *testing.T) {
				o := mode.opts
				o.Prefix, o.Clock = prefix, clock.Now
				s := New(c, &o)
				key := "take-" + mode.name
				if _, err := s.Take(ctx, key, l, 1); err != nil { // warm: scripts loaded, a connection pooled
					t.Fatal(err)
				}
				cl.proxy.armed.Store(true)
				if d, err := s.Take(ctx, key, l, 1); err == nil {
					t.Fatalf("take whose reply was lost: %+v, want an error", d)
				}
				if got, want := charged(t, s, key), int64(2); got != want {
					t.Errorf("charged %d, want %d (the warm-up and the lost take, once)", got, want)
				}

				// The same behind the failure policy: its answer, no error.
				// A timeout the take cannot meet on a loaded machine (the lost
				// reply's connection is gone: a dial comes first) would cut it
				// before it reached Redis, and prove nothing: charged 2.
				rs, err := resilient.New(s, &resilient.Options{Policy: resilient.FailClosed, Timeout: 5 * time.Second})
				if err != nil {
					t.Fatal(err)
				}
				defer rs.Close()
				cl.proxy.armed.Store(true)
				d, err := rs.Take(ctx, key, l, 1)
				if err != nil || d.Source != sluice.SourceFailClosed {
					t.Errorf("resilient take whose reply was lost: %+v %v, want the fail-closed answer", d, err)
				}
				if got, want := charged(t, s, key), int64(3); got != want {
					t.Errorf("charged %d, want %d", got, want)
				}
			})
		}

		// A pipeline of many takes, each its own command: the whole
		// pipeline's reply is lost, and no take is sent again.
		t.Run(cl.name+"/pipeline", func(t *testing.T) {
			s := New(c, &Options{Prefix: prefix, Clock: clock.Now, MaxInFlight: 1})
			now, _ := s.now()
			const n = 16
			var units []*unit
			for i := range n {
				c := s.oneKey(modeTake, fmt.Sprint("pipe-", i), l, now, 1)
				units = append(units, &unit{script: c.script, args: c.args, calls: []*call{c}})
			}
			// Warm the script cache so the lost pipeline is the first send.
			if _, err := s.Take(ctx, "pipe-warm", l, 1); err != nil {
				t.Fatal(err)
			}
			cl.proxy.armed.Store(true)
			s.batch.exec(ctx, units)
			for i, u := range units {
				if u.cmd.Err() == nil {
					t.Errorf("take %d of a pipeline whose reply was lost: no error", i)
				}
				if got := charged(t, s, fmt.Sprint("pipe-", i)); got != 1 {
					t.Errorf("take %d charged %d times, want once", i, got)
				}
			}
		})
		if got := cl.proxy.cuts.Load(); got != 5 {
			t.Errorf("%s: proxy cut %d replies, want 5", cl.name, got)
		}
	}
}

// TestGrantSentOnce: a grant, return or regrant whose reply is lost after
// Redis ran it fails, and ran exactly once: resent, a grant would strand
// units and a return would make them. Alone and batched.
func TestGrantSentOnce(t *testing.T) {
	ctx := context.Background()
	direct := redistest.Client(t)
	proxy := startCutProxy(t, redistest.Addr(t))
	c := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { c.Close() })
	clock := storetest.NewClock(storetest.T0)
	l := sluice.PerMinute(10)
	for _, mode := range []struct {
		name string
		opts Options
	}{
		{"alone", Options{MaxBatch: 1}},
		{"batched", Options{}},
	} {
		t.Run(mode.name, func(t *testing.T) {
			o := mode.opts
			o.Prefix, o.Clock = redistest.Prefix(t), clock.Now
			s := New(c, &o)
			peek := New(direct, &Options{Prefix: o.Prefix, Clock: clock.Now})
			left := func() int64 {
				t.Helper()
				d, err := peek.Peek(ctx, "k", l, 1)
				if err != nil {
					t.Fatal(err)
				}
				return d.Remaining
			}
			if _, err := s.Take(ctx, "k", l, 6); err != nil { // warm: scripts loaded, a connection pooled
				t.Fatal(err)
			}
			g, err := s.Grant(ctx, "k", l, 2)
			if err != nil || g.Granted != 2 {
				t.Fatalf("grant = %+v, %v", g, err)
			}
			proxy.armed.Store(true)
			if g, err := s.Grant(ctx, "k", l, 1); err == nil {
				t.Fatalf("grant whose reply was lost: %+v, want an error", g)
			}
			if got := left(); got != 1 {
				t.Fatalf("after a lost grant of 1: %d left, want 1 (granted once)", got)
			}
			proxy.armed.Store(true)
			if n, err := s.Return(ctx, "k", l, g, 2); err == nil {
				t.Fatalf("return whose reply was lost: %d, want an error", n)
			}
			if got := left(); got != 3 {
				t.Fatalf("after a lost return of 2: %d left, want 3 (returned once)", got)
			}
			g, err = s.Grant(ctx, "k", l, 2)
			if err != nil || g.Granted != 2 {
				t.Fatalf("grant = %+v, %v", g, err)
			}
			proxy.armed.Store(true)
			if n, next, err := s.Regrant(ctx, "k", l, g, 2, 1); err == nil {
				t.Fatalf("regrant whose reply was lost: %d, %+v, want an error", n, next)
			}
			// 1 left, 2 back, 1 granted: 2. Run twice it would leave 3.
			if got := left(); got != 2 {
				t.Fatalf("after a lost regrant (2 back, 1 granted): %d left, want 2 (run once)", got)
			}
		})
	}
}
