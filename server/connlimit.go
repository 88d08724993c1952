package server

import (
	"container/list"
	"context"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultMaxConnections is each listener's connection cap: both listeners
// full stay well under a common open-file limit, with room for Redis.
const DefaultMaxConnections = 4096

// Timeouts of the HTTP and gRPC servers, variables so that tests can
// shorten them. A JSON body is at most MaxBodyBytes: a client still
// sending its request after httpReadTimeout is cut off, so that slow
// clients cannot hold connections (and file descriptors) for good.
var (
	httpReadHeaderTimeout = 10 * time.Second
	httpReadTimeout       = 20 * time.Second // headers and body
	// httpWriteTimeout, plus the decision timeout, bounds a response; no
	// endpoint streams (the dashboard polls).
	httpWriteTimeout = time.Minute
	httpIdleTimeout  = 2 * time.Minute
	// A gRPC connection must finish its handshake within grpcHandshake,
	// and one without calls for grpcMaxIdle is sent away (GOAWAY; Envoy
	// reconnects when it next needs to). A peer that stops answering
	// pings (every grpcPing, within grpcPingTimeout) is closed.
	grpcHandshake   = 10 * time.Second
	grpcMaxIdle     = 5 * time.Minute
	grpcPing        = time.Minute
	grpcPingTimeout = 20 * time.Second
)

// capListener accepts at most cap connections at once. At the cap, a new
// connection makes room by closing the oldest silent one (accepted, but
// nothing heard yet: see connSilent) older than silentGrace, else the one
// stalled the longest (requests begun, none arrived whole: see
// connStalled) for stallMin, else the one idle the longest (HTTP: between
// requests, as ConnState reports; gRPC: past its handshake with no call in
// progress, as grpcConns reports), so that silent sockets, requests that
// never finish arriving and idle pools cannot lock fresh clients (probes,
// scrapes, Envoy) out until their timeouts; with none of those it takes
// one of the few probe places (HTTP only: see probesOnly), where a silent,
// stalled or idle holder gives way the same, or is closed at once (the
// client sees a reset and can try another instance) rather than left
// queued. Both are counted and logged at most once per quietFor.
type capListener struct {
	net.Listener
	name string
	sem  chan struct{}
	// probes are the places past the cap, for health probes alone: a pod
	// busy to its cap is still alive and maybe ready, and a probe refused
	// would have Kubernetes restart it. nil: none (gRPC).
	probes     chan struct{}
	refused    prometheus.Counter
	idleClosed prometheus.Counter
	log        *slog.Logger
	lastLog    atomic.Int64 // unix nanoseconds of the last refusal logged
	lastIdle   atomic.Int64 // of the last idle connection closed logged

	mu sync.Mutex
	// The connections that may be closed for room, by state, each list in
	// the order they took it (the longest at the front); [0] under the
	// cap, [1] on the probe places.
	silent, stalled, idle [2]list.List
	byAddr                map[string]*capConn // open connections by remote address, for gRPC's stats
}

// closeScan bounds the connections of a list closeIdle looks at: those
// with bytes unread are few and soon served.
const closeScan = 64

// idleMin: an idle connection idle for less than this is likely about to
// be sent its next request (an HTTP/2 client's first comes just after its
// preface); it is not closed for room when another choice exists.
var idleMin = 100 * time.Millisecond

// silentGrace: a silent connection younger than this may be a client
// still in its handshake or sending its first request (at least a round
// trip), and is not closed for room. Well above a handshake's round trips,
// well below the 10s header and handshake timeouts.
var silentGrace = time.Second

// stallMin is how long a connection may be stalled before it can be
// closed for room ahead of idle ones. A gRPC call's message follows its
// headers at once, so stallFloor; an HTTP body may wait for a 100
// Continue, a round trip, so silentGrace, as a new connection's first
// request.
func (l *capListener) stallMin() time.Duration {
	if l.name == "grpc" {
		return stallFloor
	}
	return silentGrace
}

// stallFloor: a connection stalled for less than this is likely just
// receiving the rest of a request (a gRPC call's message follows its
// headers within microseconds) and is not closed for room. Past it a
// stalled HTTP connection, at the cap with no probe place free, goes
// before a just-idle one and before a new connection is refused.
var stallFloor = 10 * time.Millisecond

// Probe places past an HTTP listener's cap, and how long a connection
// holding one may stay open: a probe asks once and hangs up, and its
// place must not be held by a client that sends nothing.
var (
	probePlaces = 8
	probeLife   = 5 * time.Second
)

func newCapListener(ln net.Listener, name string, n int, m *Metrics, log *slog.Logger) *capListener {
	l := &capListener{Listener: ln, name: name, sem: make(chan struct{}, n), log: log, byAddr: map[string]*capConn{}}
	if name == "http" {
		l.probes = make(chan struct{}, probePlaces)
	}
	if m != nil {
		l.refused = m.connRefused.WithLabelValues(name)
		l.idleClosed = prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_connections_idle_closed_total", Help: "Silent, stalled or idle connections closed to make room for a new one, the listener (http, grpc) having --max-connections open.",
			ConstLabels: prometheus.Labels{"listener": name},
		})
		m.reg.MustRegister(l.idleClosed, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_connections_open", Help: "Connections open on each listener (http, grpc), at most --max-connections.",
			ConstLabels: prometheus.Labels{"listener": name},
		}, func() float64 { return float64(len(l.sem)) }))
	}
	return l
}

func (l *capListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if cc := l.admit(c); cc != nil {
			return cc, nil
		}
		c.Close()
		if l.refused != nil {
			l.refused.Inc()
		}
		now := time.Now().UnixNano()
		if last := l.lastLog.Load(); now-last >= int64(quietFor) && l.lastLog.CompareAndSwap(last, now) {
			l.log.Warn("connection limit reached: refusing new connections, none silent, stalled or idle", "listener", l.name, "max_connections", cap(l.sem))
		}
	}
}

// admit takes a place for c, closing silent, stalled or idle connections
// to free one if need be; nil if every place is held by a busy connection.
//
// Closing an idle connection is abrupt (neither grpc-go nor net/http's
// HTTP/2 server can send one connection a GOAWAY): a request its client
// sends at that moment fails. So one idle for less than idleMin, likely
// about to be used, goes only when a probe place cannot be had, and after
// any stalled one past stallFloor.
func (l *capListener) admit(c net.Conn) *capConn {
	for {
		select {
		case l.sem <- struct{}{}:
			return l.track(&capConn{Conn: c, l: l, addr: c.RemoteAddr().String()})
		default:
		}
		if l.closeIdle(pass{&l.silent[0], silentGrace}, pass{&l.stalled[0], l.stallMin()}, pass{&l.idle[0], idleMin}) {
			continue
		}
		if cc := l.admitProbe(c); cc != nil {
			return cc
		}
		if !l.closeIdle(pass{&l.stalled[0], stallFloor}, pass{&l.idle[0], 0}) {
			return nil
		}
	}
}

// admitProbe gives c one of the probe places, closing a silent, stalled
// or idle holder to free one if need be; it closes after probeLife
// whatever it does.
func (l *capListener) admitProbe(c net.Conn) *capConn {
	for {
		select {
		case l.probes <- struct{}{}:
			cc := l.track(&capConn{Conn: c, l: l, addr: c.RemoteAddr().String(), probe: true})
			time.AfterFunc(probeLife, func() { cc.Close() })
			return cc
		default:
		}
		if l.probes == nil || !l.closeIdle(pass{&l.silent[1], silentGrace}, pass{&l.stalled[1], l.stallMin()}, pass{&l.idle[1], idleMin}) {
			return nil
		}
	}
}

// track records c, silent until its server says otherwise.
func (l *capListener) track(c *capConn) *capConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byAddr[c.addr] = c
	c.state = connSilent
	c.listLocked(&l.silent[c.place()])
	return c
}

