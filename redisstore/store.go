// Package redisstore is sluice's Redis Store: rate-limit state shared by a
// fleet, each decision made atomically by one Lua script.
//
// It runs on any go-redis v9 redis.UniversalClient: a standalone Client, a
// Sentinel failover client or a ClusterClient. Each algorithm is one script
// in scripts/ (embedded), mirroring the memory store's Go function of the
// same name decision for decision: integer microseconds, exact in Lua's
// doubles. Scripts run by EVALSHA; when the server answers NOSCRIPT (script
// cache flushed, server restarted, failover) the script is loaded again and
// the call retried, so the caller never sees it.
//
// Concurrent calls share round trips: calls that arrive while
// Options.MaxInFlight batches are already on their way wait and leave
// together in the next one, up to Options.MaxBatch calls, as one pipeline.
// On a ClusterClient each master has its own batches and MaxInFlight, so
// a master that stops answering delays no other master's calls.
// Within a batch, the decisions that one script may make together (all of
// them on a standalone or Sentinel client; those whose keys share a hash
// slot on a Cluster) run in one script call, each still exactly as it would
// alone: this roughly halves what Redis spends per decision. A call that
// finds a slot free goes alone at once, so batching adds no latency to a
// quiet Store. Nor to a distant Redis: a call waits for a batch only while
// Redis's round trip (the Store's smoothed measure of its sends) is under
// a quarter of what the call has left of its deadline; otherwise it goes
// at once, beyond MaxInFlight, up to as many calls as the client's
// connection pool holds (PoolSize, or MaxActiveConns if smaller), as with
// batching off. A new connection's first command costs its handshake
// (HELLO, CLIENT SETINFO: about four round trips with the command), more
// than a hurried call's deadline, so when hurried calls take more slots at
// once than since the pool was last known warm, the Store dials one
// connection ahead of them (a PING, outside any caller's deadline, when
// none is idle): a growing load finds one ready.
//
// Time comes from the Redis server (TIME) by default, so clock skew between
// application hosts cannot matter. Options.Clock supplies the caller's time
// instead, for managed services that reject TIME and for tests. A caller
// whose clock is behind state written by another (or TIME after a
// failover) by up to sluice.MaxClockSkew is charged as at that state's
// time, never earlier: the window algorithms charge it in the newer window
// rather than reopen an older one. A window further ahead was counted in
// another Period (the limit changed) and is read as expired.
//
// A take is charged once. Every script call is marked non-retryable, on
// any client, the caller's own included: go-redis would otherwise send a
// command (or a whole pipeline) again after a lost connection or a read
// timeout, when Redis may already have run it. Only answers that mean the
// script did not run are followed or retried: MOVED and ASK (by go-redis),
// NOSCRIPT and TRYAGAIN (here; see ErrResharding). A call whose reply is
// lost fails; its take may have been charged, so it can cost quota, never
// admit extra.
//
// A call (Check, CheckAccess and Membership's included) returns as soon as
// its context ends, whatever the client's own timeouts: it is abandoned,
// not cancelled. An abandoned call's command may
// still reach Redis and be charged, and holds its connection until the
// reply or the client's read timeout; a script call's (a decision's, a
// slot's, a lease's) until the reply or, past what its caller had when it
// called, eight of Redis's round trips (as its answered calls measure it),
// at least twice and at most nine times what the caller had, whichever
// comes first (with ContextTimeoutEnabled; else the read timeout again).
// A reply that is only late thus returns its connection to the pool:
// go-redis closes one whose read a deadline cuts, and a new one costs the
// next call a handshake of several round trips. A Redis that answers
// nothing holds each connection three times its caller's time.
//
// Once a call to a server (a Cluster master) is cut off unanswered, and
// until one is answered, the Store sends that server one batch at a time
// (one unbatched call, with MaxBatch 1): the others wait for it or their
// deadlines, and nothing is dialled ahead. Against a stopped Redis each
// send would otherwise take a connection until its cut, and the next dial
// a new one. See Stalls.
//
// On a ClusterClient, a connection error, or timeouts of one master's
// calls over 500 ms with none of them answered (an isolated timeout on a
// busy host does not count), makes the Store reload the client's slot map
// every ReloadInterval until calls succeed again (or the client is
// closed), so that a failed-over master is left for its promoted
// replica within a reload of the promotion (see OnFailover); go-redis
// itself reloads only on redirects and every ClusterStateReloadInterval.
// The Store also asks a master for the slot map every second, and reloads
// the client's map when they differ, so that a master change that fails
// no call (CLUSTER FAILOVER) is followed, and told, without one.
// Store.Partition names the master that owns a key's slot in that map (a
// sluice.Partitioner), so that package resilient keeps a circuit breaker
// per master.
//
// Keys are laid out as Prefix + "{" + key + "}:" + algorithm code, or, for
// a key with a hash tag ("{t1}:a", "api:{t1}:b"), Prefix + "[" + key + "]:"
// + algorithm code, or, for a key with a "}" but no tag ("user}7"), Prefix
// + "{" + key + "}%:" + algorithm code with the key's "%" and "}" escaped,
// so all of one key's state lives in one Cluster hash slot, keys with a
// common tag share it (TakeAll's atomic path), a key without one is hashed
// whole, and different algorithms never share state. Every key gets a TTL equal to the
// decision's ResetAfter (rounded up to a millisecond): an expired key is
// exactly a fresh one.
package redisstore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/ctxutil"
	"github.com/sluicehq/sluice/internal/holdmax"
	"github.com/sluicehq/sluice/internal/nilclient"
)

var (
	_ sluice.Store       = (*Store)(nil)
	_ sluice.MultiStore  = (*Store)(nil)
	_ sluice.Partitioner = (*Store)(nil) // slot.go
)

var (
	// ErrUnexpectedReply: Redis answered with something the scripts never
	// return, or refused what it found under a sluice key: a value of
	// another type (WRONGTYPE), or state sluice never writes (not an
	// integer below 2^53, NaN, an infinity, a negative count). It points
	// at a version mismatch or a foreign value under a sluice key; the
	// key's calls fail until it is Reset or its TTL ends.
	ErrUnexpectedReply = errors.New("redisstore: unexpected reply")
	// ErrClock: Options.Clock returned a time before 1970, which the
	// sliding window log cannot store.
	ErrClock = errors.New("redisstore: clock before 1970")
	// ErrNoClient: the Store was built with a nil client, or is a zero
	// value. It wraps sluice.ErrStoreNotBuilt.
	ErrNoClient = fmt.Errorf("redisstore: no client: %w", sluice.ErrStoreNotBuilt)
	// ErrInvalidOptions: New was given a negative MaxBatch, MaxInFlight,
	// WaitReplicas, WaitTimeout or ReloadInterval (0 is the default), or a
	// Prefix whose first "{" is followed by "}" (an empty hash tag). The
	// Store then answers every call that would reach Redis with it, as one
	// without a client does, and CheckBuilt reports it, so that the
	// middleware, resilient (as a fallback) and lease refuse it when built.
	// It wraps sluice.ErrStoreNotBuilt.
	ErrInvalidOptions = fmt.Errorf("redisstore: invalid options: %w", sluice.ErrStoreNotBuilt)
	// ErrNotReplicated: Options.WaitReplicas is set and fewer replicas
	// acknowledged a take within Options.WaitTimeout. The take was charged
	// on the master; a failover now could lose it.
	ErrNotReplicated = errors.New("redisstore: take not replicated")
	// ErrWaitUnsupported: Options.WaitReplicas is set on a client other
	// than a Client, a Sentinel failover client or a ClusterClient.
	ErrWaitUnsupported = errors.New("redisstore: WaitReplicas needs a Client, failover client or ClusterClient")
)

// Defaults; see Options.
const (
	DefaultMaxBatch       = 64
	DefaultMaxInFlight    = 2
	DefaultWaitTimeout    = 100 * time.Millisecond
	DefaultReloadInterval = 250 * time.Millisecond
)

// Options configures a Store. A nil *Options gives every default, as does
// 0 for a number or duration; a negative one is refused (ErrInvalidOptions).
type Options struct {
	// Prefix of every Redis key. Default "sluice:". A complete hash tag
	// in it (a "{" with a "}" after it, as in "rl{app}:") decides every
	// key's hash slot in place of the keys' own hash tags. A "{" with no
	// "}" after it in the prefix opens a tag that the stored key closes,
	// so each key's slot then depends on the key (a key's own Redis keys
	// still share one). An empty tag (the first "{" followed by "}", as
	// in "rl{}:") is refused with ErrInvalidOptions, since Redis then
	// hashes each whole key.
	Prefix string
	// Clock, when non-nil, supplies "now" from the caller (for managed Redis
	// that rejects TIME, and for deterministic tests). Nil (the default)
	// means the scripts read Redis's own TIME, so clock skew between
	// application hosts cannot matter.
	//
	// Key TTLs still run on the server's clock, so a caller's clock must not
	// fall behind real time by more than a key's ResetAfter (a fake clock in
	// a test may jump ahead freely).
	//
	// In-flight slots take their deadlines from it too: with callers'
	// clocks up to d apart, a hold written by one caller is swept or kept by
	// another up to d early or late, so every hold is shortened or
	// lengthened by up to d, and Max holds only while d is much smaller than
	// Hold (clocks 2s apart with a 3s hold: slots freed 1s after their
	// acquire, and more than Max held).
	Clock func() time.Time
	// MaxBatch is the most calls one batch carries. Default
	// DefaultMaxBatch; 1 disables batching, so that every call is its own
	// round trip.
	MaxBatch int
	// MaxInFlight is how many batches (each a pipeline on one connection) a
	// Store sends at once before further calls wait to be batched: per
	// master on a ClusterClient (the master that owns the call's key in the
	// client's slot map). A call whose deadline is less than four round
	// trips away does not wait: it goes at once, up to the client's pool
	// size (see the package doc). Default DefaultMaxInFlight. Ignored when
	// MaxBatch is 1.
	MaxInFlight int
	// WaitReplicas, when positive, makes every take wait until that many
	// replicas of its master have acknowledged it (Redis WAIT, on the
	// take's own connection) before it is reported, so that a failover
	// cannot lose a take that a caller acted on. A take that fewer replicas
	// acknowledge within WaitTimeout fails with ErrNotReplicated (it was
	// charged on the master). It costs a replication round trip per take
	// and turns batching off (see BENCHMARKS.md). Default 0: a take is
	// reported once its master has run it, and a failover may lose the
	// takes not yet replicated (docs/redis.md, "When Redis loses writes").
	WaitReplicas int
	// WaitTimeout bounds the wait for WaitReplicas. Default
	// DefaultWaitTimeout.
	WaitTimeout time.Duration
	// ReloadInterval is how often a ClusterClient's slot map is reloaded
	// after connection errors, until calls succeed again. Default
	// DefaultReloadInterval.
	ReloadInterval time.Duration
	// Logger receives one line when a ClusterClient's calls start failing
	// with connection errors (and the Store starts reloading the slot map)
	// and one when they succeed again. Default slog.Default().
	Logger *slog.Logger
	// Dials is the record WatchDials keeps of the client's dials. Given
	// it, the Store notes there the dials it makes to ask whether a Redis
	// that stopped answering still takes connections, so that whoever
	// reads the record (a service's health checks) and the Store's stall
	// log tell one outage alike. Default: a record of the Store's own.
	Dials *Dials
}

