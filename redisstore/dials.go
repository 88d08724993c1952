package redisstore

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/nilclient"
)

// dialReached reports whether a dial that ended in err reached a server
// that takes connections: it succeeded, or its TCP connect did and what
// followed timed out (a stopped Redis behind TLS, whose kernel completes
// the handshake, never answers the TLS one). A dial refused, reset, or
// whose TCP connect timed out (a host that drops packets, or is gone) did
// not: that Redis is unreachable, not stalled. A connect is net's "dial"
// operation; a TLS handshake's timeout is its context's or a read's.
func dialReached(err error) bool {
	if err == nil {
		return true
	}
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return false
	}
	return timedOut(err)
}

// Dials is a client's record of its dials, per address, whichever dialled:
// the client's own (WatchDials hooks them) or a Store's, asking whether a
// server that stopped answering still takes connections. A Store given
// the record (Options.Dials) and the service's checks, reading it, tell
// one outage the same way.
type Dials struct {
	last   atomic.Bool // the last dial to any address reached its server
	byAddr sync.Map    // address → bool: its last dial reached its server
}

// note records a dial to addr that ended in err, and returns whether it
// reached its server.
func (d *Dials) note(addr string, err error) bool {
	ok := dialReached(err)
	d.last.Store(ok)
	d.byAddr.Store(addr, ok)
	return ok
}

// Reached reports whether the last dial to addr ("": to any address)
// reached its server (see WatchDials). An address not dialled since the
// record began counts as reached: the client connected before, or its
// calls say otherwise; so does every address for a nil record.
func (d *Dials) Reached(addr string) bool {
	if d == nil {
		return true
	}
	if addr == "" {
		return d.last.Load()
	}
	if ok, dialled := d.byAddr.Load(addr); dialled {
		return ok.(bool)
	}
	return true
}

// refuses returns stallLog.refuses for c, a client that d records (a
// Cluster's node): a dial as c's own (its Dialer: TLS and a Sentinel's master alike), bounded by
// refuseWait, that does not reach the server (see dialReached), noted in
// d. A killed Redis refuses connections and its calls time out in the
// client's dial retries, as a stopped one's do unanswered: only a stopped
// or frozen one (the kernel completes the handshake) or held writes are a
// stall. Nil for no record, and for a client that is no one server's (a
// Cluster's, whose lanes each have their master's).
func (d *Dials) refuses(c redis.UniversalClient) func() bool {
	n, ok := nilclient.Or(c).(*redis.Client)
	if d == nil || !ok {
		return nil
	}
	return func() bool {
		// Read here, not when the Store is made: a zero redis.Client has
		// no options, and New must not panic on it.
		o := n.Options()
		if o == nil || o.Dialer == nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), refuseWait)
		defer cancel()
		conn, err := o.Dialer(ctx, o.Network, o.Addr)
		if err == nil {
			conn.Close()
		}
		return !d.note(o.Addr, err)
	}
}

// refuseWait bounds dials.refuses's dial.
const refuseWait = time.Second

// dialHook notes each dial of a client in its record.
type dialHook struct{ d *Dials }

func (h dialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		h.d.note(addr, err)
		return c, err
	}
}

func (dialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (dialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// newDials returns an empty record.
func newDials() *Dials {
	d := &Dials{}
	d.last.Store(true) // connected before, or its calls say otherwise
	return d
}

// WatchDials hooks c's dials (every node's, on a Cluster, by the address
// dialled) and returns their record, whose Reached says whether the last
// dial to addr ("": to any node) reached its server. A dial reaches it when its TCP connect succeeds,
// even if a TLS handshake then times out; one refused, or whose connect
// times out, does not. An address not dialled since the record began
// counts as reached. A Store made on c with the record (Options.Dials)
// notes its own dials there too: those that ask whether a Redis that
// stopped answering takes connections.
// For a timed-out call, reached tells a stalled Redis (stopped, frozen,
// writes paused) from an unreachable one (killed, its host gone). Call it
// once, before c's first command, so that a Cluster's nodes are all
// watched. For no client, and a client neither a Client nor a
// ClusterClient, it returns nil, whose every address counts as reached.
func WatchDials(c redis.UniversalClient) *Dials {
	d := newDials()
	switch c := nilclient.Or(c).(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(dialHook{d}) })
		// The nodes made already; not a reload's worth of waiting.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = c.ForEachShard(ctx, func(_ context.Context, n *redis.Client) error {
			n.AddHook(dialHook{d})
			return nil
		})
	case *redis.Client: // a failover client too
		c.AddHook(dialHook{d})
	default:
		return nil
	}
	return d
}
