package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/redisstore"
	"github.com/sluicehq/sluice/resilient"
)

// ErrRedisURL is wrapped by errors about the --redis URL.
var ErrRedisURL = errors.New("server: invalid redis URL")

// clusterReloadInterval is how often a cluster client that NewRedisClient
// builds reloads its slot map.
const clusterReloadInterval = 2 * time.Second

// storeURLOptions takes the Redis store's own options out of a --redis URL,
// leaving go-redis's: wait_replicas=N makes every take wait until N
// replicas have it (Redis WAIT, so that a failover cannot lose it), and
// wait_timeout=D bounds that wait (redisstore.Options.WaitReplicas and
// WaitTimeout).
func storeURLOptions(rawURL string) (string, redisstore.Options, error) {
	var o redisstore.Options
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", o, fmt.Errorf("%w: %v", ErrRedisURL, redactErr(err, rawURL))
	}
	q := u.Query()
	if v := q.Get("wait_replicas"); v != "" {
		if o.WaitReplicas, err = strconv.Atoi(v); err != nil || o.WaitReplicas < 0 {
			return "", o, fmt.Errorf("%w: wait_replicas=%q: want a whole number of replicas, 0 or more", ErrRedisURL, v)
		}
	}
	if v := q.Get("wait_timeout"); v != "" {
		if o.WaitTimeout, err = time.ParseDuration(v); err != nil || o.WaitTimeout <= 0 {
			return "", o, fmt.Errorf("%w: wait_timeout=%q: want a positive duration such as 50ms", ErrRedisURL, v)
		}
	}
	q.Del("wait_replicas")
	q.Del("wait_timeout")
	u.RawQuery = q.Encode()
	return u.String(), o, nil
}

// NewRedisClient connects to the Redis that rawURL names:
//
//	redis://[user:password@]host:port[/db]             standalone
//	rediss://...                                       the same over TLS
//	redis+cluster://host:port?addr=host2:port2&...     Redis Cluster (seed nodes)
//	redis+sentinel://host:port?master_name=mymaster    Sentinel (rediss+sentinel: TLS)
//
// The user and password before the host are Redis's in every form; a
// Sentinel URL gives the Sentinels' own, if they need one, as
// sentinel_username= and sentinel_password=.
//
// A plain redis:// URL with master_name= is a Sentinel setup; addr= on it
// is refused (redis+cluster:// says cluster). Other query parameters are
// go-redis options (dial_timeout=3s, pool_size=50...): negative numbers
// and durations, and a client_name Redis would refuse, are errors.
func NewRedisClient(rawURL string) (redis.UniversalClient, error) {
	return newRedisClient(rawURL, 0, nil)
}

// checkRedisURL reports whether rawURL is a --redis URL NewRedisClient and
// the store accept, without connecting.
func checkRedisURL(rawURL string) error {
	rest, _, err := storeURLOptions(rawURL)
	if err != nil {
		return err
	}
	c, err := newRedisClient(rest, 0, nil)
	if err != nil {
		return err
	}
	return c.Close()
}

// redisDefaultTimeout is go-redis's dial, read and write timeout when the
// URL sets none.
const redisDefaultTimeout = 5 * time.Second

// coverTimeout raises the dial, read and write timeouts the URL left unset
// to at least d: go-redis cuts a call at the earlier of them and the
// context's deadline, so a longer decision timeout would end at 5s.
func coverTimeout(d time.Duration, timeouts ...*time.Duration) {
	for _, t := range timeouts {
		if *t == 0 && d > redisDefaultTimeout {
			*t = d
		}
	}
}

