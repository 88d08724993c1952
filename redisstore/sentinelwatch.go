package redisstore

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Backoff between subscriptions to a Sentinel that is down or refused.
const (
	sentinelRetryMin = 100 * time.Millisecond
	sentinelRetryMax = 10 * time.Second
	sentinelPing     = 15 * time.Second // idle time before a subscription is checked
	// sentinelAskTimeout bounds a question to a Sentinel or to the
	// replica being promoted.
	sentinelAskTimeout = 250 * time.Millisecond
)

const sentinelSwitchMsg = "redis: sentinel switched master"

// sentinelSwitchChannels are the Sentinel events that tell a master
// replaced: the promotion, published by the Sentinel leading the
// failover once its INFO of the replica reports role master, before any
// +switch-master (the others learn the new master from its hello
// messages); and the switch, which a Sentinel that missed the promotion
// (subscribed late, or not the leader's) still announces. Before both,
// the leader's +failover-state-wait-promotion: it has just sent the
// replica SLAVEOF NO ONE (sentinelPromotionEvent).
var sentinelSwitchChannels = []string{sentinelPromotionEvent, "+promoted-slave", "+switch-master"}

// sentinelPromotionEvent is published by the Sentinel leading a failover
// once it has sent the chosen replica SLAVEOF NO ONE. The replica is a
// master a round trip later, but the leader sees it only on its next
// INFO of the replica, one a second: its +promoted-slave came 0.9 s after
// the replica's role changed (TestFaultServeSentinelPromotion), and the
// old master, still a master, took writes meanwhile that were lost. So
// the watch asks the replica its role itself (sentinelRoleEvery), and
// acts as on +promoted-slave once it answers master.
const sentinelPromotionEvent = "+failover-state-wait-promotion"

// How often, and how long, the replica a Sentinel is promoting is asked
// its role. Past sentinelRoleFor the leader's +promoted-slave is waited
// for instead.
const (
	sentinelRoleEvery = 5 * time.Millisecond
	sentinelRoleFor   = 2 * time.Second
)

// sentinelConfirmFor is how long a change acted on at the replica's role
// waits for a Sentinel to announce it (+promoted-slave, +switch-master)
// before the old master is used again. The leader announces it on its
// next INFO of the replica, one a second during a failover.
const sentinelConfirmFor = 2 * time.Second

// sentinelRoleEvent names, in the switch's log line, a change acted on at
// the replica's answer; "unconfirmed", a change back for want of a
// Sentinel's word on it.
const sentinelRoleEvent = "role"

// watchHooks, when set, are told: check, a +switch-master to to whose
// config epoch is being asked, until the done it returns is called (after
// switched or stale); stale, a +switch-master older than the change acted
// on (to is the master it names, current the one acted on); roleRefused,
// the replica being promoted refusing INFO.
type watchHooks struct {
	check       func(to string) (done func())
	stale       func(to, current string)
	roleRefused func(replica string)
}

// unconfirmed is a change acted on at the replica's role that no Sentinel
// has announced yet; done is closed once one has, or once a newer change
// is acted on.
type unconfirmed struct {
	change [2]string
	done   chan struct{}
}

const sentinelUnconfirmedMsg = "redis: no Sentinel announced the promotion acted on at the replica's role: back to the old master"

const sentinelStaleMsg = "redis: a Sentinel announced a master change older than the one acted on: ignored"

const sentinelRoleMsg = "redis: cannot ask the replica a Sentinel is promoting its role (INFO replication): leaving the old master at the Sentinel's +promoted-slave"

// parseSwitch reads a payload of one of sentinelSwitchChannels: the
// master's name, its old address and its new one.
func parseSwitch(channel, payload string) (name, from, to string, ok bool) {
	f := strings.Fields(payload)
	switch {
	case channel == "+switch-master" && len(f) == 5:
		// <master-name> <old-ip> <old-port> <new-ip> <new-port>
		return f[0], net.JoinHostPort(f[1], f[2]), net.JoinHostPort(f[3], f[4]), true
	case channel != "+switch-master" && len(f) == 8 && f[0] == "slave" && f[4] == "@":
		// slave <ip:port> <ip> <port> @ <master-name> <master-ip> <master-port>
		return f[5], net.JoinHostPort(f[6], f[7]), net.JoinHostPort(f[2], f[3]), true
	}
	return "", "", "", false
}

// watchSwitchMaster subscribes to the promotions and switches
// (sentinelSwitchChannels) on every Sentinel of o and, when one announces
// a new master for o.MasterName, tells switched (old and new master's
// addresses, and a context that ends with the watch). Every Sentinel, not
// one, since the one that is down may be the one a single subscription
// used, and the one leading a planned failover announces the switch last
// (its promotion first). A change told several times (the promotion, then
// each Sentinel's switch) is acted on once. o.Dialer, if set, dials the
// Sentinels and the replica being promoted. The returned stop ends the
// subscriptions, and waits for a switched under way.
func watchSwitchMaster(o *redis.FailoverOptions, log *slog.Logger, switched func(ctx context.Context, from, to string), hooks watchHooks) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		last    [2]string         // the change last acted on: from, to
		epoch   int64        = -1 // the config epoch of the last +switch-master acted on; -1: none known
		pending *unconfirmed      // acted on at the replica's role, no Sentinel's word yet
	)
	var act func(event, from, to string, ep switchEpoch)
	// confirm waits for a Sentinel to announce the change p acted on at
	// the replica's role, and goes back to the old master when none does
	// in sentinelConfirmFor: a leader lost between SLAVEOF NO ONE and its
	// next INFO of the replica never commits the failover, the others keep
	// the old master and make the replica one again, and what was decided
	// on it meanwhile is lost (10 s of takes, measured, before this).
	confirm := func(p *unconfirmed) {
		select {
		case <-ctx.Done():
			return
		case <-p.done:
			return
		case <-time.After(sentinelConfirmFor):
		}
		mu.Lock()
		still := pending == p
		if still {
			pending = nil
		}
		mu.Unlock()
		if still {
			log.Warn(sentinelUnconfirmedMsg, "master_name", o.MasterName, "replica", p.change[1], "master", p.change[0], "after", sentinelConfirmFor)
			act("unconfirmed", p.change[1], p.change[0], noEpoch)
		}
	}
	act = func(event, from, to string, ep switchEpoch) {
		change := [2]string{from, to}
		e := ep.e
		mu.Lock()
		if e >= 0 && epoch >= 0 && (e < epoch || e == epoch && to != last[1]) {
			// Older than the change acted on: its leader finished late,
			// or the Sentinel heard of it late.
			current := last[1]
			mu.Unlock()
			log.Info(sentinelStaleMsg, "master_name", o.MasterName, "from", from, "to", to, "config_epoch", e, "acted_epoch", epoch, "master", current)
			if hooks.stale != nil {
				hooks.stale(to, current)
			}
			return
		}
		if !ep.exact {
			e = -1 // not this announcement's: unknown
		}
		// The same configuration told again, from an older address.
		again := last == change || e >= 0 && e == epoch && to == last[1]
		epoch = max(epoch, e)
		// A Sentinel's word on the change confirms it; another change
		// supersedes it.
		if pending != nil && (pending.change != change || event != sentinelRoleEvent) {
			close(pending.done)
			pending = nil
		}
		last = change
		var p *unconfirmed
		if !again && event == sentinelRoleEvent {
			p = &unconfirmed{change: change, done: make(chan struct{})}
			pending = p
		}
		mu.Unlock()
		if again {
			return
		}
		if p != nil {
			wg.Add(1) // under the caller's count: never races stop's Wait
			go func() {
				defer wg.Done()
				confirm(p)
			}()
		}
		attrs := []any{"master_name", o.MasterName, "from", from, "to", to, "event", event}
		if e >= 0 {
			attrs = append(attrs, "config_epoch", e)
		}
		log.Info(sentinelSwitchMsg, attrs...)
		switched(ctx, from, to)
	}
	acted := func(from, to string) bool {
		mu.Lock()
		defer mu.Unlock()
		return last == [2]string{from, to}
	}
	// awaitRole asks the replica being promoted its role until it answers
	// master, then acts; it stops early once the change is acted on (the
	// leader's +promoted-slave came first), or when the replica refuses
	// the question (an ACL without ROLE: logged).
	awaitRole := func(from, to string) {
		rc := redis.NewClient(&redis.Options{
			Addr: to, Username: o.Username, Password: o.Password, Protocol: o.Protocol,
			TLSConfig: o.TLSConfig, Dialer: o.Dialer, DialTimeout: o.DialTimeout,
			MaxRetries: -1, PoolSize: 1,
			ReadTimeout: sentinelAskTimeout, WriteTimeout: sentinelAskTimeout,
		})
		defer rc.Close()
		for deadline := time.Now().Add(sentinelRoleFor); ctx.Err() == nil && time.Now().Before(deadline) && !acted(from, to); {
			// INFO, not ROLE: the user sluice's docs give has +info, and
			// ROLE is in @admin.
			rctx, cancel := context.WithTimeout(ctx, sentinelAskTimeout)
			info, err := rc.Info(rctx, "replication").Result()
			cancel()
			if err == nil && strings.Contains(info, "role:master\r\n") {
				act(sentinelRoleEvent, from, to, noEpoch)
				return
			}
			var rerr redis.Error
			if errors.As(err, &rerr) {
				log.Warn(sentinelRoleMsg, "replica", to, "err", err)
				if hooks.roleRefused != nil {
					hooks.roleRefused(to)
				}
				return
			}
			select {
			case <-ctx.Done():
			case <-time.After(sentinelRoleEvery):
			}
		}
	}
	var awaiting sync.Map // from, to: the promotions whose replica is asked
	// onSwitch handles an event of the Sentinel ask answers for.
	onSwitch := func(ask *redis.SentinelClient, channel, payload string) {
		name, from, to, ok := parseSwitch(channel, payload)
		if !ok || name != o.MasterName {
			return
		}
		if channel == "+switch-master" {
			if hooks.check != nil {
				defer hooks.check(to)()
			}
			act(channel, from, to, askEpoch(ctx, ask, o.MasterName, to))
			return
		}
		if channel != sentinelPromotionEvent {
			act(channel, from, to, noEpoch)
			return
		}
		if _, dup := awaiting.LoadOrStore([2]string{from, to}, true); dup || acted(from, to) {
			return
		}
		wg.Add(1) // under the subscription's count: never races stop's Wait
		go func() {
			defer wg.Done()
			defer awaiting.Delete([2]string{from, to})
			awaitRole(from, to)
		}()
	}
	opts := func(addr string) *redis.Options {
		return &redis.Options{
			Addr: addr, Username: o.SentinelUsername, Password: o.SentinelPassword,
			TLSConfig: o.TLSConfig, Dialer: o.Dialer, DialTimeout: o.DialTimeout,
			MaxRetries: -1, PoolSize: 1, // retries are the loop's, with backoff
			// A Sentinel that takes connections and never answers would
			// hold a subscription's handshake, or a question, for
			// go-redis's 3 s default, and Close with it.
			ReadTimeout: sentinelAskTimeout, WriteTimeout: sentinelAskTimeout,
		}
	}
	var (
		smu        sync.Mutex
		subscribed = map[string]bool{}
	)
	// subscribe runs while wg counts the caller (the start, or discover's
	// goroutine), so its wg.Add never races stop's Wait.
	subscribe := func(addr string) {
		smu.Lock()
		defer smu.Unlock()
		if subscribed[addr] || ctx.Err() != nil {
			return
		}
		subscribed[addr] = true
		wg.Add(1)
		go func() {
			defer wg.Done()
			ask := redis.NewSentinelClient(opts(addr))
			defer ask.Close()
			subscribeSwitches(ctx, opts(addr), func(channel, payload string) { onSwitch(ask, channel, payload) })
		}()
	}
	known := func() []string {
		smu.Lock()
		defer smu.Unlock()
		addrs := make([]string, 0, len(subscribed))
		for a := range subscribed {
			addrs = append(addrs, a)
		}
		return addrs
	}
	for _, addr := range o.SentinelAddrs {
		subscribe(addr)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		discoverSentinels(ctx, o.MasterName, opts, known, subscribe)
	}()
	return func() { cancel(); wg.Wait() }
}

// switchEpoch is the config epoch of a +switch-master, as the Sentinel
// that announced it tells it (SENTINEL MASTER): announcements carry none,
// and a failover's leader announces the switch only once it has
// reconfigured the replicas, possibly after a newer failover was
// announced.
type switchEpoch struct {
	e     int64 // -1: unknown (no answer)
	exact bool  // e is the announcement's; else at most e: the Sentinel names another master since
}

var noEpoch = switchEpoch{e: -1}

// askEpoch asks the Sentinel that announced a +switch-master to to the
// config epoch of master.
func askEpoch(ctx context.Context, ask *redis.SentinelClient, master, to string) switchEpoch {
	qctx, cancel := context.WithTimeout(ctx, sentinelAskTimeout)
	defer cancel()
	m, err := ask.Master(qctx, master).Result()
	if err != nil {
		return noEpoch
	}
	e, err := strconv.ParseInt(m["config-epoch"], 10, 64)
	if err != nil || e < 0 {
		return noEpoch
	}
	return switchEpoch{e: e, exact: net.JoinHostPort(m["ip"], m["port"]) == to}
}

// sentinelDiscoverEvery is how often the Sentinels the options name are
// asked for the others that monitor its master.
const sentinelDiscoverEvery = 30 * time.Second

// discoverSentinels subscribes to every Sentinel that monitors master, as
// the known ones list it (SENTINEL SENTINELS), now and every
// sentinelDiscoverEvery until ctx ends. Options often name one Sentinel:
// if it leads a planned failover it announces the switch seconds after
// the others, and the client would hear of it late.
func discoverSentinels(ctx context.Context, master string, opts func(string) *redis.Options, known func() []string, subscribe func(string)) {
	for {
		for _, addr := range known() {
			sc := redis.NewSentinelClient(opts(addr))
			qctx, cancel := context.WithTimeout(ctx, sentinelAskTimeout)
			others, err := sc.Sentinels(qctx, master).Result()
			cancel()
			sc.Close()
			if err != nil {
				continue // down, or not knowing master: the next one, or the next round
			}
			for _, o := range others {
				if ip, port := o["ip"], o["port"]; ip != "" && port != "" {
					subscribe(net.JoinHostPort(ip, port))
				}
			}
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(sentinelDiscoverEvery):
		}
	}
}