// probesOnly answers a request on a probe place (past the cap) only if it
// is a health probe (GET or HEAD /healthz, /readyz, without a body); any
// other is refused 503 (its body not read: see httpRequests), so that the
// places stay free for probes. Either way the connection then closes.
func (l *capListener) probesOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, _ := r.Context().Value(capConnKey{}).(*capConn); c != nil && c.probe {
			w.Header().Set("Connection", "close")
			if !isProbe(r) {
				if rt, ok := next.(interface{ pattern(*http.Request) string }); ok {
					r.Pattern = rt.pattern(r) // instrumentHTTP labels it by its endpoint
				}
				w.Header().Set("Retry-After", "1")
				problem(w, http.StatusServiceUnavailable,
					"this instance holds --max-connections busy connections; past that only health probes are answered: retry, or try another instance")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// isProbe: a health probe, as Kubernetes and load balancers send them.
func isProbe(r *http.Request) bool {
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.ContentLength == 0 &&
		(r.URL.Path == "/healthz" || r.URL.Path == "/readyz")
}

type capConnKey struct{}

// httpConnContext is the HTTP server's ConnContext: it tells probesOnly
// the connection's place.
func (l *capListener) httpConnContext(ctx context.Context, c net.Conn) context.Context {
	if cc := unwrapCapConn(c); cc != nil {
		return context.WithValue(ctx, capConnKey{}, cc)
	}
	return ctx
}

// unwrapCapConn finds the *capConn under c (beneath TLS), or nil.
func unwrapCapConn(c net.Conn) *capConn {
	for {
		if cc, ok := c.(*capConn); ok {
			return cc
		}
		u, ok := c.(interface{ NetConn() net.Conn }) // *tls.Conn
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
}

// pass is a list closeIdle looks in, and how long a connection must have
// been on it (silent, stalled or idle) to be closed.
type pass struct {
	ls  *list.List
	min time.Duration
}

// closeIdle closes the first connection of the passes' lists, in order,
// on its list for at least the pass's min and with no bytes waiting unread
// in its socket (those are a request its server is about to read). It
// reports whether it closed one, whose place is then free (capConn.Close
// releases it, or has, once).
func (l *capListener) closeIdle(passes ...pass) bool {
	l.mu.Lock()
	at := time.Now()
	var cc *capConn
	for _, p := range passes {
		n := 0
		// A list is in order of since: past a young one, all are young.
		for e := p.ls.Front(); e != nil && cc == nil && n < closeScan; e, n = e.Next(), n+1 {
			c := e.Value.(*capConn)
			if at.Sub(c.since) < p.min {
				break
			}
			if !unread(c.Conn) {
				cc = c
			}
		}
		if cc != nil {
			break
		}
	}
	if cc == nil {
		l.mu.Unlock()
		return false
	}
	cc.unlistLocked()
	l.mu.Unlock()
	cc.Close()
	if l.idleClosed != nil {
		l.idleClosed.Inc()
	}
	now := time.Now().UnixNano()
	if last := l.lastIdle.Load(); now-last >= int64(quietFor) && l.lastIdle.CompareAndSwap(last, now) {
		l.log.Warn("connection limit reached: closing silent, stalled or idle connections to make room", "listener", l.name, "max_connections", cap(l.sem))
	}
	return true
}

// connState is where a connection stands for the cap, from what its
// server reports.
type connState int8

const (
	// connSilent: nothing heard yet (HTTP: no request headers, nor the
	// HTTP/2 preface, past any TLS handshake; gRPC: no call's headers).
	// Closing it loses nothing a client sent, and it may be no client at
	// all.
	connSilent connState = iota
	// connIdle: no request in progress.
	connIdle
	// connStalled: requests in progress, none arrived whole (HTTP: a body
	// still coming; gRPC: a call without its message). A request begun
	// and never finished holds a place as surely as silence.
	connStalled
	// connBusy: a request that arrived whole is being answered.
	connBusy
	connClosed
)

// relistLocked puts c on the list its state calls for, if that changed.
func (l *capListener) relistLocked(c *capConn) {
	st := connBusy
	switch {
	case c.closed:
		st = connClosed
	case !c.reported:
		st = connSilent
	case c.idleNow:
		// An HTTP/2 connection without streams on a probe place too: it
		// must not hold the place for probeLife.
		st = connIdle
	case c.waiting > 0 && c.busy == 0:
		st = connStalled
	}
	if st == c.state {
		return
	}
	c.unlistLocked()
	c.state = st
	switch st {
	case connIdle:
		c.listLocked(&l.idle[c.place()])
	case connStalled:
		c.listLocked(&l.stalled[c.place()])
	}
}

// release gives c's place back.
func (l *capListener) release(c *capConn) {
	l.mu.Lock()
	c.closed = true
	l.relistLocked(c)
	if l.byAddr[c.addr] == c {
		delete(l.byAddr, c.addr)
	}
	l.mu.Unlock()
	if c.probe {
		<-l.probes
		return
	}
	<-l.sem
}

// httpConnState is the HTTP server's ConnState: a connection between
// requests (HTTP/1 keep-alive, or HTTP/2 without streams, idle since its
// last stream's end or its preface) may be closed to make room. Past
// StateNew a connection is no longer silent: its first request (HTTP/2:
// its preface) has arrived, after any TLS handshake.
func (l *capListener) httpConnState(c net.Conn, st http.ConnState) {
	cc := unwrapCapConn(c)
	if cc == nil || st == http.StateNew {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	cc.reported, cc.idleNow = true, st == http.StateIdle
	if cc.idleNow {
		// Every request has ended, HTTP/1 bodies read or dropped.
		cc.busy, cc.waiting = 0, 0
		cc.gen++
	}
	l.relistLocked(cc)
}

// capConn gives its place back when first closed.
type capConn struct {
	net.Conn
	l    *capListener
	addr string
	once sync.Once
	// Under l.mu:
	state connState
	on    *list.List    // the list of its state, if any (silent, stalled, idle)
	elem  *list.Element // its element there
	since time.Time     // when it took its state
	// reported: its server has heard from it (HTTP: a request's headers or
	// the HTTP/2 preface, past any TLS handshake; gRPC: a call's headers);
	// idleNow: it has no request in progress.
	reported, idleNow bool
	// busy and waiting: its requests (gRPC: calls) in progress that have
	// arrived whole, and that have not; gen counts its idle turns (HTTP).
	busy, waiting, gen int
	closed             bool
	// probe: c holds a probe place (past the cap), not one of the cap's.
	probe bool
}

// place indexes the listener's lists: 1 on a probe place.
func (c *capConn) place() int {
	if c.probe {
		return 1
	}
	return 0
}

// listLocked puts c at the back of ls, since now.
func (c *capConn) listLocked(ls *list.List) {
	c.since = time.Now()
	c.on, c.elem = ls, ls.PushBack(c)
}

// unlistLocked takes c off the list of connections to close for room it
// is on, if any.
func (c *capConn) unlistLocked() {
	if c.elem != nil {
		c.on.Remove(c.elem)
		c.on, c.elem = nil, nil
	}
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// quietOwnCloses drops net/http's "TLS handshake error" lines for
// connections this process closed in their handshake (for room, at a probe
// place's end, at shutdown): the listener counts and logs those, and a
// flood of silent sockets would otherwise log a line each.
type quietOwnCloses struct{ slog.Handler }

func (h quietOwnCloses) Handle(ctx context.Context, r slog.Record) error {
	if strings.HasPrefix(r.Message, "http: TLS handshake error") && strings.HasSuffix(r.Message, net.ErrClosed.Error()) {
		return nil
	}
	return h.Handler.Handle(ctx, r)
}

func (h quietOwnCloses) WithAttrs(as []slog.Attr) slog.Handler {
	return quietOwnCloses{h.Handler.WithAttrs(as)}
}

func (h quietOwnCloses) WithGroup(name string) slog.Handler {
	return quietOwnCloses{h.Handler.WithGroup(name)}
}
