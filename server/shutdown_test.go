//go:build unix

package server

import (
	"context"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/redisstore"
)

// stallProxy forwards TCP to a Redis until stalled: then every byte either
// way waits, as with a Redis that hangs, while the Redis itself (shared by
// other tests) keeps serving them.
type stallProxy struct {
	ln   net.Listener
	mu   sync.RWMutex // held for writing while stalled
	once sync.Once
	// replies, while set, is closed when Redis's replies may pass again
	// (holdReplies): commands still reach Redis.
	replies atomic.Pointer[chan struct{}]
	conns   []net.Conn
	cmu     sync.Mutex
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	ln := redistest.Listen(t)
	p := &stallProxy{ln: ln}
	t.Cleanup(func() {
		ln.Close()
		p.cmu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.cmu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			u, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			p.cmu.Lock()
			p.conns = append(p.conns, c, u)
			p.cmu.Unlock()
			go p.pipe(u, c, false)
			go p.pipe(c, u, true)
		}
	}()
	return p
}

func (p *stallProxy) pipe(dst, src net.Conn, replies bool) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if gate := p.replies.Load(); replies && gate != nil {
				<-*gate
			}
			p.mu.RLock() // waits while stalled
			_, werr := dst.Write(buf[:n])
			p.mu.RUnlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			if err != io.EOF {
				dst.Close()
			}
			return
		}
	}
}

// holdReplies holds Redis's replies until passReplies; commands still
// reach Redis.
func (p *stallProxy) holdReplies() {
	gate := make(chan struct{})
	p.replies.Store(&gate)
}

func (p *stallProxy) passReplies() {
	if gate := p.replies.Swap(nil); gate != nil {
		close(*gate)
	}
}

// stall holds every byte from now on, for good.
func (p *stallProxy) stall() { p.once.Do(p.mu.Lock) }

func (p *stallProxy) addr() string { return p.ln.Addr().String() }

// TestCLISecondSignalWithRedisStalled: the first stop signal waits for a
// request that waits on a stalled Redis; a second signal (SIGTERM again
// past the repeat window, another one at once, or SIGINT again within the
// window: Ctrl-C twice) stops the process at once, though the fleet, the
// leases and the store would each wait on Redis to say goodbye.
func TestCLISecondSignalWithRedisStalled(t *testing.T) {
	for _, tt := range []struct {
		name          string
		first, second syscall.Signal
		after         time.Duration
	}{
		{"SIGTERM past the repeat window", syscall.SIGTERM, syscall.SIGTERM, repeatWindow + 200*time.Millisecond},
		{"SIGINT at once", syscall.SIGTERM, syscall.SIGINT, time.Millisecond},
		{"SIGINT twice", syscall.SIGINT, syscall.SIGINT, 300 * time.Millisecond},
	} {
		t.Run(tt.name, func(t *testing.T) {
			proxy := newStallProxy(t, redistest.Addr(t))
			cfg := writeConfig(t, "policies:\n  - name: a\n    limit: 100/s\n    lease: 50ms\n")
			p := startSluice(t, nil, "--config", cfg, "--redis", "redis://"+proxy.addr(), "--decision-timeout", "10s",
				"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0")
			key := redistest.Prefix(t)
			for range 20 { // leases taken, so that there are units to return
				if code, m := p.post(t, "/v1/check", `{"policy":"a","key":"`+key+`"}`); code != 200 {
					t.Fatalf("check: %d %v", code, m)
				}
			}
			proxy.stall()
			go func() { // in flight, waiting on Redis for up to 10s
				http.Post("http://"+p.http+"/v1/check", "application/json", strings.NewReader(`{"policy":"a","key":"`+key+`:other"}`))
			}()
			time.Sleep(200 * time.Millisecond)
			p.signal(t, tt.first)
			p.expect(t, "shutting down")
			time.Sleep(tt.after)
			start := time.Now()
			p.signal(t, tt.second)
			err := p.cmd.Wait()
			if took := time.Since(start); took > 700*time.Millisecond {
				t.Errorf("exit %v after the second signal, want at once; stderr:\n%s", took, p.stderr.String())
			}
			if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 {
				t.Errorf("exit after a forced stop: %v, want status 1", err)
			}
			p.expect(t, "forced stop")
			if r := p.expect(t, "stopped"); r["forced"] != "true" {
				t.Errorf("stopped %v, want forced=true", r)
			}
		})
	}
}