// subscribeSwitches delivers the events of sentinelSwitchChannels of one
// Sentinel (channel and payload) until ctx ends, subscribing again with backoff after a failure (an
// unreachable Sentinel is not worth a log line: the store reports Redis's
// own state).
func subscribeSwitches(ctx context.Context, opt *redis.Options, fn func(channel, payload string)) {
	sc := redis.NewSentinelClient(opt)
	defer sc.Close()
	backoff := sentinelRetryMin
	for ctx.Err() == nil {
		ps := sc.Subscribe(ctx, sentinelSwitchChannels...)
		unblock := context.AfterFunc(ctx, func() { ps.Close() }) // a pending read ends with the connection
		pinged := false
		for {
			m, err := ps.ReceiveTimeout(ctx, sentinelPing)
			if err != nil {
				// A quiet connection is pinged once: a Sentinel gone
				// without a word leaves the read waiting for good.
				var ne net.Error
				if !pinged && errors.As(err, &ne) && ne.Timeout() && ps.Ping(ctx) == nil {
					pinged = true
					continue
				}
				break
			}
			pinged = false
			backoff = sentinelRetryMin
			if msg, ok := m.(*redis.Message); ok {
				fn(msg.Channel, msg.Payload)
			}
		}
		unblock()
		ps.Close()
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, sentinelRetryMax)
	}
}