// Store is a sluice.Store and sluice.MultiStore on Redis. It is safe for
// concurrent use and holds no rate-limit state of its own: any number of
// Stores, in any number of processes, may share a server. It keeps no
// goroutine running between calls, so it needs no Close. Build one with
// New; the zero value, and a nil *Store, answer every call that would
// reach Redis with ErrNoClient (Keys, SlotKeys and Membership answer as for
// an empty Prefix).
//
// Every call returns an error wrapping ctx.Err() as soon as its context
// ends, whether it is waiting for a batch or on the wire, and never
// success once it has ended; CheckAccess and Membership's calls too. If
// its command was already sent it may still run, as with any Redis call
// that times out.
type Store struct {
	client  redis.UniversalClient
	prefix  string
	clock   func() time.Time
	batch   *batcher // nil: every call on its own
	solo    lane     // without batch: the calls' round trip
	slow    *slowLog
	wait    []any // WAIT's arguments after each take, or nil
	reload  *reloader
	params  atomic.Pointer[map[sluice.Limit]params]
	paramMu sync.Mutex
	young   youngHolders
	// tombLife: how long a release that finds no holder leaves a
	// tombstone (inflight.go).
	tombLife holdmax.Max
	stalls   atomic.Int64 // see Stalls
	closed   atomic.Bool  // the client is closed (noteClosed)
	// shut is closed when closed is set on a Cluster client, waking the
	// calls that wait on it (nil on other clients, which fail at once).
	shut     chan struct{}
	shutOnce sync.Once
	bad      error // New's options were invalid: client is nil
}

// New returns a Store using client. opts may be nil. The Store does not own
// client: closing it is the caller's job.
func New(client redis.UniversalClient, opts *Options) *Store {
	client = nilclient.Or(client)
	s := &Store{client: client, prefix: "sluice:"}
	o := Options{MaxBatch: DefaultMaxBatch, MaxInFlight: DefaultMaxInFlight,
		WaitTimeout: DefaultWaitTimeout, ReloadInterval: DefaultReloadInterval, Logger: slog.Default()}
	if opts != nil {
		if opts.Prefix != "" {
			s.prefix = opts.Prefix
		}
		s.clock = opts.Clock
		s.young.now = opts.Clock
		o.MaxBatch = cmp.Or(max(opts.MaxBatch, 0), o.MaxBatch)
		o.MaxInFlight = cmp.Or(max(opts.MaxInFlight, 0), o.MaxInFlight)
		o.WaitReplicas = opts.WaitReplicas
		o.WaitTimeout = cmp.Or(max(opts.WaitTimeout, 0), o.WaitTimeout)
		o.ReloadInterval = cmp.Or(max(opts.ReloadInterval, 0), o.ReloadInterval)
		o.Logger = cmp.Or(opts.Logger, o.Logger)
		if s.bad = badOptions(opts); s.bad != nil {
			// No call may reach Redis under settings the caller did not ask for.
			s.client, client = nil, nil
		}
	}
	if o.WaitReplicas > 0 {
		// WAIT counts the writes of one connection: each take goes alone.
		s.wait = []any{"wait", o.WaitReplicas, max(1, o.WaitTimeout.Milliseconds())}
		o.MaxBatch = 1
	}
	s.slow = &slowLog{log: o.Logger, rtt: s.RoundTrip}
	dials := o.Dials
	if dials == nil {
		dials = newDials()
	}
	s.solo.stall = &stallLog{log: o.Logger, count: &s.stalls, ask: askScript(client), refuses: dials.refuses(client)}
	s.solo.probe = make(chan struct{}, 1)
	if client != nil && o.MaxBatch > 1 {
		s.batch = newBatcher(client, o.MaxBatch, o.MaxInFlight, dials)
		s.batch.store = s
		s.batch.slow = s.slow
		s.batch.log, s.batch.stalls = o.Logger, &s.stalls
		s.batch.lane.stall = s.batch.stallLog("", askScript(client), dials.refuses(client))
	}
	if cc, ok := client.(*redis.ClusterClient); ok {
		s.reload = &reloader{cluster: cc, every: o.ReloadInterval, log: o.Logger, quit: make(chan struct{}), watching: new(atomic.Bool)}
		s.shut = make(chan struct{})
		// The watch stops once the Store is garbage (or its client closed).
		runtime.AddCleanup(s, func(quit chan struct{}) { close(quit) }, s.reload.quit)
	}
	return s
}

// badOptions names the first negative setting of o, where 0 means the
// default and a negative value was taken for it in silence.
func badOptions(o *Options) error {
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"MaxBatch", int64(o.MaxBatch)},
		{"MaxInFlight", int64(o.MaxInFlight)},
		{"WaitReplicas", int64(o.WaitReplicas)},
		{"WaitTimeout", int64(o.WaitTimeout)},
		{"ReloadInterval", int64(o.ReloadInterval)},
	} {
		if f.v < 0 {
			v := strconv.FormatInt(f.v, 10)
			if f.name == "WaitTimeout" || f.name == "ReloadInterval" {
				v = time.Duration(f.v).String()
			}
			return fmt.Errorf("%w: %s %s is negative (0 means the default)", ErrInvalidOptions, f.name, v)
		}
	}
	// Redis hashes a whole key whose first "{" is followed by "}": a key
	// and its partner keys would land in different slots (CROSSSLOT).
	if i := strings.IndexByte(o.Prefix, '{'); i >= 0 && strings.HasPrefix(o.Prefix[i+1:], "}") {
		return fmt.Errorf("%w: Prefix %q has an empty hash tag (its first \"{\" is followed by \"}\"), so Redis would hash each whole key and split a key from its partner keys", ErrInvalidOptions, o.Prefix)
	}
	return nil
}

// unbuilt is the error of a call that cannot reach Redis: why New left
// the Store without a client.
func (s *Store) unbuilt() error {
	if s != nil && s.bad != nil {
		return s.bad
	}
	return ErrNoClient
}

// Keys returns the Redis keys that hold key's state under l (one today), for
// inspecting TTLs or checking what was written: Prefix + "{" + key + "}:" +
// algorithm code, Prefix + "[" + key + "]:" + code for a key with a hash
// tag, or Prefix + "{" + key + "}%:" + code, its "%" and "}" written "%25"
// and "%7D", for a key with a "}" but no tag. It does not validate.
func (s *Store) Keys(key string, l sluice.Limit) []string {
	if s == nil {
		s = &Store{}
	}
	return []string{s.redisKey(key, l.Algorithm)}
}

func (s *Store) redisKey(key string, a sluice.Algorithm) string {
	suffix := "unknown"
	if a.Valid() {
		suffix = algorithms[a].suffix
	}
	return s.keyOf(key, suffix)
}

// keyOf returns the Redis key of key's state named by suffix: an
// algorithm's code, that code + "-reset" (resetKey), "if2" or "if2r" (the
// in-flight keys). Every Redis key built from a caller's key is built here.
//
// A key with a hash tag (tagOf) is stored as Prefix + "[" + key + "]:" +
// suffix. With no "{" in Prefix, the key's own first "{", next "}" and the
// tag between them are then the Redis key's, so Redis hashes exactly that
// tag and related keys ("api:{t1}:a", "{t1}:b") share a slot. A key with a
// "}" but no tag ("user}7", "{}x") is stored as Prefix + "{" + escaped +
// "}%:" + suffix, its "%" and "}" written "%25" and "%7D": in the old
// layout its own first "}" ended the tag, so every "user}…" key hashed
// "user" (one slot, one master), and one starting "}" an empty tag (each
// suffix in a slot of its own). Any other key keeps the layout of earlier
// versions, Prefix + "{" + key + "}:" + suffix, and so its stored state.
// (Prefix + "{" + tag + "}" + key would not do for tagged keys: "{a}"
// would give "{a}{a}:S", the old layout of the untagged "a}{a".)
//
// No two (key, suffix) pairs share a Redis key: no suffix holds ':', so
// the suffix is the text after the last ':'; the byte after Prefix ('{' or
// '[') and the one before ":" + suffix ('}', ']' or '%') tell the layout;
// and key is what lies between them (unescaped, in the '%' layout).
// So no key meets another's, nor any key of the old layout but its own
// (all begin Prefix + "{" and end "}:" + suffix), nor the registry's
// Prefix + "{fleet}" and "{fleet}:left" or Prefix + "check".
// TestKeyLayoutInjective enumerates it.
func (s *Store) keyOf(key, suffix string) string {
	if _, ok := tagOf(key); ok {
		return s.prefix + "[" + key + "]:" + suffix
	}
	if strings.IndexByte(key, '}') >= 0 {
		return s.prefix + "{" + tagEscaper.Replace(key) + "}%:" + suffix
	}
	return s.prefix + "{" + key + "}:" + suffix
}

