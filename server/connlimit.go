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
	"google.golang.org/grpc/stats"
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
// connection makes room by closing the oldest silent one (accepted, but no
// request yet: see capConn.silent) older than silentGrace, else the one
// idle the longest (HTTP: between requests, as ConnState reports; gRPC:
// past its handshake with no call in progress, as grpcIdle reports), so
// that silent sockets and idle pools cannot lock fresh clients (probes,
// scrapes, Envoy) out until their timeouts; with none of either it takes
// one of the few probe places (HTTP only: see probesOnly), where a silent
// or idle holder gives way the same, or is closed at once (the client sees
// a reset and can try another instance) rather than left queued. Both are
// counted and logged at most once per quietFor.
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

	mu   sync.Mutex
	idle list.List // *capConn idle, the longest idle at the front
	// idleProbes: *capConn idle on the probe places (HTTP/2 without
	// streams), the longest idle at the front.
	idleProbes list.List
	// silent and silentProbes: *capConn silent, under the cap and on the
	// probe places, the oldest at the front.
	silent, silentProbes list.List
	byAddr               map[string]*capConn // open connections by remote address, for gRPC's stats
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
			Name: "sluice_connections_idle_closed_total", Help: "Silent or idle connections closed to make room for a new one, the listener (http, grpc) having --max-connections open.",
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
			l.log.Warn("connection limit reached: refusing new connections, none silent or idle", "listener", l.name, "max_connections", cap(l.sem))
		}
	}
}

// admit takes a place for c, closing silent or idle connections to free
// one if need be; nil if every place is held by a busy connection.
//
// Closing an idle connection is abrupt (neither grpc-go nor net/http's
// HTTP/2 server can send one connection a GOAWAY): a request its client
// sends at that moment fails. So one idle for less than idleMin, likely
// about to be used, goes only when a probe place cannot be had.
func (l *capListener) admit(c net.Conn) *capConn {
	for {
		select {
		case l.sem <- struct{}{}:
			return l.track(&capConn{Conn: c, l: l, addr: c.RemoteAddr().String()})
		default:
		}
		if l.closeIdle(pass{&l.silent, silentGrace}, pass{&l.idle, idleMin}) {
			continue
		}
		if cc := l.admitProbe(c); cc != nil {
			return cc
		}
		if !l.closeIdle(pass{&l.idle, 0}) {
			return nil
		}
	}
}

// admitProbe gives c one of the probe places, closing a silent or idle
// holder to free one if need be; it closes after probeLife whatever it
// does.
func (l *capListener) admitProbe(c net.Conn) *capConn {
	for {
		select {
		case l.probes <- struct{}{}:
			cc := l.track(&capConn{Conn: c, l: l, addr: c.RemoteAddr().String(), probe: true})
			time.AfterFunc(probeLife, func() { cc.Close() })
			return cc
		default:
		}
		if l.probes == nil || !l.closeIdle(pass{&l.silentProbes, silentGrace}, pass{&l.idleProbes, idleMin}) {
			return nil
		}
	}
}

// track records c, silent until its server says otherwise.
func (l *capListener) track(c *capConn) *capConn {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.byAddr[c.addr] = c
	c.since = time.Now()
	if c.probe {
		c.silent = l.silentProbes.PushBack(c)
	} else {
		c.silent = l.silent.PushBack(c)
	}
	return c
}

