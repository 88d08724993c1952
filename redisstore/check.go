package redisstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/internal/ctxutil"
	"github.com/sluicehq/sluice/internal/nilclient"
)

// MinVersion is the oldest Redis the scripts are written and tested for.
const MinVersion = "7.0"

// Kinds of Redis failure that Check and Classify report. Test with
// errors.Is. Every kind but ErrUnreachable, ErrStalled, ErrReplicas, ErrOOM,
// ErrMaxClients and ErrResharding also matches ErrMisconfigured: retrying
// cannot help until someone changes the configuration.
var (
	// ErrMisconfigured matches every permanent kind below.
	ErrMisconfigured = errors.New("redisstore: Redis misconfigured")
	// ErrAuth: WRONGPASS, NOAUTH, or a password sent to a server without one
	// (Check reports a Sentinel that refuses the credentials as
	// ErrTopology).
	ErrAuth = errors.New("redisstore: Redis authentication failed")
	// ErrDatabase: the URL's database index is beyond the server's
	// databases setting.
	ErrDatabase = errors.New("redisstore: Redis database index out of range")
	// ErrTLS: the TLS handshake failed, or one side speaks TLS and the
	// other does not.
	ErrTLS = errors.New("redisstore: TLS with Redis failed")
	// ErrSentinelMaster: the Sentinels answer but do not know the master
	// name.
	ErrSentinelMaster = errors.New("redisstore: Sentinel does not know the master")
	// ErrPermission: the ACL user may not run a command sluice needs
	// (NOPERM).
	ErrPermission = errors.New("redisstore: Redis user lacks a permission")
	// ErrTopology: a standalone client on a Cluster node or on a replica
	// (read-only, READONLY, or one that accepts writes its master never
	// sees), a Cluster client on a standalone server, or a Sentinel taken
	// for a data node or a data node for a Sentinel.
	ErrTopology = errors.New("redisstore: wrong Redis topology")
	// ErrVersion: the server is older than MinVersion.
	ErrVersion = errors.New("redisstore: Redis too old")
	// ErrUnreachable: no answer (refused, timed out, reset); worth retrying.
	ErrUnreachable = errors.New("redisstore: Redis unreachable")
	// ErrStalled: Redis answers (PING, INFO) but a write does not complete
	// in time: writes paused (CLIENT PAUSE ... WRITE, as during a manual
	// failover, or a SHUTDOWN waiting for the replicas, which Check names
	// when INFO says so), or a long script or command ahead of it; or it
	// accepts connections but answers nothing (a stopped or frozen
	// process: see Unanswered). Check and CheckAccess report the first;
	// Classify cannot tell either from a timeout (see Stalled). Worth
	// retrying.
	ErrStalled = errors.New("redisstore: Redis stalled")
	// ErrReplicas: Redis refuses writes for want of replicas
	// (min-replicas-to-write, NOREPLICAS): reachable, and back when its
	// replicas are, or when the setting changes.
	ErrReplicas = errors.New("redisstore: Redis refuses writes: too few replicas")
	// ErrOOM: Redis refuses writes for want of memory (maxmemory reached
	// under noeviction, OOM): reachable, and back when memory is freed
	// (sluice's keys expire) or maxmemory is raised.
	ErrOOM = errors.New("redisstore: Redis refuses writes: out of memory")
	// ErrMaxClients: Redis refuses new connections, having maxclients
	// open ("ERR max number of clients reached"): reachable, connections
	// already open still work, and back when clients close theirs or
	// maxclients is raised. Only a client hooked by DetectRefusals tells
	// it; on others it is a broken pipe or an EOF, ErrUnreachable.
	ErrMaxClients = errors.New("redisstore: Redis refuses new connections: max clients reached")
	// ErrResharding: a Cluster slot is migrating and a call's keys are
	// split between its two nodes, so Redis answers TRYAGAIN and runs
	// nothing. The Store tries such a call again for up to a second
	// within its deadline; this is a call whose keys stayed split that
	// long: a migration under way, or one left half done (redis-cli
	// --cluster fix finishes it).
	ErrResharding = errors.New("redisstore: Redis Cluster slot migrating")
	// ErrEviction is a warning, never returned as Check's error: the
	// server's maxmemory-policy may evict sluice's keys, which resets
	// limits.
	ErrEviction = errors.New("redisstore: Redis may evict keys")
	// ErrNoPersistence is a warning, never returned as Check's error: the
	// server runs without its append-only file, so a restart loses the
	// decisions made since its last snapshot, if any, and resets those
	// limits.
	ErrNoPersistence = errors.New("redisstore: Redis may lose decisions on restart")
)