// newRedisClient is NewRedisClient whose timeouts the URL does not set
// last at least the decision timeout d. A Sentinel client's options are
// given to follow, when not nil, before the client is built from them
// (redisstore.FollowSentinels).
func newRedisClient(rawURL string, d time.Duration, follow func(*redis.FailoverOptions)) (redis.UniversalClient, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRedisURL, redactErr(err, rawURL))
	}
	base, variant, _ := strings.Cut(u.Scheme, "+")
	if base != "redis" && base != "rediss" {
		return nil, fmt.Errorf("%w: scheme %q: want redis, rediss, redis+cluster or redis+sentinel", ErrRedisURL, u.Scheme)
	}
	u.Scheme = base
	q := u.Query()
	if err := checkURLOptions(u, variant, q); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrRedisURL, err)
	}
	switch {
	case isSentinel(variant, q):
		o, err := failoverOptions(u)
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrRedisURL, redactErr(err, rawURL))
		}
		o.ContextTimeoutEnabled = true
		coverTimeout(d, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout)
		if follow != nil {
			follow(o)
		}
		return redis.NewFailoverClient(o), nil
	case variant == "cluster" || (variant == "" && q.Has("addr")):
		o, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrRedisURL, redactErr(err, rawURL))
		}
		o.ContextTimeoutEnabled = true
		coverTimeout(d, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout)
		if o.ClusterStateReloadInterval == 0 {
			// A slot map at most this old: the store also reloads it on
			// connection errors, but only a reload finds a failover that
			// caused none (go-redis's default is 60 s).
			o.ClusterStateReloadInterval = clusterReloadInterval
		}
		return redis.NewClusterClient(o), nil
	case variant == "":
		o, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrRedisURL, redactErr(err, rawURL))
		}
		o.ContextTimeoutEnabled = true // the failure policy's timeout must stop the call
		coverTimeout(d, &o.DialTimeout, &o.ReadTimeout, &o.WriteTimeout)
		return redis.NewClient(o), nil
	}
	return nil, fmt.Errorf("%w: scheme %q: want redis, rediss, redis+cluster or redis+sentinel", ErrRedisURL, u.Scheme+"+"+variant)
}

// isSentinel reports whether a --redis URL of that scheme variant and
// query names a Sentinel setup: redis+sentinel://, or redis:// with
// master_name=.
func isSentinel(variant string, q url.Values) bool {
	return variant == "sentinel" || (variant == "" && q.Has("master_name"))
}

// URL options go-redis reads as durations and as whole numbers. It takes a
// duration of 0 or less to mean none (a dial_timeout of -1s fails every
// dial) and a negative size as given (a negative pool_size panics).
var (
	urlDurations = []string{"dial_timeout", "read_timeout", "write_timeout", "pool_timeout", "min_retry_backoff", "max_retry_backoff",
		"conn_max_idle_time", "idle_timeout", "conn_max_lifetime", "max_conn_age", "conn_max_lifetime_jitter",
		"route_by_latency_tolerance", "dialer_retry_timeout"}
	urlInts = []string{"pool_size", "min_idle_conns", "max_idle_conns", "max_active_conns", "max_concurrent_dials", "max_retries",
		"max_redirects", "dialer_retries", "pipeline_pool_size", "pipeline_read_buffer_size", "pipeline_write_buffer_size",
		"failing_timeout_seconds", "protocol"}
	// urlNone are the whole-number options whose -1 go-redis reads as none
	// (pipeline_pool_size=-1: pipelines share the main pool, so a client
	// opens at most pool_size connections to a server).
	urlNone = []string{"max_retries", "max_redirects", "pipeline_pool_size"}
)

// maxURLInt bounds the whole-number options: go-redis sizes channels and
// buffers by them.
const maxURLInt = 1 << 20

// checkURLOptions refuses what go-redis would take without complaint and
// then fail on, forever or at once: a negative number or duration, a
// client name Redis refuses, addr= on a standalone URL (go-redis would make
// it a cluster client), a URL without a host, a list of hosts in one URL
// (go-redis looks the whole list up as one name, forever).
func checkURLOptions(u *url.URL, variant string, q url.Values) error {
	if u.Hostname() == "" {
		return fmt.Errorf("no host: want %s://host:port", u.Scheme)
	}
	if strings.Contains(u.Host, ",") {
		hosts := strings.Split(u.Host, ",")
		others := "?addr=" + strings.Join(hosts[1:], "&addr=")
		if variant == "" {
			// Not "use ?addr=": a redis:// URL refuses it, naming cluster.
			return fmt.Errorf("host %q is a list: a %s:// URL names one Redis; for Redis Cluster use %s+cluster://%s%s, for Sentinel %s+sentinel://%s%s&master_name=NAME",
				u.Host, u.Scheme, u.Scheme, hosts[0], others, u.Scheme, hosts[0], others)
		}
		return fmt.Errorf("host %q is a list: name one host:port, and the others with %s+%s://%s%s", u.Host, u.Scheme, variant, hosts[0], others)
	}
	if variant == "" && q.Has("addr") {
		return errors.New("addr= on a redis:// URL: for Redis Cluster use redis+cluster://host:port?addr=host2:port2")
	}
	for _, name := range urlDurations {
		for _, v := range q[name] {
			d, err := time.ParseDuration(v)
			if n, ierr := strconv.Atoi(v); ierr == nil { // go-redis reads a bare number as seconds
				d, err = time.Duration(n)*time.Second, nil
			}
			if err != nil || d <= 0 {
				return fmt.Errorf("%s=%q: want a positive duration such as 3s", name, v)
			}
		}
	}
	for _, name := range urlInts {
		for _, v := range q[name] {
			n, err := strconv.Atoi(v)
			if err == nil && n == -1 && slices.Contains(urlNone, name) {
				continue
			}
			if err != nil || n < 0 || n > maxURLInt {
				want := fmt.Sprintf("want a whole number from 0 to %d", maxURLInt)
				if slices.Contains(urlNone, name) {
					want += " (or -1 for none)"
				}
				return fmt.Errorf("%s=%q: %s", name, v, want)
			}
		}
	}
	for _, v := range q["client_name"] {
		for _, c := range []byte(v) {
			if c <= ' ' || c >= 0x7f {
				return fmt.Errorf("client_name=%q: Redis takes printable ASCII without spaces", v)
			}
		}
	}
	return nil
}

