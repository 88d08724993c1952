package redisstore

import (
	"cmp"
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// FollowOptions configures FollowSentinels. The zero value is usable.
type FollowOptions struct {
	// Logger receives a line per master change (INFO "redis: sentinel
	// switched master"), per closing of the connections to a replaced
	// master (WARN), on the first dial per change redirected to its
	// replacement (INFO), and when the replica being promoted refuses
	// INFO (WARN), and when a change acted on at the replica's answer is
	// undone (WARN), and per +switch-master ignored as older than the
	// change acted on (INFO; with a WARN if the client's connections to
	// the master it names are closed, and an INFO on the first dial there
	// redirected). Default slog.Default().
	Logger *slog.Logger

	// OnSwitch, when set, is called once per master change a Sentinel
	// announces, after the client's connections to the old master are
	// closed, with the old and new master's addresses. It runs on the
	// goroutine of the subscription that told the change, holding it, so
	// two different changes told by two Sentinels may run at once. ctx
	// ends at Close, which waits for it to return: OnSwitch must not call
	// Close.
	OnSwitch func(ctx context.Context, from, to string)

	// OnReplaced, when set, is called with "closed" each time the
	// client's connections to a replaced master are closed, and with
	// "redirected" the first time after a change that the client's own
	// Sentinel still named the old master and its dial went to the new one.
	// The same for a master an ignored, older +switch-master named.
	OnReplaced func(how string)

	// OnDegraded, when set, is called with a reason at each master
	// change acted on, before OnSwitch, when the client's connections to
	// the old master are closed, or when it has none to close (in an
	// unplanned failover calls failed on them with the master) nor any to
	// the new one; and with "" once it has dialled the master the Sentinels
	// announced (or once its Sentinel names the old one again more than
	// 10 s later: most often a failover back to it). A client that makes
	// no call dials nothing: the reason stays until its next call.
	OnDegraded func(reason string)

	// OnRoleRefused, when set, is called with the replica's address each
	// time the replica a Sentinel is promoting refuses INFO (an ACL user
	// without +info): the change then waits for the Sentinel's
	// +promoted-slave, most of a second later. It comes with the WARN line.
	OnRoleRefused func(replica string)

	// OnStaleSwitch, when set, is called once per +switch-master ignored
	// as older than the change acted on, with the master it named and
	// the one acted on. It comes with the INFO line, so that what is
	// ignored can be counted as well as read.
	OnStaleSwitch func(named, master string)
}

// SentinelFollower is what FollowSentinels started: subscriptions to
// every Sentinel monitoring the master, until Close. A nil
// *SentinelFollower does nothing.
type SentinelFollower struct {
	stop func()
	once sync.Once
}

// followed holds the live followers by the options they set up: a second
// FollowSentinels on them returns the first's follower.
var followed sync.Map // *redis.FailoverOptions → *SentinelFollower

const followedMsg = "redis: FollowSentinels called again on options it follows: the follower already started is returned; these FollowOptions are not used"

// FollowSentinels makes the failover client built from o (with
// redis.NewFailoverClient, after this call) leave a replaced master as
// soon as any Sentinel monitoring it announces its replacement, rather
// than when the client's own Sentinel announces +switch-master.
//
// go-redis's failover client follows one Sentinel's +switch-master. In a
// planned SENTINEL FAILOVER the Sentinel leading it publishes that only
// once the other replicas have resynced from the new master, seconds
// after the promotion, and the others a second or more after it; the old
// master, still a master until it is reconfigured, answers the client
// meanwhile, and the takes it acknowledges are lost when it becomes a
// replica. The follower subscribes on every Sentinel of o, and on every
// other Sentinel they list as monitoring o.MasterName (SENTINEL
// SENTINELS, asked at once and every 30 s), to +switch-master,
// +promoted-slave and +failover-state-wait-promotion; on the last it
// asks the replica being promoted INFO replication every 5 ms, for up to
// 2 s, until it reports role master (a change acted on at that answer
// that no Sentinel announces within 2 s is undone: its leader was lost
// before it committed the failover). At the first of these that tells a
// change, once per change, it closes the client's connections to the old
// master (calls under way on them fail, as on any lost connection; the
// store never sends a script twice). The client then dials again, asking
// its Sentinel, which may still name the old master: such a dial in the
// next 10 s goes to the new master instead. A +switch-master whose
// config epoch (SENTINEL MASTER, asked of the Sentinel that announced it)
// is older than the last one acted on is ignored: a failover's leader
// announces it late, once it has reconfigured the replicas; a dial to the
// master it names, in the next 10 s, goes to the one acted on.
// docs/redis.md ("Failover") has the measurements.
//
// It sets o.Dialer, wrapping the one already set (or dialling as go-redis
// does, with o.DialTimeout and o.TLSConfig): call it once o is otherwise
// complete, and build one client from o. The subscriptions use o's
// Sentinel credentials and TLS, and the original o.Dialer; a Sentinel
// that does not answer is retried quietly, with backoff. The replica is
// asked with o's Redis credentials: a user refused INFO is logged, and
// the change then waits for the Sentinel's +promoted-slave. A nil o, or one
// without MasterName, is left alone, and the follower returned is nil.
// Close the follower when done with the client.
//
// Called again on the same o before the follower's Close, it starts
// nothing and leaves o alone: it returns the follower already started
// (which serves every client built from o), whose FollowOptions stay in
// force, with a WARN line; a second follower would subscribe again and
// wrap the first's Dialer, splitting the hooks' calls between the two.
// Once the follower is closed, a call on o starts a new one (o.Dialer,
// the closed follower's, then dials straight through). A copy of o made
// after the call carries the follower's Dialer: follow the original
// options, not a copy.
func FollowSentinels(o *redis.FailoverOptions, opts *FollowOptions) *SentinelFollower {
	if o == nil || o.MasterName == "" {
		return nil
	}
	var fo FollowOptions
	if opts != nil {
		fo = *opts
	}
	log := cmp.Or(fo.Logger, slog.Default())
	f := &SentinelFollower{}
	if first, loaded := followed.LoadOrStore(o, f); loaded {
		log.Warn(followedMsg, "master_name", o.MasterName)
		return first.(*SentinelFollower)
	}
	watched := *o
	watched.SentinelAddrs = slices.Clone(o.SentinelAddrs)
	dial := o.Dialer
	if dial == nil {
		// go-redis's own dial, which a Dialer replaces.
		dial = redis.NewDialer(&redis.Options{DialTimeout: cmp.Or(o.DialTimeout, 5*time.Second), TLSConfig: o.TLSConfig})
	}
	conns := newMasterConns(dial, log, fo.OnDegraded, fo.OnReplaced)
	o.Dialer = conns.Dial
	stop := watchSwitchMaster(&watched, log, func(ctx context.Context, from, to string) {
		conns.switched(from, to)
		if fo.OnSwitch != nil {
			fo.OnSwitch(ctx, from, to)
		}
	}, watchHooks{check: conns.check, stale: func(to, current string) {
		conns.staleSwitch(to, current)
		if fo.OnStaleSwitch != nil {
			fo.OnStaleSwitch(to, current)
		}
	}, roleRefused: fo.OnRoleRefused})
	f.stop = func() {
		stop()
		conns.closed.Store(true)
		followed.CompareAndDelete(o, f)
	}
	return f
}

// Close ends the subscriptions, waiting for an OnSwitch under way (and,
// for a Sentinel that takes connections but never answers, for at most
// one question's timeout, 250 ms). The client's dials then go straight
// to the address asked, as without the follower. Close is idempotent.
func (f *SentinelFollower) Close() {
	if f == nil {
		return
	}
	f.once.Do(f.stop)
}
