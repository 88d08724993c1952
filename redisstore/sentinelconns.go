package redisstore

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// sentinelReplacedFor is how long after a switch was announced a dial to
// the old master goes to the new one instead. A Sentinel learns a new
// master from the others' hello messages, sent every 2 s, and the one
// leading the failover names the new one from the promotion on; a
// Sentinel that names the old one later than this means a switch back
// went unheard, and the Sentinels are followed.
const sentinelReplacedFor = 10 * time.Second

const (
	replacedMasterMsg   = "redis: on a master the Sentinels replaced: its connections closed"
	redirectedMasterMsg = "redis: the Sentinel still names the master the Sentinels replaced: dialling the new one"
	agreedMasterMsg     = "redis: on the master the Sentinels announced"
	disagreeMasterMsg   = "redis: the Sentinel names a master replaced earlier: deciding on it (a failover back to it, or a switch back not heard)"
	staleMasterMsg      = "redis: the Sentinel names a master of an older configuration: dialling the one acted on"
	staleConnsMsg       = "redis: on a master of an older configuration a Sentinel announced: its connections closed"
)

// masterConns dials a Sentinel client's connections and tracks them by
// the address dialled. go-redis's failover client follows one Sentinel's
// +switch-master, which comes a second or more after the promotion (the
// one leading a planned failover announces it only once the other
// replicas have resynced, seconds later), while the old master, still a
// master until then, answers every pooled connection: a process would
// decide on it while the rest of the fleet decides on the new one, and
// its takes there are lost when it becomes a replica. On a switch any
// Sentinel announced (its promotion, or +switch-master), switched closes
// the connections to the old master: go-redis dials again, asking its
// Sentinel, which may still name the old one; that dial goes to the new
// master (redirect). Calls under way on them fail, as on any lost
// connection (the store never sends a script twice). The Sentinels' own
// connections pass through too; no master has their addresses.
type masterConns struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	log  *slog.Logger
	// reason tells the client's master differs from the one announced
	// ("" once they agree); counted counts a closing or a redirection.
	// Either may be nil.
	reason  func(string)
	counted func(how string)
	now     func() time.Time
	// closed: the follower is closed, its dials go straight through.
	closed atomic.Bool

	mu          sync.Mutex
	conns       map[string]map[*trackedConn]struct{}
	from, to    string    // the last switch announced
	at          time.Time // when
	moving      bool      // connections to from closed, none to to yet
	redirecting bool      // a dial to from sent to to since

	// A master a stale +switch-master named (stale), the one acted on
	// instead (staleTo), when (staleAt), and whether a dial was sent there.
	stale, staleTo string
	staleAt        time.Time
	staleSent      bool
	// checking are the masters +switch-master named whose config epoch
	// is being asked: a dial to one waits for the answer.
	checking map[string]chan struct{}
}

func newMasterConns(dial func(ctx context.Context, network, addr string) (net.Conn, error), log *slog.Logger, reason func(string), counted func(string)) *masterConns {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &masterConns{dial: dial, log: log, reason: reason, counted: counted, now: time.Now,
		conns: map[string]map[*trackedConn]struct{}{}, checking: map[string]chan struct{}{}}
}

func (m *masterConns) tell(reason string) {
	if m.reason != nil {
		m.reason(reason)
	}
}

func (m *masterConns) count(how string) {
	if m.counted != nil {
		m.counted(how)
	}
}

// replaced reports whether addr is a master a switch replaced less than
// sentinelReplacedFor ago, and for how long; m.mu is held.
func (m *masterConns) replaced(addr string) (bool, time.Duration) {
	if addr != m.from || addr == m.to {
		return false, 0
	}
	ago := m.now().Sub(m.at)
	return ago < sentinelReplacedFor, ago
}