// CheckError is a classified Redis failure: Kind is one of this package's
// kinds, Hint what to do about it, Err the client's error.
type CheckError struct {
	Kind error
	Hint string
	Err  error
}

// Error is one sentence: the kind, what to do, and what Redis said.
func (e *CheckError) Error() string {
	if e == nil || e.Kind == nil {
		return "redisstore: check failed"
	}
	msg := e.Kind.Error()
	if e.Hint != "" {
		msg += ": " + e.Hint
	}
	if e.Err != nil {
		msg += " (" + e.Err.Error() + ")"
	}
	return msg
}

// Is matches the kind, and ErrMisconfigured for every permanent kind.
func (e *CheckError) Is(target error) bool {
	if e == nil {
		return false
	}
	return target == e.Kind || (target == ErrMisconfigured && !transient(e.Kind))
}

// transient reports whether a kind can pass without a configuration change.
func transient(kind error) bool {
	switch kind {
	case ErrUnreachable, ErrStalled, ErrEviction, ErrNoPersistence, ErrReplicas, ErrOOM, ErrMaxClients, ErrResharding, ErrNotReplicated:
		return true
	}
	return false
}

func (e *CheckError) Unwrap() error {
	if e == nil {
		return nil
	}
	return e.Err
}

func checkErr(kind error, hint string, err error) *CheckError {
	return &CheckError{Kind: kind, Hint: hint, Err: err}
}

// Classify turns a client error into a *CheckError of the matching kind
// (ErrNotReplicated too, transient); anything unrecognised is
// ErrUnreachable. Classify(nil) is nil.
func Classify(err error) error {
	if err == nil {
		return nil
	}
	var pe *PartialError
	if errors.As(err, &pe) {
		return pe // each master's error is classified already
	}
	var ce *CheckError
	if errors.As(err, &ce) {
		return ce
	}
	if errors.Is(err, ErrNotReplicated) {
		return checkErr(ErrNotReplicated, notReplicatedHint, err)
	}
	msg := err.Error()
	// Redis's own reply, matched by its start: err's text begins with
	// the caller's context ("redisstore: gcra take: READONLY ...").
	reply := replyText(err)
	var (
		header  tls.RecordHeaderError
		alert   tls.AlertError
		unknown x509.UnknownAuthorityError
		verify  *tls.CertificateVerificationError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
	)
	switch {
	case strings.Contains(msg, "WRONGPASS"), strings.Contains(msg, "NOAUTH"),
		strings.Contains(msg, "without any password configured"), strings.Contains(msg, "invalid password"):
		return checkErr(ErrAuth, "check the user and password in the Redis URL", err)
	case strings.Contains(msg, "NOPERM"), strings.Contains(msg, "The user executing the script can't"): // the second: a command or key refused inside a script
		return checkErr(ErrPermission, "grant the Redis user the commands sluice runs, those inside its scripts included: +@connection +info +evalsha +eval +script|load +time +@read +@write +publish +subscribe (and +cluster|slots on a Cluster) on keys ~sluice:* ~{sluice:fleet}:* and channel &{sluice:fleet}:slots", err)
	case strings.Contains(msg, "DB index is out of range"), strings.Contains(msg, "invalid DB index"):
		return checkErr(ErrDatabase, "pick a database below the server's databases setting in the URL's /db", err)
	case strings.Contains(msg, "cluster support disabled"):
		return checkErr(ErrTopology, "the server is not a Cluster: use redis:// instead of redis+cluster://", err)
	case strings.HasPrefix(reply, "MOVED "), strings.HasPrefix(reply, "ASK "):
		return checkErr(ErrTopology, "the server is a Cluster node: use redis+cluster://", err)
	case strings.HasPrefix(reply, "READONLY"), strings.Contains(reply, "-READONLY "): // the second: refused inside a script
		return checkErr(ErrTopology, replicaHint, err)
	case unknownCommand(msg, "sentinel"): // a Sentinel client asking a data node for the master
		return checkErr(ErrTopology, dataNodeHint, err)
	case unknownCommand(msg, "script"), unknownCommand(msg, "cluster"), unknownCommand(msg, "evalsha"):
		// Only a Sentinel lacks these (a data node reached as redis:// or
		// redis+cluster://).
		return checkErr(ErrTopology, sentinelHint, err)
	case strings.Contains(msg, "NOREPLICAS"):
		return checkErr(ErrReplicas, "the server's min-replicas-to-write is not met: check its replicas' links, or the setting", err)
	case strings.Contains(msg, "OOM command not allowed"):
		return checkErr(ErrOOM, oomHint, err)
	case strings.Contains(msg, maxClientsReply):
		return checkErr(ErrMaxClients, maxClientsHint, err)
	case strings.HasPrefix(reply, "TRYAGAIN"):
		return checkErr(ErrResharding, "the call's keys are split between the two nodes of a slot in migration, and stayed so while it tried again: if this lasts, finish the migration (redis-cli --cluster fix)", err)
	case strings.HasPrefix(reply, "CLUSTERDOWN"):
		return checkErr(ErrUnreachable, "the Cluster is down (a failover under way, or slots without a master): retrying", err)
	case errors.Is(err, redis.ErrClosed):
		// Unreachable for good, as decisions' errors say (replyErr).
		return checkErr(ErrUnreachable, "the client is closed", closedErr(err))
	case strings.Contains(msg, "all sentinels") && errors.Is(err, redis.Nil):
		return checkErr(ErrSentinelMaster, "check master_name in the Redis URL against the Sentinels' configuration", err)
	case errors.As(err, &header):
		return checkErr(ErrTLS, "the server does not speak TLS: use redis:// instead of rediss://", err)
	case errors.As(err, &alert), errors.As(err, &unknown), errors.As(err, &verify), errors.As(err, &host),
		errors.As(err, &invalid), strings.Contains(msg, "tls: "):
		return checkErr(ErrTLS, "check the server's certificate and the CA the client trusts", err)
	}
	return checkErr(ErrUnreachable, "retrying", err)
}

// replyText is the error reply Redis sent, as Redis wrote it, unwrapped
// from err; err's own text when it carries none.
func replyText(err error) string {
	var reply redis.Error
	if errors.As(err, &reply) {
		return reply.Error()
	}
	return err.Error()
}

// maxClientsHint is what to do about a Redis at its maxclients.
const maxClientsHint = "it has maxclients connections open and refuses more (connections already open still work): raise maxclients, or find who holds them (CLIENT LIST); retrying"

// stalledHint is what ErrStalled says: Redis is there, and what holds its
// writes.
const stalledHint = "it answers but a write did not complete in time (writes held: by CLIENT PAUSE, as in a manual failover; by a SHUTDOWN waiting for its replicas; or behind a long script or command): retrying"

// shutdownHint is ErrStalled's hint for a server whose INFO says it is
// shutting down: Redis holds writes while its replicas catch up.
const shutdownHint = "it is shutting down (SHUTDOWN or SIGTERM) and holds writes while its replicas catch up, for up to its shutdown-timeout; then it stops: retrying"

// notReplicatedHint is what ErrNotReplicated says: Redis answered, the
// replicas did not acknowledge in time.
const notReplicatedHint = "the master took the call but fewer than wait_replicas replicas acknowledged it within wait_timeout (WAIT; the call stays charged): check the replicas' links and lag; retrying"

// stalledOn is Stalled for a server whose INFO said it was shutting down
// (shutdown): a stall then names the shutdown.
func stalledOn(err error, shutdown bool) error {
	err = Stalled(err)
	var ce *CheckError
	if shutdown && errors.As(err, &ce) && ce.Kind == ErrStalled && (ce.Hint == stalledHint || ce.Hint == unansweredHint) {
		return checkErr(ErrStalled, shutdownHint, ce.Err)
	}
	return err
}

// ShuttingDown reports whether err is a stall named as the server's
// shutdown: what Check and CheckAccess return for a master that holds
// writes while its replicas catch up (INFO's shutdown_in_milliseconds).
func ShuttingDown(err error) bool {
	var ce *CheckError
	return errors.As(err, &ce) && ce.Kind == ErrStalled && ce.Hint == shutdownHint
}

// StalledOnShutdown is Stalled for a call on a server a check found
// shutting down (ShuttingDown): a stall is named as the shutdown, which
// the call's own error cannot tell from CLIENT PAUSE.
func StalledOnShutdown(err error) error { return stalledOn(err, true) }

// Stalled is Classify for a caller who knows that the server answered just
// before err: a timeout is then ErrStalled, not ErrUnreachable. Other errors
// are Classify's.
func Stalled(err error) error {
	if errors.Is(err, ErrPartial) {
		return Classify(err)
	}
	if isTimeout(err) {
		var ce *CheckError
		if !errors.As(err, &ce) || ce.Kind == ErrUnreachable {
			if ce != nil {
				err = ce.Err
			}
			return checkErr(ErrStalled, stalledHint, err)
		}
	}
	return Classify(err)
}

// unansweredHint is ErrStalled's hint for a server known to accept
// connections, not to answer.
const unansweredHint = "it accepts connections but did not answer in time (a stopped or frozen process, writes held by CLIENT PAUSE, or a long script or command ahead): retrying"

// Unanswered is Classify for a caller who knows that the server accepted
// a connection when err timed out: a timeout is then ErrStalled, not
// ErrUnreachable. A stopped (SIGSTOP) or frozen Redis still accepts
// connections, the kernel completing the handshake, and answers nothing;
// a killed one refuses them. Other errors, and a stall already told
// (Check's, of a server that answered INFO), are Stalled's.
func Unanswered(err error) error {
	if errors.Is(err, ErrStalled) {
		return Stalled(err)
	}
	err = Stalled(err)
	var ce *CheckError
	if errors.As(err, &ce) && ce.Kind == ErrStalled && ce.Hint == stalledHint {
		return checkErr(ErrStalled, unansweredHint, ce.Err)
	}
	return err
}

// isTimeout reports whether err is a deadline that passed: the context's,
// or the connection's read or write timeout.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// CheckReport is what Check learned about a healthy Redis.
type CheckReport struct {
	// Version is the lowest redis_version among the servers asked.
	Version string
	// Cluster is true for a Cluster.
	Cluster bool
	// Masters is a Cluster's masters, by address, sorted: every one
	// checked.
	Masters []string
	// Warnings are problems that do not stop sluice: ErrEviction,
	// ErrNoPersistence, or
	// checks the user may not run (INFO denied).
	Warnings []error
}

// Check asks Redis, through c, whether sluice can run on it: the server
// answers, authentication and the database index are right, TLS works,
// the client's topology matches the server's, the version is at least
// MinVersion, and the user may run sluice's scripts. A Cluster is checked
// on every master of the client's slot map, each within
// CheckMasterTimeout (1s): a silent master fails then, however long ctx
// runs, and the others are reported. The error is a *CheckError:
// errors.Is(err, ErrMisconfigured) tells a configuration to fix from a
// Redis merely unreachable (ErrUnreachable); on a Cluster where some
// masters pass and others fail, it is a *PartialError (ErrPartial), and
// the report is the passing masters'. Check writes nothing but a one-line
// script into the script cache. It returns as soon as ctx ends, whatever
// the client's timeouts, with an error that wraps ctx.Err().
func Check(ctx context.Context, c redis.UniversalClient) (*CheckReport, error) {
	ctx = ctxutil.OrBackground(ctx)
	if c = nilclient.Or(c); c == nil {
		return nil, ErrNoClient
	}
	// TLS spoken to a plaintext port hangs until the dial timeout: ask in
	// plaintext first.
	if node, ok := c.(*redis.Client); ok && node.Options().TLSConfig != nil && hostPort(node.Options().Addr) {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		plain := speaksRESP(pctx, node.Options().Addr)
		cancel()
		if plain {
			return nil, checkErr(ErrTLS, "the server does not speak TLS: use redis:// instead of rediss://", nil)
		}
	}
	rep := &CheckReport{}
	var mu sync.Mutex // the masters are checked at once
	merge := func(r *CheckReport) {
		mu.Lock()
		defer mu.Unlock()
		if r.Version != "" && (rep.Version == "" || !versionAtLeast(r.Version, rep.Version)) {
			rep.Version = r.Version
		}
		rep.Warnings = append(rep.Warnings, r.Warnings...)
	}
	if cc, ok := c.(*redis.ClusterClient); ok {
		// Every master on its own: one down among live ones is a partial
		// failure, not a Cluster that cannot be used.
		rep.Cluster = true
		if err := awaitClientMap(ctx, cc); err != nil {
			return nil, sentinelBehindAuth(ctx, c, Classify(err))
		}
		masters, err := clusterMasters(ctx, cc, "")
		if err != nil {
			return nil, sentinelBehindAuth(ctx, c, err)
		}
		for _, m := range masters {
			rep.Masters = append(rep.Masters, m.addr)
		}
		slices.Sort(rep.Masters)
		err = eachMaster(ctx, masters, func(ctx context.Context, m clusterMaster, answered func(), shutdown *atomic.Bool) error {
			return checkMaster(ctx, m, answered, shutdown, merge)
		})
		if errors.Is(err, ErrPartial) {
			return rep, err
		}
		if err != nil {
			return nil, err
		}
		return rep, nil
	}
	if err := boundedErr(ctx, func() error { return c.Ping(ctx).Err() }); err != nil {
		if tlsErr := plainAgainstTLS(ctx, c, err); tlsErr != nil {
			return nil, tlsErr
		}
		return nil, sentinelBehindAuth(ctx, c, Classify(err))
	}
	// Nodes that answered INFO and whose probe script has not completed:
	// a deadline then is a stalled Redis, not an unreachable one.
	var scripting atomic.Int32
	var shutdown atomic.Bool
	err := boundedErr(ctx, func() error {
		node, ok := c.(*redis.Client)
		if !ok {
			return nil
		}
		var r CheckReport
		err := checkNode(ctx, node, false, &r, &scripting, &shutdown)
		merge(&r)
		return err
	})
	if err != nil {
		if ctx.Err() != nil && scripting.Load() > 0 {
			return nil, stalledOn(err, shutdown.Load())
		}
		return nil, Classify(err)
	}
	return rep, nil
}

// CheckMasterTimeout bounds each Redis Cluster master's part of Check
// (PING, INFO, the probe script), whatever the client's timeouts. A live
// master passes in a few round trips, so one silent or stalled among live
// ones is named this long after Check starts rather than holding Check,
// and a service's start, to its context's end. The context still bounds
// the whole.
const CheckMasterTimeout = time.Second

// checkMaster is Check on one master of a Cluster, within
// CheckMasterTimeout. merge takes the master's report once its check has
// ended; a check cut short may still be running, so it gives none.
// shutdown is set once INFO says the master is shutting down.
func checkMaster(ctx context.Context, m clusterMaster, answered func(), shutdown *atomic.Bool, merge func(*CheckReport)) error {
	mctx, cancel := context.WithTimeout(ctx, CheckMasterTimeout)
	defer cancel()
	var r CheckReport
	var scripting atomic.Int32
	var ferr, err error // ferr, r: the check's, read once it has ended
	berr := bounded(mctx, nil, make(chan struct{}, 1), func() {
		if ferr = m.node.Ping(mctx).Err(); ferr != nil {
			return
		}
		answered()
		ferr = checkNode(mctx, m.node, true, &r, &scripting, shutdown)
	})
	if berr == nil {
		merge(&r)
		err = atEnd(mctx, ferr)
	} else {
		when := fmt.Sprintf("within %v", CheckMasterTimeout)
		if ctx.Err() != nil {
			when = "before the check's end"
		}
		err = fmt.Errorf("no answer from %s %s: %w", m.addr, when, berr)
	}
	if err != nil && scripting.Load() > 0 {
		return stalledOn(err, shutdown.Load())
	}
	return Classify(err)
}

// Hints for a Sentinel and a data node taken one for the other.
const (
	sentinelHint = "the server is a Sentinel: use redis+sentinel://host:port?master_name=NAME, NAME the master it monitors"
	dataNodeHint = "the server is a Redis data node, not a Sentinel: use redis:// (or redis+cluster:// for a Cluster node) with its address"
)