// failoverOptions reads a Sentinel URL whose scheme is redis or rediss.
// Its user and password are Redis's, as in every other form of the URL
// (go-redis would give them to the Sentinels instead, and leave Redis
// without them); Sentinels that require a password of their own take
// sentinel_username= and sentinel_password=.
func failoverOptions(u *url.URL) (*redis.FailoverOptions, error) {
	q := u.Query()
	if !q.Has("master_name") {
		return nil, errors.New("sentinel URL needs master_name=")
	}
	if u.User != nil && (q.Has("username") || q.Has("password")) {
		return nil, errors.New("the user or password for Redis both before the host and in username= or password=: give them once, before the host (the Sentinels' own go in sentinel_username= and sentinel_password=)")
	}
	sentinelUser, sentinelPass := q.Get("sentinel_username"), q.Get("sentinel_password")
	q.Del("sentinel_username")
	q.Del("sentinel_password")
	c := *u
	c.User, c.RawQuery = nil, q.Encode()
	o, err := redis.ParseFailoverURL(c.String())
	if err != nil {
		return nil, err
	}
	if u.User != nil {
		o.Username = u.User.Username()
		o.Password, _ = u.User.Password()
	}
	o.SentinelUsername, o.SentinelPassword = sentinelUser, sentinelPass
	return o, nil
}

// redactErr keeps a password out of error messages.
func redactErr(err error, rawURL string) string {
	msg := err.Error()
	// The raw password, found by hand: a URL that fails to parse is quoted
	// whole in the parse error.
	if _, rest, ok := strings.Cut(rawURL, "://"); ok {
		if end := strings.IndexAny(rest, "/?#"); end >= 0 {
			rest = rest[:end]
		}
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if _, pw, ok := strings.Cut(rest[:at], ":"); ok && pw != "" {
				msg = strings.ReplaceAll(msg, pw, "xxxxx")
			}
		}
	}
	if u, perr := url.Parse(rawURL); perr == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}

// ParseFailurePolicy reads --failure-policy: "error" (no failure policy:
// a Redis failure is reported, as gRPC UNAVAILABLE so that Envoy applies
// its own failure_mode_deny, and as HTTP 503), or one of package
// resilient's: "local" (the default: a memory store enforces the same
// limits in this process until Redis is back), "open" or "closed". ok is
// false for "error".
func ParseFailurePolicy(s string) (p resilient.Policy, ok bool, err error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "error", "none":
		return 0, false, nil
	case "":
		return resilient.FallbackLocal, true, nil
	}
	p, err = resilient.ParsePolicy(s)
	if err != nil {
		return 0, false, fmt.Errorf("server: failure policy %q: want error, local, open or closed: %w", s, resilient.ErrUnknownPolicy)
	}
	return p, true, nil
}

// budgetMargin is how long before a gRPC call's deadline its store budget
// ends: time for the failure policy to answer and the reply to travel.
const budgetMargin = 5 * time.Millisecond

// budgetKey is the context key of a call's store budget: the instant by
// which the store must have answered (see withBudget).
type budgetKey struct{}

// withBudget returns ctx without its deadline, carrying instead a store
// budget ending at end, which budgetStore enforces below the failure
// policy. The caller's deadline would end the call with
// DEADLINE_EXCEEDED before the policy could answer (Envoy's default
// timeout, 20ms, is below the decision timeout); the budget makes Redis
// fail first, so the policy answers in time. Cancellation still reaches the
// call.
func withBudget(ctx context.Context, end time.Time) (context.Context, context.CancelFunc) {
	bctx, cancel := context.WithCancel(context.WithValue(context.WithoutCancel(ctx), budgetKey{}, end))
	stop := context.AfterFunc(ctx, func() {
		if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			cancel()
		}
	})
	return bctx, func() { stop(); cancel() }
}