// tagEscaper writes a key with a "}" but no tag as a hash tag: Redis
// hashes all of it, and no two keys give one text.
var tagEscaper = strings.NewReplacer("%", "%25", "}", "%7D")

// now returns the script's now argument: µs from the caller's clock, or ""
// for the server's TIME.
func (s *Store) now() (any, error) {
	if s == nil || s.client == nil {
		return nil, s.unbuilt()
	}
	if s.clock == nil {
		return "", nil
	}
	us := s.clock().UnixMicro()
	if us < 0 {
		return nil, fmt.Errorf("%w: %v", ErrClock, s.clock())
	}
	return us, nil
}

const (
	modeTake   = "take"
	modePeek   = "peek"
	modeRefund = "refund"
)

// modeArg boxes mode without allocating: a constant converts to an
// interface for free, a string variable does not.
func modeArg(mode string) any {
	switch mode {
	case modeTake:
		return modeTake
	case modePeek:
		return modePeek
	default:
		return modeRefund
	}
}

// params are a limit's two script parameters (each script's ARGV[3] and
// ARGV[4]), formatted and boxed once per Limit: interval and span for GCRA,
// interval and capacity for the buckets, period and rate for the windows.
type params [2]any

// maxCachedLimits bounds the per-Store cache of params; limits beyond it
// are formatted on every call.
const maxCachedLimits = 1024

func (s *Store) paramsOf(l sluice.Limit) params {
	if m := s.params.Load(); m != nil {
		if p, ok := (*m)[l]; ok {
			return p
		}
	}
	a, b := algorithms[l.Algorithm].params(l)
	p := params{strconv.FormatInt(a, 10), strconv.FormatInt(b, 10)}
	// Copy on write: readers never lock, and limits are few.
	s.paramMu.Lock()
	defer s.paramMu.Unlock()
	old := s.params.Load()
	if old == nil || len(*old) < maxCachedLimits {
		m := make(map[sluice.Limit]params, 1+len(deref(old)))
		for k, v := range deref(old) {
			m[k] = v
		}
		m[l] = p
		s.params.Store(&m)
	}
	return p
}

func deref(m *map[sluice.Limit]params) map[sluice.Limit]params {
	if m == nil {
		return nil
	}
	return *m
}

// Take implements sluice.Store.
func (s *Store) Take(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	r, err := s.decide(ctx, modeTake, key, limit, cost)
	if err != nil {
		return sluice.Decision{}, err
	}
	return r.decision(limit), nil
}

// Peek implements sluice.Store. It writes nothing.
func (s *Store) Peek(ctx context.Context, key string, limit sluice.Limit, cost int64) (sluice.Decision, error) {
	r, err := s.decide(ctx, modePeek, key, limit, cost)
	if err != nil {
		return sluice.Decision{}, err
	}
	return r.decision(limit), nil
}

