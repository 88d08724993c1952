package redistest

import (
	"errors"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// DelayProxy is a TCP proxy in front of a server that holds every chunk
// of bytes, in each direction, for a set delay before passing it on, in
// order: a Redis that answers, but slowly (a distant region, a congested
// link). A round trip through it takes twice the delay more than one
// straight to the server.
type DelayProxy struct {
	// Addr is the proxy's loopback host:port.
	Addr string

	target   string
	ln       net.Listener
	delay    atomic.Int64 // each way, ns
	dark     atomic.Bool  // Drop: bytes are taken, never passed on
	accepted atomic.Int64
	open     atomic.Int64

	mu     sync.Mutex
	conns  map[net.Conn]struct{}
	closed bool
	wg     sync.WaitGroup
}

// StartDelayProxy starts a proxy to target (host:port) on a port of
// Listen's, with no delay, and stops it at cleanup.
func StartDelayProxy(t testing.TB, target string) *DelayProxy {
	t.Helper()
	p := &DelayProxy{target: target, ln: Listen(t), conns: make(map[net.Conn]struct{})}
	p.Addr = p.ln.Addr().String()
	p.wg.Add(1)
	go p.serve()
	t.Cleanup(p.Close)
	return p
}

// SetDelay sets the delay each way, for the bytes read from now on.
func (p *DelayProxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Accepted returns how many connections the proxy has accepted.
func (p *DelayProxy) Accepted() int64 { return p.accepted.Load() }

// Open returns how many connections are open through the proxy: accepted,
// and not yet closed by the client (bytes still on their way to the
// server do not keep one open).
func (p *DelayProxy) Open() int64 { return p.open.Load() }

// Close stops the proxy and closes every connection through it.
func (p *DelayProxy) Close() {
	p.mu.Lock()
	p.closed = true
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}

// track adds c to the connections Close closes, or closes it at once if
// the proxy is closed.
func (p *DelayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		c.Close()
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *DelayProxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
	c.Close()
}

func (p *DelayProxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.accepted.Add(1)
		if !p.track(c) {
			continue
		}
		p.wg.Add(1)
		go p.relay(c)
	}
}

// relay carries one client connection to the target and back.
func (p *DelayProxy) relay(c net.Conn) {
	defer p.wg.Done()
	defer p.untrack(c)
	p.open.Add(1)
	var once sync.Once
	closed := func() { once.Do(func() { p.open.Add(-1) }) }
	defer closed()
	u, err := net.DialTimeout("tcp", p.target, 5*time.Second)
	if err != nil || !p.track(u) {
		return
	}
	defer p.untrack(u)
	done := make(chan struct{}, 2)
	go func() { p.pipe(u, c, closed); done <- struct{}{} }()
	go func() { p.pipe(c, u, func() {}); done <- struct{}{} }()
	<-done // either side gone: close both
	c.Close()
	u.Close()
	<-done
}

type chunk struct {
	b   []byte
	due time.Time
}

// pipe copies src to dst, each chunk once the delay from its read has
// passed; ended runs when src's reads end.
func (p *DelayProxy) pipe(dst, src net.Conn, ended func()) {
	ch := make(chan chunk, 1024)
	go func() {
		defer close(ch)
		defer ended()
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if n > 0 {
				ch <- chunk{slices.Clone(buf[:n]), time.Now().Add(time.Duration(p.delay.Load()))}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range ch {
		if d := time.Until(c.due); d > 0 {
			time.Sleep(d)
		}
		if p.dark.Load() {
			continue
		}
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close() // ends the reader, which closes ch
	for range ch {
	}
}