// budgetStore bounds every call of the Redis store by the call's budget
// (withBudget) and, when d > 0, by d. Without a failure policy d is the
// decision timeout, so that a stalled Redis costs a request at most d and
// the error goes to the caller (UNAVAILABLE for Envoy, 503 for the JSON
// API). Under a failure policy d is 0: the policy's own timeout applies,
// and the budget makes Redis fail sooner when the caller's deadline is
// nearer, so that the policy still answers.
type budgetStore struct {
	*redisstore.Store
	d time.Duration
}

func (s budgetStore) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	end, ok := ctx.Value(budgetKey{}).(time.Time)
	if s.d > 0 && (!ok || time.Until(end) > s.d) {
		end, ok = time.Now().Add(s.d), true
	}
	if !ok {
		return ctx, func() {}
	}
	return context.WithDeadline(ctx, end)
}

func (s budgetStore) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.Store.Take(ctx, key, l, cost)
}

func (s budgetStore) Peek(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.Store.Peek(ctx, key, l, cost)
}

func (s budgetStore) Reset(ctx context.Context, key string, l sluice.Limit) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.Store.Reset(ctx, key, l)
}

func (s budgetStore) Grant(ctx context.Context, key string, l sluice.Limit, n int64) (sluice.Grant, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.Store.Grant(ctx, key, l, n)
}

func (s budgetStore) Return(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused int64) (int64, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.Store.Return(ctx, key, l, g, unused)
}

func (s budgetStore) Regrant(ctx context.Context, key string, l sluice.Limit, g sluice.Grant, unused, n int64) (int64, sluice.Grant, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.Store.Regrant(ctx, key, l, g, unused, n)
}

func (s budgetStore) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.Store.TakeAll(ctx, reqs)
}

// defaultRedisHz is Redis's hz, assumed when INFO does not answer.
const defaultRedisHz = 10

// checkWait warns at start about wait_replicas settings that cannot work
// as meant. Redis ends a WAIT that too few replicas acknowledge only on a
// tick of its timer (1/hz: 100ms at the default hz 10), so a wait_timeout
// that, with a tick, does not fit in the decision timeout makes a missing
// replica look like a Redis timeout (ErrNotReplicated never comes); and a
// master with fewer connected replicas than wait_replicas fails every take.
func (s *Server) checkWait(c redis.UniversalClient, o redisstore.Options) {
	if o.WaitReplicas <= 0 {
		return
	}
	wait := cmp.Or(o.WaitTimeout, redisstore.DefaultWaitTimeout)
	decision := cmp.Or(s.opts.DecisionTimeout, resilient.DefaultTimeout)
	ctx, cancel := context.WithTimeout(context.Background(), startCheckTimeout)
	defer cancel()
	hz, replicas, err := redisReplication(ctx, c)
	if err != nil {
		hz = defaultRedisHz
	}
	tick := time.Second / time.Duration(max(hz, 1))
	if wait+tick > decision {
		s.log.Warn("wait_timeout plus Redis's timer tick exceeds --decision-timeout: a take too few replicas acknowledge times out instead of failing as not replicated, so every decision falls to the failure policy; raise --decision-timeout, or lower wait_timeout (and raise Redis's hz)",
			"wait_timeout", wait, "redis_tick", tick, "redis_hz", hz, "decision_timeout", decision, "want_decision_timeout_at_least", wait+tick)
	}
	if err == nil && replicas < o.WaitReplicas {
		s.log.Warn("Redis has fewer connected replicas than wait_replicas: every take fails as not replicated until they connect",
			"wait_replicas", o.WaitReplicas, "connected_replicas", replicas)
	}
}

// redisReplication reads hz and the connected replicas from INFO, the
// smallest among a Cluster's masters.
func redisReplication(ctx context.Context, c redis.UniversalClient) (hz, replicas int, err error) {
	read := func(ctx context.Context, node redis.UniversalClient) (int, int, error) {
		info, err := node.Info(ctx, "server", "replication").Result()
		if err != nil {
			return 0, 0, err
		}
		f := map[string]string{}
		for line := range strings.Lines(info) {
			if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
				f[k] = v
			}
		}
		hz, err1 := strconv.Atoi(f["hz"])
		n, err2 := strconv.Atoi(f["connected_slaves"])
		if err := errors.Join(err1, err2); err != nil {
			return 0, 0, fmt.Errorf("INFO: %w", err)
		}
		return hz, n, nil
	}
	cc, ok := c.(*redis.ClusterClient)
	if !ok {
		return read(ctx, c)
	}
	var mu sync.Mutex
	hz, replicas = 0, math.MaxInt
	err = cc.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
		h, n, err := read(ctx, node)
		mu.Lock()
		defer mu.Unlock()
		hz, replicas = max(hz, h), min(replicas, n)
		return err
	})
	return hz, replicas, err
}