// Dial is the client's FailoverOptions.Dialer: the master's address, from
// the client's Sentinel, or a Sentinel's.
//
// A dial to a master replaced moments ago goes to its replacement, not
// refused: the replacement is a master (a Sentinel announces a promotion
// only once the replica reported role master, and the failover is
// committed from then on) and the other Sentinels will name it within
// seconds, so the client decides on Redis, on the master the rest of
// the fleet uses, rather than failing (or a failure policy answering). Its role is not
// asked again here: the connection is not go-redis's yet (no AUTH, no
// HELLO), and were it a replica after all (a failover back not heard) the
// store's scripts would fail on it with READONLY (replica-read-only, the
// default), answered by any failure policy.
func (m *masterConns) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	if m.closed.Load() {
		return m.dial(ctx, network, addr)
	}
	m.mu.Lock()
	checked := m.checking[addr]
	m.mu.Unlock()
	if checked != nil {
		// The client's Sentinel may have announced it too, and go-redis
		// follows at once: the dial waits to know whether it is stale.
		select {
		case <-checked:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	for {
		target := m.route(addr)
		conn, err := m.dial(ctx, network, target)
		if err != nil {
			return nil, err
		}
		tc := &trackedConn{Conn: conn, m: m, addr: target, raw: conn}
		if t, ok := conn.(*tls.Conn); ok {
			tc.raw = t.NetConn() // closing a TLS connection would wait for a write under way
		}
		m.mu.Lock()
		if late, _ := m.replaced(target); late {
			// A switch announced while the dial was under way: its
			// closing did not see this connection.
			m.mu.Unlock()
			conn.Close()
			continue
		}
		set := m.conns[target]
		if set == nil {
			set = map[*trackedConn]struct{}{}
			m.conns[target] = set
		}
		set[tc] = struct{}{}
		agreed := target == m.to && m.moving
		var took time.Duration
		if agreed {
			m.moving, took = false, m.now().Sub(m.at)
		}
		m.mu.Unlock()
		if agreed {
			m.log.Info(agreedMasterMsg, "master", target, "after", took.Round(time.Millisecond))
			m.tell("")
		}
		if sc, ok := conn.(syscall.Conn); ok {
			// go-redis checks a pooled connection's health through its
			// descriptor: a closed one is then dropped, not used.
			return &trackedSysConn{tc, sc}, nil
		}
		return tc, nil
	}
}

// route returns the address a dial to addr goes to: addr, or the master
// that replaced it moments ago, or the one acted on instead of it when a
// stale switch named it moments ago.
func (m *masterConns) route(addr string) string {
	m.mu.Lock()
	if addr == m.stale && addr != m.to && m.now().Sub(m.staleAt) < sentinelReplacedFor {
		first := !m.staleSent
		m.staleSent = true
		to := m.staleTo
		m.mu.Unlock()
		if first {
			m.log.Info(staleMasterMsg, "stale", addr, "master", to)
			m.count("redirected")
		}
		return to
	}
	replaced, ago := m.replaced(addr)
	if replaced {
		first := !m.redirecting
		m.redirecting = true
		to := m.to
		m.mu.Unlock()
		if first {
			m.log.Info(redirectedMasterMsg, "old", addr, "new", to, "since", ago.Round(time.Millisecond))
			m.count("redirected")
		}
		return to
	}
	if addr != m.from || addr == m.to {
		m.mu.Unlock()
		return addr
	}
	// Most often a failover back to it (its replacement failed), whose
	// announcement comes moments after the client's own Sentinel named
	// it: nothing wrong, so not a warning.
	m.log.Info(disagreeMasterMsg, "master", addr, "announced", m.to, "since", ago.Round(time.Millisecond))
	m.from, m.moving, m.redirecting = "", false, false
	m.mu.Unlock()
	m.tell("")
	return addr
}

// check holds dials to addr until the returned done is called: a
// +switch-master named it, whose config epoch is being asked.
func (m *masterConns) check(addr string) (done func()) {
	ch := make(chan struct{})
	m.mu.Lock()
	m.checking[addr] = ch // a dial already waiting on another check waits for that one
	m.mu.Unlock()
	return func() {
		m.mu.Lock()
		if m.checking[addr] == ch {
			delete(m.checking, addr)
		}
		m.mu.Unlock()
		close(ch)
	}
}

// staleSwitch is told a Sentinel announced a switch to to older than the
// change acted on, to current. A client whose Sentinel it is follows it
// (go-redis closes its other connections and dials to): such a dial in
// the next sentinelReplacedFor goes to current instead, and those made
// before the switch was known stale are closed.
func (m *masterConns) staleSwitch(to, current string) {
	if current == "" || to == current {
		return
	}
	m.mu.Lock()
	m.stale, m.staleTo, m.staleAt, m.staleSent = to, current, m.now(), false
	old := m.conns[to]
	delete(m.conns, to)
	m.mu.Unlock()
	if len(old) == 0 {
		return
	}
	m.log.Warn(staleConnsMsg, "stale", to, "master", current, "conns", len(old))
	m.count("closed")
	for c := range old {
		c.raw.Close()
	}
}

// switched is told a Sentinel announced the master moved from from to to
// (the promotion of to, or the switch): it closes the connections to
// from, if any, and tells the reason until the client has dialled to:
// with none to close (an unplanned failover: calls failed on them with
// the master) too, unless it has connections to to already.
func (m *masterConns) switched(from, to string) {
	m.mu.Lock()
	m.from, m.to, m.at, m.redirecting = from, to, m.now(), false
	old := m.conns[from]
	delete(m.conns, from)
	m.moving = len(old) > 0 || len(m.conns[to]) == 0
	moving := m.moving
	m.mu.Unlock()
	if len(old) > 0 {
		m.log.Warn(replacedMasterMsg, "old", from, "new", to, "conns", len(old))
		m.count("closed")
	}
	if moving {
		how := "the client dials the new one"
		if len(old) > 0 {
			how = "its connections closed, " + how
		}
		m.tell(fmt.Sprintf("Redis master %s was replaced by %s: %s", from, to, how))
	}
	for c := range old {
		c.raw.Close()
	}
}

// trackedConn is a connection masterConns dialled.
type trackedConn struct {
	net.Conn
	m    *masterConns
	addr string
	raw  net.Conn // the socket, under TLS
	once sync.Once
}

func (c *trackedConn) Close() error {
	c.once.Do(func() {
		c.m.mu.Lock()
		if set := c.m.conns[c.addr]; set != nil {
			delete(set, c)
			if len(set) == 0 {
				delete(c.m.conns, c.addr)
			}
		}
		c.m.mu.Unlock()
	})
	return c.Conn.Close()
}

type trackedSysConn struct {
	*trackedConn
	syscall.Conn
}
