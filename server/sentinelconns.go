package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"syscall"
	"time"
)

// errReplacedMaster is wrapped by the error of a dial that a Sentinel
// client refuses: its Sentinel names a master that another Sentinel
// announced replaced moments ago (sentinelReplacedFor). The store reports
// it as unreachable: transient.
var errReplacedMaster = errors.New("the client's Sentinel names a Redis master the Sentinels replaced")

// sentinelReplacedFor is how long after a +switch-master a dial to the old
// master is refused. A Sentinel learns a new master from the others' hello
// messages, sent every 2 s, and the one leading the failover names the new
// one from the promotion on; a Sentinel that names the old one later than
// this means a switch back went unheard, and the Sentinels are followed.
const sentinelReplacedFor = 10 * time.Second

const (
	replacedMasterMsg = "redis: on a master the Sentinels replaced: its connections closed"
	refusedMasterMsg  = "redis: the Sentinel still names the master the Sentinels replaced: not deciding on it"
	agreedMasterMsg   = "redis: on the master the Sentinels announced"
	disagreeMasterMsg = "redis: the Sentinel names a master replaced earlier: deciding on it (a failover back to it, or a switch back not heard)"
)

// masterConns dials a Sentinel client's connections and tracks them by
// the address dialled. go-redis's failover client follows one Sentinel's
// +switch-master, and the one leading a planned failover announces it only
// once the other replicas have resynced (seconds later), while the old
// master, still a master until then, answers every pooled connection: an
// instance would decide on it while the rest of the fleet decides on the
// new one. On a switch any Sentinel announced, switched closes the
// connections to the old master: go-redis dials again, asking its
// Sentinel, which names the new one. Calls under way on them fail, as on
// any lost connection (the store never sends a script twice). The
// Sentinels' own connections pass through too; no master has their
// addresses.
type masterConns struct {
	dial func(ctx context.Context, network, addr string) (net.Conn, error)
	log  *slog.Logger
	// reason tells Health the client's master differs from the one
	// announced ("" once they agree); counted counts a closing or a
	// refusal. Either may be nil.
	reason  func(string)
	counted func(how string)
	now     func() time.Time

	mu       sync.Mutex
	conns    map[string]map[*trackedConn]struct{}
	from, to string    // the last switch announced
	at       time.Time // when
	moving   bool      // connections to from closed, none to to yet
	refusing bool      // a dial to from refused since
}

func newMasterConns(log *slog.Logger, reason func(string), counted func(string)) *masterConns {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &masterConns{log: log, reason: reason, counted: counted, now: time.Now,
		conns: map[string]map[*trackedConn]struct{}{}}
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

// Dial is the client's FailoverOptions.Dialer: the master's address, from
// the client's Sentinel, or a Sentinel's.
func (m *masterConns) Dial(ctx context.Context, network, addr string) (net.Conn, error) {
	m.mu.Lock()
	if addr == m.from && addr != m.to {
		ago := m.now().Sub(m.at)
		if ago < sentinelReplacedFor {
			first := !m.refusing
			m.refusing = true
			from, to := m.from, m.to
			m.mu.Unlock()
			reason := fmt.Sprintf("the client's Sentinel names Redis master %s, which a Sentinel announced replaced by %s %v ago: decisions do not use it (the failure policy answers) until the Sentinels agree",
				from, to, ago.Round(time.Millisecond))
			if first {
				m.log.Warn(refusedMasterMsg, "old", from, "new", to, "since", ago.Round(time.Millisecond))
				m.count("refused")
				m.tell(reason)
			}
			return nil, fmt.Errorf("%w: %s, replaced by %s %v ago", errReplacedMaster, from, to, ago.Round(time.Millisecond))
		}
		// Most often a failover back to it (its replacement failed), whose
		// +switch-master comes moments after the client's own Sentinel
		// named it: nothing wrong, so not a warning.
		m.log.Info(disagreeMasterMsg, "master", addr, "announced", m.to, "since", ago.Round(time.Millisecond))
		m.from, m.moving, m.refusing = "", false, false
		m.mu.Unlock()
		m.tell("")
	} else {
		m.mu.Unlock()
	}
	conn, err := m.dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	tc := &trackedConn{Conn: conn, m: m, addr: addr, raw: conn}
	if t, ok := conn.(*tls.Conn); ok {
		tc.raw = t.NetConn() // closing a TLS connection would wait for a write under way
	}
	m.mu.Lock()
	set := m.conns[addr]
	if set == nil {
		set = map[*trackedConn]struct{}{}
		m.conns[addr] = set
	}
	set[tc] = struct{}{}
	agreed := addr == m.to && (m.moving || m.refusing)
	var took time.Duration
	if agreed {
		m.moving, m.refusing, took = false, false, m.now().Sub(m.at)
	}
	m.mu.Unlock()
	if agreed {
		m.log.Info(agreedMasterMsg, "master", addr, "after", took.Round(time.Millisecond))
		m.tell("")
	}
	if sc, ok := conn.(syscall.Conn); ok {
		// go-redis checks a pooled connection's health through its
		// descriptor: a closed one is then dropped, not used.
		return &trackedSysConn{tc, sc}, nil
	}
	return tc, nil
}

// switched is told a Sentinel announced the master moved from from to to:
// it closes the connections to from, if any.
func (m *masterConns) switched(from, to string) {
	m.mu.Lock()
	m.from, m.to, m.at, m.refusing = from, to, m.now(), false
	old := m.conns[from]
	delete(m.conns, from)
	m.moving = len(old) > 0
	m.mu.Unlock()
	if len(old) == 0 {
		return
	}
	m.log.Warn(replacedMasterMsg, "old", from, "new", to, "conns", len(old))
	m.count("closed")
	m.tell(fmt.Sprintf("Redis master %s was replaced by %s: its connections closed, the client dials the new one", from, to))
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