// Reset implements sluice.Store: it deletes the key's state under limit's
// algorithm.
func (s *Store) Reset(ctx context.Context, key string, limit sluice.Limit) error {
	if err := sluice.ValidateKey(key); err != nil {
		return err
	}
	if err := limit.Validate(); err != nil {
		return err
	}
	if s == nil || s.client == nil {
		return s.unbuilt()
	}
	ctx = ctxutil.OrBackground(ctx)
	if limit.Algorithm != sluice.SlidingWindowLog {
		// A new epoch, so that a lease granted before the Reset cannot
		// return units into the key as it is after (sluice.Granter).
		now, err := s.now()
		if err != nil {
			return fmt.Errorf("redisstore: reset: %w", err)
		}
		c := &call{script: resetScript, alg: -1, args: []any{"evalsha", resetScript.sha, "2", s.redisKey(key, limit.Algorithm), s.resetKey(key, limit.Algorithm), now, horizonMS(limit)}}
		if _, err := s.run(ctx, c); err != nil {
			return fmt.Errorf("redisstore: reset: %w", err)
		}
		return nil
	}
	if s.closed.Load() {
		return fmt.Errorf("redisstore: reset: %w", replyErr(redis.ErrClosed))
	}
	if err := s.reload.awaitMap(ctx); err != nil {
		return fmt.Errorf("redisstore: reset: %w", err)
	}
	rkey := s.redisKey(key, limit.Algorithm)
	del := keyed(redis.NewIntCmd(ctx, "del", rkey))
	del.SetFirstKeyPos(1)
	var err error
	if berr := bounded(ctx, s.shut, make(chan struct{}, 1), func() {
		err = s.client.Process(ctx, intCmd{del, s})
	}); berr != nil {
		err = berr
	}
	if err != nil {
		return fmt.Errorf("redisstore: reset: %w", s.failed(rkey, err))
	}
	return nil
}

// decide runs the algorithm's script in take or peek mode.
func (s *Store) decide(ctx context.Context, mode, key string, l sluice.Limit, cost int64) (result, error) {
	if err := sluice.ValidateRequest(key, l, cost); err != nil {
		return result{}, err
	}
	now, err := s.now()
	if err != nil {
		return result{}, err
	}
	c := s.oneKey(mode, key, l, now, cost)
	defer c.recycle()
	v, err := s.run(ctx, c)
	if err != nil {
		return result{}, fmt.Errorf("redisstore: %v %s: %w", l.Algorithm, mode, err)
	}
	r, err := parseResult(v, algorithms[l.Algorithm].reply)
	if err != nil {
		return result{}, fmt.Errorf("redisstore: %v %s: %w", l.Algorithm, mode, err)
	}
	return r, nil
}

// oneKey builds the call of an algorithm's one-key script: ARGV is now,
// mode, the limit's two parameters and the cost (see scripts/*.lua).
func (s *Store) oneKey(mode, key string, l sluice.Limit, now any, cost int64) *call {
	sc := algorithms[l.Algorithm].script
	p := s.paramsOf(l)
	c := calls.Get().(*call)
	c.script, c.alg = sc, int64(l.Algorithm)
	c.argv = [...]any{"evalsha", sc.sha, "1", s.redisKey(key, l.Algorithm), now, modeArg(mode), p[0], p[1], cost, nil}
	c.args = c.argv[:argToken]
	return c
}

// refund gives back the cost units a take (reported as r) took.
func (s *Store) refund(ctx context.Context, req sluice.Request, r result) error {
	now, err := s.now()
	if err != nil {
		return err
	}
	c := s.oneKey(modeRefund, req.Key, req.Limit, now, req.Cost)
	defer c.recycle()
	c.argv[argToken] = r.token
	c.args = c.argv[:argToken+1]
	if _, err := s.run(ctx, c); err != nil {
		return fmt.Errorf("redisstore: %v refund: %w", req.Limit.Algorithm, err)
	}
	return nil
}

// sendAlone is sendContext for a call sent on its own, unbatched, whose
// caller had budget when it called (not after a wait at the gate: the send
// would be cut off at once, and its new connection with it); it writes
// slowLog's line for a hurried one too.
func (s *Store) sendAlone(ctx context.Context, budget time.Duration) (context.Context, context.CancelFunc) {
	if s.solo.hurried(budget) {
		s.slow.hurried(budget)
	}
	return sendContext(ctx, budget, s.solo.answeredRTT())
}

// answeredRTT is Redis's round trip over the answered sends of the
// Store's lanes (the first on a Cluster), for a send outside them.
func (s *Store) answeredRTT() time.Duration {
	rtt := s.solo.answeredRTT()
	if s.batch != nil {
		rtt = max(rtt, s.batch.lane.answeredRTT())
	}
	return rtt
}