// probesOnly answers a request on a probe place (past the cap) only if it
// is a health probe (/healthz, /readyz); any other is refused 503, so that
// the places stay free for probes. Either way the connection then closes.
func (l *capListener) probesOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if c, _ := r.Context().Value(capConnKey{}).(*capConn); c != nil && c.probe {
			w.Header().Set("Connection", "close")
			if r.URL.Path != "/healthz" && r.URL.Path != "/readyz" {
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
// been on it (silent, or idle) to be closed.
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
	l.unlistLocked(cc)
	l.mu.Unlock()
	cc.Close()
	if l.idleClosed != nil {
		l.idleClosed.Inc()
	}
	now := time.Now().UnixNano()
	if last := l.lastIdle.Load(); now-last >= int64(quietFor) && l.lastIdle.CompareAndSwap(last, now) {
		l.log.Warn("connection limit reached: closing silent or idle connections to make room", "listener", l.name, "max_connections", cap(l.sem))
	}
	return true
}

// setIdle marks c idle (the newest) or not.
func (l *capListener) setIdle(c *capConn, idle bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setIdleLocked(c, idle)
}

// setIdleLocked also ends c's silence: its server has heard from it.
func (l *capListener) setIdleLocked(c *capConn, idle bool) {
	l.unlistLocked(c)
	if idle && !c.closed {
		// An HTTP/2 connection without streams on a probe place too: it
		// must not hold the place for probeLife.
		if c.probe {
			c.idle = l.idleProbes.PushBack(c)
		} else {
			c.idle = l.idle.PushBack(c)
		}
		c.since = time.Now()
	}
}

// unlistLocked takes c off the lists of connections to close for room.
func (l *capListener) unlistLocked(c *capConn) {
	if c.idle != nil {
		if c.probe {
			l.idleProbes.Remove(c.idle)
		} else {
			l.idle.Remove(c.idle)
		}
		c.idle = nil
	}
	if c.silent != nil {
		if c.probe {
			l.silentProbes.Remove(c.silent)
		} else {
			l.silent.Remove(c.silent)
		}
		c.silent = nil
	}
}

// release gives c's place back.
func (l *capListener) release(c *capConn) {
	l.mu.Lock()
	c.closed = true
	l.unlistLocked(c)
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
// last stream's end or its preface) may be closed to make room. Past StateNew a connection is no longer silent: its first
// request (HTTP/2: its preface) has arrived, after any TLS handshake.
func (l *capListener) httpConnState(c net.Conn, st http.ConnState) {
	if cc := unwrapCapConn(c); cc != nil && st != http.StateNew {
		l.setIdle(cc, st == http.StateIdle)
	}
}

// capConn gives its place back when first closed.
type capConn struct {
	net.Conn
	l    *capListener
	addr string
	once sync.Once
	// Under l.mu:
	idle *list.Element // in l.idle (l.idleProbes) while idle
	// silent: in l.silent (l.silentProbes) from its accept until its
	// server reports it (HTTP: a request or the HTTP/2 preface read, past
	// any TLS handshake; gRPC: its handshake done). Closing it loses
	// nothing a client sent, and a silent one may be no client at all.
	silent *list.Element
	// since: when c was accepted while silent, when it went idle while idle.
	since  time.Time
	calls  int // gRPC calls in progress
	closed bool
	// probe: c holds a probe place (past the cap), not one of the cap's.
	probe bool
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { c.l.release(c) })
	return err
}

// grpcIdle is the gRPC server's stats handler: a connection past its
// handshake (ConnBegin: TLS, the HTTP/2 preface and settings) without
// calls in progress may be closed to make room; before, it is silent.
// (Its GOAWAY at grpcMaxIdle comes minutes later.)
type grpcIdle struct{ l *capListener }

type grpcConnKey struct{}

func (h grpcIdle) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	h.l.mu.Lock()
	c := h.l.byAddr[info.RemoteAddr.String()]
	h.l.mu.Unlock()
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, grpcConnKey{}, c)
}

func (h grpcIdle) HandleConn(ctx context.Context, s stats.ConnStats) {
	if _, ok := s.(*stats.ConnBegin); ok {
		h.calls(ctx, 0)
	}
}

func (h grpcIdle) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (h grpcIdle) HandleRPC(ctx context.Context, s stats.RPCStats) {
	switch s.(type) {
	case *stats.Begin:
		h.calls(ctx, 1)
	case *stats.End:
		h.calls(ctx, -1)
	}
}

// calls adds d to the connection's calls in progress; with none it is idle.
func (h grpcIdle) calls(ctx context.Context, d int) {
	c, _ := ctx.Value(grpcConnKey{}).(*capConn)
	if c == nil {
		return
	}
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	c.calls += d
	h.l.setIdleLocked(c, c.calls == 0)
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