// sentinelBehindAuth tells a Sentinel from wrong credentials: a Sentinel
// refuses a data node's user and password (WRONGPASS), which read as
// ErrAuth though the cause is the address. After ErrAuth from a client
// with credentials it asks each of the client's addresses, without them,
// whether it is a Sentinel (INFO's redis_mode), within what is left of
// ctx and a second at most; any other answer leaves err as it is.
func sentinelBehindAuth(ctx context.Context, c redis.UniversalClient, err error) error {
	if !errors.Is(err, ErrAuth) || ctx.Err() != nil {
		return err
	}
	var addrs []string
	var conf *tls.Config
	switch c := c.(type) {
	case *redis.Client:
		o := c.Options()
		if o.Username == "" && o.Password == "" {
			return err
		}
		addrs, conf = []string{o.Addr}, o.TLSConfig
	case *redis.ClusterClient:
		o := c.Options()
		if o.Username == "" && o.Password == "" {
			return err
		}
		addrs, conf = o.Addrs, o.TLSConfig
	default:
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	for _, addr := range addrs {
		if !hostPort(addr) {
			continue
		}
		probe := redis.NewClient(&redis.Options{Addr: addr, TLSConfig: conf, MaxRetries: -1, ContextTimeoutEnabled: true, DisableIdentity: true})
		info, ierr := probe.Info(ctx, "server").Result()
		probe.Close()
		if ierr == nil && infoFields(info)["redis_mode"] == "sentinel" {
			return checkErr(ErrTopology, sentinelHint, err)
		}
	}
	return err
}

// unknownCommand reports whether msg is Redis's reply to a command it does
// not have: "ERR unknown command 'name', with args beginning with: ...".
func unknownCommand(msg, name string) bool {
	return strings.Contains(strings.ToLower(msg), "unknown command '"+name+"'")
}

// oomHint is what to do about a Redis out of memory. Not an evicting
// policy: evicted keys are reset limits.
const oomHint = "used memory is over maxmemory and Redis refuses writes (under noeviction, or under an evicting maxmemory-policy with nothing left it may evict: keys without a TTL under volatile-*, memory that is not keys, such as client buffers): raise maxmemory, or free memory (an evicting policy lets writes on by evicting sluice's keys, resetting their limits)"

// What to do about a standalone URL naming a replica: one that refuses
// every write (READONLY), one that takes writes (replica-read-only no),
// or one INFO did not say which of the two.
const (
	replicaHint         = "the server is a replica, read-only: it refuses every write; " + replicaFix
	writableReplicaHint = "the server is a replica that accepts writes (replica-read-only no), but its master and the instances using it never see them, and its next sync with the master discards them; " + replicaFix
	someReplicaHint     = "the server is a replica; " + replicaFix
	replicaFix          = "point the URL at the master, or use redis+sentinel:// so that failovers are followed"
)

// replicaHintOf is the hint for a replica whose INFO replication says
// slave_read_only is readOnly.
func replicaHintOf(readOnly string) string {
	switch readOnly {
	case "1":
		return replicaHint
	case "0":
		return writableReplicaHint
	}
	return someReplicaHint
}

// MayEvict reports whether a server with INFO memory's maxmemory_policy
// and maxmemory may evict sluice's keys: a policy other than noeviction,
// under a memory limit.
func MayEvict(policy, maxmemory string) bool {
	return policy != "" && policy != "noeviction" && maxmemory != "0" && maxmemory != ""
}

// probeScript is loaded and run to prove the user may run scripts, and
// TIME inside one: Redis checks a script's commands against the user too,
// and every sluice script reads the clock.
const probeScript = "redis.call('TIME') return 1"

func checkNode(ctx context.Context, node *redis.Client, cluster bool, rep *CheckReport, scripting *atomic.Int32, shutdown *atomic.Bool) error {
	info, err := node.Info(ctx, "server", "cluster", "memory", "replication", "persistence").Result()
	switch {
	case err != nil && strings.Contains(err.Error(), "NOPERM"):
		rep.Warnings = append(rep.Warnings, checkErr(ErrPermission, "INFO denied: version, topology, eviction policy and persistence not checked", err))
	case err != nil:
		return err
	default:
		fields := infoFields(info)
		// Present only while it shuts down (Redis 7.0 and later).
		shutdown.Store(fields["shutdown_in_milliseconds"] != "")
		if fields["redis_mode"] == "sentinel" {
			return checkErr(ErrTopology, sentinelHint, nil)
		}
		if fields["cluster_enabled"] == "1" && !cluster {
			return checkErr(ErrTopology, "the server is a Cluster node: use redis+cluster://", nil)
		}
		if fields["role"] == "slave" && !cluster {
			return checkErr(ErrTopology, replicaHintOf(fields["slave_read_only"]), nil)
		}
		v := fields["redis_version"]
		if !versionAtLeast(v, MinVersion) {
			return checkErr(ErrVersion, fmt.Sprintf("sluice needs Redis %s or later; the server runs %q", MinVersion, v), nil)
		}
		if rep.Version == "" || !versionAtLeast(v, rep.Version) {
			rep.Version = v
		}
		where := ""
		if addr := node.Options().Addr; hostPort(addr) { // a Cluster's masters may differ
			where = "node " + addr + ": "
		}
		if p := fields["maxmemory_policy"]; MayEvict(p, fields["maxmemory"]) {
			rep.Warnings = append(rep.Warnings, checkErr(ErrEviction,
				fmt.Sprintf("%smaxmemory-policy %s may evict sluice's keys and reset their limits; set noeviction", where, p), nil))
		}
		if fields["aof_enabled"] == "0" {
			rep.Warnings = append(rep.Warnings, checkErr(ErrNoPersistence,
				where+"appendonly no, so a restart loses every decision since the last RDB snapshot, if any, and those keys' limits start afresh; set appendonly yes (appendfsync everysec loses at most about a second)", nil))
		}
	}
	// The node answered INFO: a timeout from here on is a node that
	// holds scripts (writes paused), not one out of reach. It stays
	// counted unless its script completes: Check may read the count after
	// the call ended at the deadline, or after ctx ended without it.
	scripting.Add(1)
	sha, err := node.ScriptLoad(ctx, probeScript).Result()
	if err != nil {
		return stalledOn(err, shutdown.Load())
	}
	if err := node.EvalSha(ctx, sha, nil).Err(); err != nil {
		return stalledOn(err, shutdown.Load())
	}
	scripting.Add(-1)
	return nil
}

// accessScript reads the server's clock and a key and writes it as the
// store's scripts do, without changing anything: SET XX of a key that does
// not exist does nothing. SET, not PEXPIRE: Redis refuses only commands
// that may grow memory (SET, as every take does) when out of memory, and
// only before the script's first write, so that it must come first.
const accessScript = "redis.call('TIME') redis.call('GET', KEYS[1]) redis.call('SET', KEYS[1], '', 'XX', 'PX', 1) return 1"

var accessSHA = newScript(accessScript).sha.(string)

// CheckAccess runs a script that reads and writes a key under the store's
// prefix, as every decision does, so that an ACL user allowed scripts but
// not sluice's keys, or not writes, is found before the first decision
// (Check cannot: it does not know the prefix). The error is Classify's:
// ErrPermission for such a user; ErrReplicas or ErrOOM for a Redis that
// refuses writes; ErrStalled for one that answers a PING but not the
// script in time (writes paused). It is sent as decisions are, with
// EVALSHA (EVAL only when the server lacks the script), and calls TIME, so
// that a user who lost either permission is found too. On a Cluster it
// runs on every master of the client's slot map, each with a key in one of
// its slots: where some masters pass and others fail, the error is a
// *PartialError (ErrPartial). It returns as soon as ctx ends, whatever the
// client's timeouts, with an error that wraps ctx.Err().
func (s *Store) CheckAccess(ctx context.Context) error {
	ctx = ctxutil.OrBackground(ctx)
	if s == nil || s.client == nil {
		return s.unbuilt()
	}
	if cc, ok := s.client.(*redis.ClusterClient); ok {
		return s.checkAccessMasters(ctx, cc)
	}
	key := s.prefix + "check"
	// PING the server first, so that a script timing out on a server that
	// answers is told from one out of reach.
	var shutdown bool
	if err := boundedErr(ctx, func() (err error) { shutdown, err = pingShutdown(ctx, s.client); return err }); err != nil {
		return Classify(err)
	}
	return stalledOn(boundedErr(ctx, func() error { return s.runAccess(ctx, key) }), shutdown)
}

// checkAccessMasters is CheckAccess on a Cluster: on every master of the
// slot map, each with a key of its own slots, so that one master down
// among live ones is a *PartialError, not the store lost.
func (s *Store) checkAccessMasters(ctx context.Context, cc *redis.ClusterClient) error {
	if err := s.reload.awaitMap(ctx); err != nil {
		return Classify(err)
	}
	masters, err := clusterMasters(ctx, cc, s.prefix)
	if err != nil {
		return err
	}
	// A periodic check tells a failover no call told (OnFailover).
	defer s.reload.look(true)
	return eachMaster(ctx, masters, func(ctx context.Context, m clusterMaster, answered func(), shutdown *atomic.Bool) error {
		down, err := pingShutdown(ctx, m.node)
		if err != nil {
			return Classify(err)
		}
		shutdown.Store(down)
		answered()
		return stalledOn(s.runAccess(ctx, m.key), down)
	})
}

// pingShutdown sends PING and INFO server in one round trip: PING's error,
// and whether INFO says the server is shutting down (its
// shutdown_in_milliseconds, Redis 7.0 and later), so that a stall after it
// is named as the shutdown. INFO refused (an ACL) reads as not.
func pingShutdown(ctx context.Context, c redis.Cmdable) (bool, error) {
	var ping *redis.StatusCmd
	var info *redis.StringCmd
	c.Pipelined(ctx, func(p redis.Pipeliner) error {
		ping, info = p.Ping(ctx), p.Info(ctx, "server")
		return nil
	})
	if err := ping.Err(); err != nil {
		return false, err
	}
	return strings.Contains(info.Val(), "shutdown_in_milliseconds:"), nil
}

// runAccess runs the access script on key, as decisions are sent: EVALSHA,
// and EVAL when the server lacks the script. A Cluster client follows
// MOVED.
func (s *Store) runAccess(ctx context.Context, key string) error {
	keys := []string{key}
	err := s.client.Process(ctx, evalCmd(ctx, "evalsha", accessSHA, keys))
	if isNoScript(err) {
		err = s.client.Process(ctx, evalCmd(ctx, "eval", accessScript, keys))
	}
	return err
}

// infoFields parses INFO's "name:value" lines.
func infoFields(info string) map[string]string {
	out := map[string]string{}
	for line := range strings.Lines(info) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			out[k] = v
		}
	}
	return out
}