// run sends c, batched or on its own, and returns its reply, or ctx.Err()
// as soon as ctx ends.
func (s *Store) run(ctx context.Context, c *call) ([]int64, error) {
	ctx = ctxutil.OrBackground(ctx)
	if err := ctx.Err(); err != nil {
		return nil, err // never sent
	}
	if s.closed.Load() {
		return nil, replyErr(redis.ErrClosed)
	}
	if err := s.reload.awaitMap(ctx); err != nil {
		return nil, s.failed(c.callKey(), err) // never sent
	}
	var err error
	var retry tryAgain
	for {
		switch {
		case s.batch != nil:
			err = s.batch.do(ctx, c)
		case s.wait != nil && c.takes():
			budget := budgetOf(ctx)
			var sent func()
			if sent, err = s.solo.gate(ctx); err == nil {
				err = c.await(ctx, s.shut, func() {
					sctx, cancel := s.sendAlone(ctx, budget)
					s.runWaited(sctx, c)
					s.solo.seen(0, c.err)
					cancel()
					sent()
				})
			}
		default:
			budget := budgetOf(ctx)
			var sent func()
			if sent, err = s.solo.gate(ctx); err == nil {
				err = c.await(ctx, s.shut, func() {
					sctx, cancel := s.sendAlone(ctx, budget)
					start := time.Now()
					runOne(sctx, s.client, s, c)
					s.solo.observe(time.Since(start), c.err)
					cancel()
					sent()
				})
			}
		}
		if err != nil || !retry.again(ctx, c) {
			break
		}
	}
	if err := s.settle(ctx, c, err); err != nil {
		return nil, err
	}
	return c.val, nil
}

// settle is the outcome of c, sent on ctx: err, the send's own (the
// caller stopped waiting), or c's reply's.
func (s *Store) settle(ctx context.Context, c *call, err error) error {
	if err == nil {
		err = atEnd(ctx, c.err)
	}
	if err == nil {
		// A reply that came as ctx ended, its waiter woken late: the
		// command runs past its caller's deadline now.
		err = ended(ctx)
	}
	if err != nil {
		return s.failed(c.callKey(), err)
	}
	s.reload.succeeded(c.callKey())
	return nil
}

// runAll sends cs, calls independent of one another, together: with
// batching, each lane's (each master's) as one batch, the lanes side by
// side (batcher.doAll); without, each on its own, side by side. It
// returns each call's error, as run would; each call's reply is in its
// val. Each is sent once, but for the answers that mean it did not run
// (see run).
func (s *Store) runAll(ctx context.Context, cs []*call) []error {
	errs := make([]error, len(cs))
	if s.batch == nil || len(cs) < 2 {
		var wg sync.WaitGroup
		for i, c := range cs {
			wg.Go(func() { _, errs[i] = s.run(ctx, c) })
		}
		wg.Wait()
		return errs
	}
	ctx = ctxutil.OrBackground(ctx)
	var early error
	switch {
	case ctx.Err() != nil:
		early = ctx.Err() // never sent
	case s.closed.Load():
		early = replyErr(redis.ErrClosed)
	default:
		if err := s.reload.awaitMap(ctx); err != nil {
			for i, c := range cs {
				errs[i] = s.failed(c.callKey(), err) // never sent
			}
			return errs
		}
	}
	if early != nil {
		for i := range errs {
			errs[i] = early
		}
		return errs
	}
	sent := s.batch.doAll(ctx, cs)
	var wg sync.WaitGroup
	for i, c := range cs {
		if sent[i] == nil && isTryAgain(c.err) {
			// Not run (a slot in migration): sent again alone, as run
			// sends it, after its backoff.
			wg.Go(func() {
				var retry tryAgain
				if !retry.again(ctx, c) {
					errs[i] = s.settle(ctx, c, nil)
					return
				}
				_, errs[i] = s.run(ctx, c)
			})
			continue
		}
		errs[i] = s.settle(ctx, c, sent[i])
	}
	wg.Wait()
	return errs
}