// TestCLIRepeatedSignalIsOne: SIGTERM twice a millisecond apart, as GNU
// timeout sends it (to the process, then to its process group), is one
// request to stop, not two: the stop is graceful, exit status 0, the fleet
// registration withdrawn and the leases' units returned. So is a third
// within the window, logged with how to force the stop.
func TestCLIRepeatedSignalIsOne(t *testing.T) {
	r := redistest.StartServer(t)
	proxy := newStallProxy(t, r.Addr)
	url := "redis://" + proxy.addr()
	cfg := writeConfig(t, "policies:\n  - name: a\n    limit: 100/s\n    lease: 1s\n")
	p := startSluice(t, nil, "--config", cfg, "--redis", url, "--decision-timeout", "5s",
		"--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0", "--watch-interval", "0")
	(&fleet{procs: []*proc{p}}).awaitRegistry(t)
	admin := r.Client(t)
	_, opts, err := storeURLOptions(url)
	if err != nil {
		t.Fatal(err)
	}
	registry := redisstore.New(admin, &opts).Membership().Key()
	ctx := context.Background()
	if n, err := admin.ZCard(ctx, registry).Result(); err != nil || n != 1 {
		t.Fatalf("registry %s: %d members (%v), want this instance", registry, n, err)
	}
	for range 5 { // a lease taken, so that there are units to return
		if code, m := p.post(t, "/v1/check", `{"policy":"a","key":"k"}`); code != 200 {
			t.Fatalf("check: %d %v", code, m)
		}
	}
	// A request in flight until Redis's replies pass again, so that the
	// second signal comes while the stop is under way.
	proxy.holdReplies()
	go http.Post("http://"+p.http+"/v1/check", "application/json", strings.NewReader(`{"policy":"a","key":"other"}`))
	time.Sleep(200 * time.Millisecond)
	p.signal(t, syscall.SIGTERM)
	time.Sleep(time.Millisecond)
	p.signal(t, syscall.SIGTERM)
	p.expect(t, "shutting down")
	time.Sleep(300 * time.Millisecond)
	p.signal(t, syscall.SIGTERM)       // surely past the first, within the window
	time.Sleep(500 * time.Millisecond) // a forced stop would be over
	proxy.passReplies()
	if r := p.expect(t, "stopped"); r["forced"] != "false" {
		t.Errorf("stopped %v, want forced=false; stderr:\n%s", r, p.stderr.String())
	}
	if err := p.cmd.Wait(); err != nil {
		t.Errorf("exit after SIGTERM twice at once: %v, want status 0; stderr:\n%s", err, p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), `msg="signal repeated: the same stop, still graceful; to force it, send another signal, or this one again after the window" signal=terminated window=1s`) {
		t.Errorf("log: want signal repeated, saying how to force the stop:\n%s", p.stderr.String())
	}
	for _, bad := range []string{"forced stop", "not withdrawn", "not returned"} {
		if strings.Contains(p.stderr.String(), bad) {
			t.Errorf("log says %q:\n%s", bad, p.stderr.String())
		}
	}
	if n, err := admin.ZCard(ctx, registry).Result(); err != nil || n != 0 {
		t.Errorf("registry: %d members (%v) after the stop, want the registration withdrawn", n, err)
	}
	if n, err := admin.ZCard(ctx, registry+":left").Result(); err != nil || n != 1 {
		t.Errorf("registry: %d members listed as withdrawn (%v), want 1", n, err)
	}
}

// TestCLILateSignalAfterStop: a SIGTERM that arrives once the graceful
// stop is over (GNU timeout's second one, to the process group, sent after
// a quick stop) does not change the exit status: 0, not 143 as an
// uncaught SIGTERM would have it. From the "stopped" line on, SIGTERM is
// sent again and again until the process is gone, so that some land
// between the end of the stop and the exit; a few processes in a row, as
// that window is short.
func TestCLILateSignalAfterStop(t *testing.T) {
	for range 20 {
		p := startSluice(t, nil, "--http", "127.0.0.1:0", "--grpc", "127.0.0.1:0")
		exited := make(chan error, 1)
		go func() { exited <- p.cmd.Wait() }()
		p.signal(t, syscall.SIGTERM)
		if r := p.expect(t, "stopped"); r["forced"] != "false" {
			t.Fatalf("stopped %v, want forced=false", r)
		}
		deadline := time.After(10 * time.Second)
		var err error
	late:
		for {
			select {
			case err = <-exited:
				break late
			case <-deadline:
				t.Fatalf("still running 10s after its stop; stderr:\n%s", p.stderr.String())
			default:
				p.cmd.Process.Signal(syscall.SIGTERM) // fails once it is gone
			}
		}
		if err != nil {
			t.Fatalf("exit with SIGTERM sent after the graceful stop: %v, want status 0; stderr:\n%s", err, p.stderr.String())
		}
	}
}