// versionAtLeast compares dotted versions numerically: "7.0.15" ≥ "7.0",
// "10.0" ≥ "7.2"; an unparsable version is too old.
func versionAtLeast(v, min string) bool {
	have, want := strings.Split(v, "."), strings.Split(min, ".")
	for i, w := range want {
		wn, _ := strconv.Atoi(w)
		if i >= len(have) {
			return wn == 0
		}
		hn, err := strconv.Atoi(have[i])
		if err != nil {
			return false
		}
		if hn != wn {
			return hn > wn
		}
	}
	return true
}

// plainAgainstTLS tells plaintext spoken to a TLS port, which otherwise
// looks like a server hanging up: after such a failure it tries a TLS
// handshake (sending nothing else) with what is left of the caller's
// deadline, a second at most, and reports ErrTLS if it works.
func plainAgainstTLS(ctx context.Context, c redis.UniversalClient, err error) error {
	node, ok := c.(*redis.Client)
	if !ok || errors.Is(err, redis.ErrClosed) || node.Options().TLSConfig != nil || !hostPort(node.Options().Addr) || !errors.Is(Classify(err), ErrUnreachable) {
		return nil
	}
	if ctx.Err() != nil { // the caller is gone: no handshake past its end
		return nil
	}
	// A second at most, within the caller's deadline: /readyz must answer
	// within its own bound even when the ping used it all.
	budget := time.Second
	if dl, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(dl))
	}
	if budget <= 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), budget)
	defer cancel()
	d := tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true}} // only asks whether the port speaks TLS
	conn, derr := d.DialContext(ctx, "tcp", node.Options().Addr)
	if derr != nil {
		return nil
	}
	conn.Close()
	return checkErr(ErrTLS, "the server speaks TLS: use rediss:// instead of redis://", err)
}

// hostPort is false for a Sentinel client's placeholder address and Unix
// sockets.
func hostPort(addr string) bool {
	_, _, err := net.SplitHostPort(addr)
	return err == nil
}

// speaksRESP reports whether a plaintext PING to addr gets a RESP reply
// (+PONG, or an error such as -NOAUTH).
func speaksRESP(ctx context.Context, addr string) bool {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return false
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		conn.SetDeadline(dl)
	}
	if _, err := io.WriteString(conn, "PING\r\n"); err != nil {
		return false
	}
	var b [1]byte
	if _, err := io.ReadFull(conn, b[:]); err != nil {
		return false
	}
	return b[0] == '+' || b[0] == '-'
}
