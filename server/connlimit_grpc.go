package server

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"

	"github.com/sluicehq/sluice/internal/logpace"
)

// grpcFirstMessage bounds the wait for a call's request message once its
// headers have come: a rate limit or health request is one small message
// sent with them. A call still without one then is cancelled, so that
// calls which never send it cannot keep connections busy (a connection
// with a call in progress is neither idle for the cap nor for
// grpcMaxIdle). A variable so that tests can shorten it.
var grpcFirstMessage = time.Second

// grpcConns is the gRPC server's stats handler: with grpcGate, it tells
// the connection cap where each connection stands. Until its first call's
// headers a connection is silent: a handshake alone (TLS, the HTTP/2
// preface and settings) costs a client nothing, and Envoy calls as soon as
// it has connected. Then without calls in progress it is idle (its GOAWAY
// at grpcMaxIdle comes minutes later); with calls of which none has had
// its message yet, stalled; with one that has, busy.
type grpcConns struct{ l *capListener }

type grpcConnKey struct{}

func (h grpcConns) TagConn(ctx context.Context, info *stats.ConnTagInfo) context.Context {
	h.l.mu.Lock()
	c := h.l.byAddr[info.RemoteAddr.String()]
	h.l.mu.Unlock()
	if c == nil {
		return ctx
	}
	return context.WithValue(ctx, grpcConnKey{}, c)
}

func (grpcConns) HandleConn(context.Context, stats.ConnStats) {}

func (h grpcConns) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (h grpcConns) HandleRPC(ctx context.Context, s stats.RPCStats) {
	call, _ := ctx.Value(grpcCallKey{}).(*grpcCall)
	if call == nil {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		call.begun.Store(true)
		h.update(ctx, func(c *capConn) { c.waiting++ })
	case *stats.InPayload:
		if call.got.Swap(true) {
			return
		}
		call.timer.Stop()
		h.update(ctx, func(c *capConn) { c.waiting--; c.busy++ })
	case *stats.End:
		call.timer.Stop()
		if call.ended.Swap(true) || !call.begun.Load() {
			return
		}
		if call.got.Load() {
			h.update(ctx, func(c *capConn) { c.busy-- })
		} else {
			h.update(ctx, func(c *capConn) { c.waiting-- })
		}
	}
}

// update applies f to the call's connection and lists it anew: with no
// call in progress it is idle.
func (h grpcConns) update(ctx context.Context, f func(*capConn)) {
	c, _ := ctx.Value(grpcConnKey{}).(*capConn)
	if c == nil {
		return
	}
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	f(c)
	c.idleNow = c.busy+c.waiting == 0
	h.l.relistLocked(c)
}

// grpcCall is one call's progress, from its stream's creation (grpcGate)
// through the stats handler's events.
type grpcCall struct {
	method string
	timer  *time.Timer // grpcFirstMessage
	cancel context.CancelFunc
	// begun: the server took the call up (a method it serves); got: its
	// message arrived; ended: it is over.
	begun, got, ended atomic.Bool
}

type grpcCallKey struct{}

// grpcGate runs as a stream is created (grpc.InTapHandle), on its headers
// alone, before any message: a stream without the decision token (the
// rule of grpcToken, for the same methods) is refused there and then,
// rather than held until a message that may never come; an accepted one
// is given grpcFirstMessage to send its message.
type grpcGate struct {
	conns   grpcConns
	token   grpc.UnaryServerInterceptor
	methods map[string]bool // the server's, for the metrics' endpoint label
	metrics *Metrics
	stalled prometheus.Counter
	log     *slog.Logger
	pace    logpace.Pacer // Every: quietFor
	first   time.Duration // grpcFirstMessage, read once: timers read it late
}

func newGRPCGate(conns grpcConns, token string, m *Metrics, log *slog.Logger) *grpcGate {
	g := &grpcGate{conns: conns, log: log, metrics: m, pace: logpace.Pacer{Every: quietFor}, first: grpcFirstMessage}
	if token != "" {
		g.token = grpcToken(token)
	}
	if m != nil {
		g.stalled = newCounter("sluice_grpc_stalled_calls_total",
			"gRPC calls cancelled because their request message had not come 1s after their headers.")
		m.reg.MustRegister(g.stalled)
	}
	return g
}

// serving records the server's methods, once registered.
func (g *grpcGate) serving(s *grpc.Server) {
	g.methods = map[string]bool{}
	for svc, info := range s.GetServiceInfo() {
		for _, m := range info.Methods {
			g.methods["/"+svc+"/"+m.Name] = true
		}
	}
}

func (g *grpcGate) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	g.conns.update(ctx, func(c *capConn) { c.reported = true })
	if g.token != nil {
		pass := func(context.Context, any) (any, error) { return nil, nil }
		_, err := g.token(metadata.NewIncomingContext(ctx, info.Header), nil, &grpc.UnaryServerInfo{FullMethod: info.FullMethodName}, pass)
		if err != nil {
			if g.methods[info.FullMethodName] {
				g.metrics.request("grpc", info.FullMethodName, status.Code(err).String(), 0)
			}
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	call := &grpcCall{method: info.FullMethodName, cancel: cancel}
	// The cancel reaches the stream's reader: a stream's context is the
	// one returned here.
	call.timer = time.AfterFunc(g.first, func() { g.late(ctx, call) })
	return context.WithValue(ctx, grpcCallKey{}, call), nil
}

// late cancels a call whose message has not come (the client gets
// Canceled), counted and logged.
func (g *grpcGate) late(ctx context.Context, call *grpcCall) {
	if call.got.Load() {
		return
	}
	// Read before the cancel, which ends the call: read after, a call
	// the cancel had ended was taken for one already answered, and went
	// uncounted and unlogged.
	served := call.begun.Load() && !call.ended.Load()
	call.cancel()
	if !served {
		return // a method not served, already answered
	}
	if g.stalled != nil {
		g.stalled.Inc()
	}
	peer := ""
	if c, _ := ctx.Value(grpcConnKey{}).(*capConn); c != nil {
		peer = c.addr
	}
	g.pace.Log("", func(notLogged int64) {
		g.log.Warn("gRPC call cancelled: its request message had not come within the wait after its headers",
			"wait", g.first, "method", call.method, "peer", peer, "calls_not_logged", notLogged)
	})
}
