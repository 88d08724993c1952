package redisstore

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/nilclient"
)

// maxClientsReply is what Redis sends a connection it refuses for having
// maxclients open, as soon as it accepts it, before closing it.
const maxClientsReply = "ERR max number of clients reached"

var maxClientsGreeting = []byte("-" + maxClientsReply + "\r\n")

// refusedError is a connection Redis refused as it accepted it: reply is
// what Redis said. It is no Redis reply to go-redis, which would take it
// for an old server's answer to HELLO, or retry HELLO on the closed
// connection, and fail with a broken pipe.
type refusedError struct{ reply string }

func (e *refusedError) Error() string { return "redis refused the connection: " + e.reply }

// DetectRefusals hooks c's dials so that a connection Redis refuses as it
// accepts it (maxclients reached) fails with Redis's words, which Classify
// reports as ErrMaxClients. Without it the call fails with a broken pipe or
// an EOF: ErrUnreachable, Redis's words lost. Call it once, before c's
// first command: on a ClusterClient it hooks each node client created from
// then on. The hook only reads what Redis sends first on each connection;
// it costs no round trip. Over TLS Redis refuses a connection before the
// handshake, without a word: that still fails with EOF (ErrUnreachable).
func DetectRefusals(c redis.UniversalClient) {
	switch c := nilclient.Or(c).(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(refusalHook{}) })
	case *redis.Client: // a failover client too
		c.AddHook(refusalHook{})
	}
}

type refusalHook struct{}

func (refusalHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		w := &refusalConn{Conn: conn, network: network, addr: addr}
		if sc, ok := conn.(syscall.Conn); ok {
			// go-redis checks a pooled connection's health through its
			// descriptor: keep that possible. A plain socket, too, can be
			// dialled again to ask (see refused).
			w.plain = true
			return &refusalSysConn{w, sc}, nil
		}
		return w, nil
	}
}

func (refusalHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (refusalHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// refusalConn reads a connection's first bytes for Redis's refusal.
type refusalConn struct {
	net.Conn
	network, addr string
	plain         bool        // no TLS: a dial of its own may ask again
	read          atomic.Bool // something was read: no refusal can follow
	// refusal, once seen, answers every later read and write: go-redis
	// may read again after an error, and would find only the reset.
	refusal atomic.Pointer[refusedError]
}

func (c *refusalConn) Read(p []byte) (int, error) {
	if c.read.Load() {
		if r := c.refusal.Load(); r != nil {
			return 0, r
		}
		return c.Conn.Read(p)
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		if bytes.HasPrefix(p[:n], maxClientsGreeting) {
			return 0, c.refuse()
		}
		c.read.Store(true)
		return n, err
	}
	return n, c.refused(err, false)
}

func (c *refusalConn) Write(p []byte) (int, error) {
	if r := c.refusal.Load(); r != nil {
		return 0, r
	}
	n, err := c.Conn.Write(p)
	if err != nil && !c.read.Load() {
		err = c.refused(err, true)
	}
	return n, err
}

// refuse records the refusal and returns it.
func (c *refusalConn) refuse() error {
	r := &refusedError{reply: maxClientsReply}
	c.refusal.Store(r)
	c.read.Store(true)
	return r
}

// refusalWait bounds each look for a refusal once the connection failed.
const refusalWait = 100 * time.Millisecond

// refused is err, the failure of a connection before its first reply, or
// the refusal behind it. Redis writes its refusal and closes: after a
// failed write it may still be unread; but a first command that reached
// Redis before it accepted the connection makes its close a reset, which
// discards the refusal, so a plain connection dials again and reads, sending
// nothing (a Redis that takes the connection sends nothing either). Only
// this failing path pays for it.
func (c *refusalConn) refused(err error, unread bool) error {
	if err == nil || isTimeout(err) { // silence, not a refusal
		return err
	}
	if unread && greeted(c.Conn) {
		return c.refuse()
	}
	if !c.plain {
		return err
	}
	d := net.Dialer{Timeout: refusalWait}
	probe, derr := d.Dial(c.network, c.addr)
	if derr != nil {
		return err
	}
	defer probe.Close()
	if greeted(probe) {
		return c.refuse()
	}
	return err
}

// greeted reports whether conn's next bytes, within refusalWait, are
// Redis's refusal.
func greeted(conn net.Conn) bool {
	var b [64]byte
	_ = conn.SetReadDeadline(time.Now().Add(refusalWait))
	n, _ := io.ReadAtLeast(conn, b[:], len(maxClientsGreeting))
	return bytes.HasPrefix(b[:n], maxClientsGreeting)
}

// NetConn returns the connection beneath, as crypto/tls's does.
func (c *refusalConn) NetConn() net.Conn { return c.Conn }

// refusalSysConn is a refusalConn whose connection has a descriptor.
type refusalSysConn struct {
	*refusalConn
	sc syscall.Conn
}

func (c *refusalSysConn) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }
