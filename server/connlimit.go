package server

import (
	"log/slog"
	"net"
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

// capListener accepts at most cap connections at once; one past the cap is
// closed at once (the client sees a reset and can try another instance)
// rather than left queued, counted and logged at most once per quietFor.
type capListener struct {
	net.Listener
	name    string
	sem     chan struct{}
	refused prometheus.Counter
	log     *slog.Logger
	lastLog atomic.Int64 // unix nanoseconds of the last refusal logged
}

func newCapListener(ln net.Listener, name string, n int, m *Metrics, log *slog.Logger) *capListener {
	l := &capListener{Listener: ln, name: name, sem: make(chan struct{}, n), log: log}
	if m != nil {
		l.refused = m.connRefused.WithLabelValues(name)
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
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
		select {
		case l.sem <- struct{}{}:
			return &capConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
		}
		c.Close()
		if l.refused != nil {
			l.refused.Inc()
		}
		now := time.Now().UnixNano()
		if last := l.lastLog.Load(); now-last >= int64(quietFor) && l.lastLog.CompareAndSwap(last, now) {
			l.log.Warn("connection limit reached: refusing new connections", "listener", l.name, "max_connections", cap(l.sem))
		}
	}
}

// capConn gives its place back when first closed.
type capConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *capConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}
