package server

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"sluice"
	"sluice/memory"
)

// ErrRedisURL is wrapped by errors about the --redis URL.
var ErrRedisURL = errors.New("server: invalid redis URL")

// NewRedisClient connects to the Redis that rawURL names:
//
//	redis://[user:password@]host:port[/db]             standalone
//	rediss://...                                       the same over TLS
//	redis+cluster://host:port?addr=host2:port2&...     Redis Cluster (seed nodes)
//	redis+sentinel://host:port?master_name=mymaster    Sentinel (rediss+sentinel: TLS)
//
// A plain redis:// URL with addr= parameters is a cluster, and one with
// master_name= a Sentinel setup. Other query parameters are go-redis
// options (dial_timeout=3s, pool_size=50...).
func NewRedisClient(rawURL string) (redis.UniversalClient, error) {
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
	switch {
	case variant == "sentinel" || (variant == "" && q.Has("master_name")):
		if !q.Has("master_name") {
			return nil, fmt.Errorf("%w: sentinel URL needs master_name=", ErrRedisURL)
		}
		o, err := redis.ParseFailoverURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrRedisURL, redactErr(err, rawURL))
		}
		return redis.NewFailoverClient(o), nil
	case variant == "cluster" || (variant == "" && q.Has("addr")):
		o, err := redis.ParseClusterURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrRedisURL, redactErr(err, rawURL))
		}
		return redis.NewClusterClient(o), nil
	case variant == "":
		o, err := redis.ParseURL(u.String())
		if err != nil {
			return nil, fmt.Errorf("%w: %v", ErrRedisURL, redactErr(err, rawURL))
		}
		return redis.NewClient(o), nil
	}
	return nil, fmt.Errorf("%w: scheme %q: want redis, rediss, redis+cluster or redis+sentinel", ErrRedisURL, u.Scheme+"+"+variant)
}

// redactErr keeps a password out of error messages.
func redactErr(err error, rawURL string) string {
	msg := err.Error()
	if u, perr := url.Parse(rawURL); perr == nil && u.User != nil {
		if p, ok := u.User.Password(); ok && p != "" {
			msg = strings.ReplaceAll(msg, p, "xxxxx")
		}
	}
	return msg
}

// FailurePolicy is what the service does when the store fails.
type FailurePolicy string

const (
	// FailError reports the failure: gRPC UNAVAILABLE (Envoy then applies
	// its own failure_mode_deny) and HTTP 503.
	FailError FailurePolicy = "error"
	// FailOpen allows requests while the store fails.
	FailOpen FailurePolicy = "open"
	// FailClosed denies requests while the store fails.
	FailClosed FailurePolicy = "closed"
	// FailLocal decides with an in-process memory store, enforcing the
	// same limits per instance, until the store answers again.
	FailLocal FailurePolicy = "local"
)

// ParseFailurePolicy reads "error", "open", "closed" or "local" (also
// "fail-open", "fail-closed", "fallback").
func ParseFailurePolicy(s string) (FailurePolicy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "", "error":
		return FailError, nil
	case "open", "fail-open", "fail_open":
		return FailOpen, nil
	case "closed", "fail-closed", "fail_closed":
		return FailClosed, nil
	case "local", "fallback", "local-fallback":
		return FailLocal, nil
	}
	return "", fmt.Errorf("server: failure policy %q: want error, open, closed or local", s)
}

// failover applies a FailurePolicy around a primary store, with a bound
// on how long one decision may wait for it.
type failover struct {
	primary sluice.Store
	multi   sluice.MultiStore
	policy  FailurePolicy
	timeout time.Duration
	local   *memory.Store
	localMu sync.RWMutex // all-or-nothing on the local store: TakeAll holds it exclusively
	metrics *Metrics
	active  atomic.Bool
}

var _ sluice.MultiStore = (*failover)(nil)

func newFailover(primary sluice.Store, policy FailurePolicy, timeout time.Duration, m *Metrics) *failover {
	f := &failover{primary: primary, policy: policy, timeout: timeout, metrics: m}
	f.multi, _ = primary.(sluice.MultiStore)
	if policy == FailLocal {
		f.local = memory.New(nil)
	}
	return f
}

func (f *failover) Close() {
	if f.local != nil {
		f.local.Close()
	}
}

// failed reports whether err is a store failure the policy should absorb
// (bad input is returned as is), and records the state.
func (f *failover) failed(err error) bool {
	if err == nil {
		if f.active.CompareAndSwap(true, false) {
			f.metrics.SetFallback(false)
		}
		return false
	}
	if f.policy == FailError || isInputError(err) {
		return false
	}
	if f.active.CompareAndSwap(false, true) {
		f.metrics.SetFallback(true)
	}
	return true
}

func isInputError(err error) bool {
	return errors.Is(err, sluice.ErrInvalidKey) || errors.Is(err, sluice.ErrInvalidLimit) ||
		errors.Is(err, sluice.ErrInvalidCost) || errors.Is(err, sluice.ErrCostExceedsBurst)
}

func (f *failover) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	if f.timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, f.timeout)
}

func (f *failover) verdict(ctx context.Context, key string, l sluice.Limit, cost int64, take bool) (sluice.Decision, error) {
	switch f.policy {
	case FailOpen:
		return sluice.Decision{Allowed: true, Limit: l, Remaining: max(l.Capacity()-cost, 0)}, nil
	case FailClosed:
		return sluice.Decision{Limit: l, RetryAfter: time.Second, ResetAfter: time.Second}, nil
	}
	if take {
		f.localMu.RLock()
		defer f.localMu.RUnlock()
		return f.local.Take(ctx, key, l, cost)
	}
	return f.local.Peek(ctx, key, l, cost)
}

func (f *failover) Take(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	c, cancel := f.ctx(ctx)
	d, err := f.primary.Take(c, key, l, cost)
	cancel()
	if f.failed(err) {
		return f.verdict(ctx, key, l, cost, true)
	}
	return d, err
}

func (f *failover) Peek(ctx context.Context, key string, l sluice.Limit, cost int64) (sluice.Decision, error) {
	c, cancel := f.ctx(ctx)
	d, err := f.primary.Peek(c, key, l, cost)
	cancel()
	if f.failed(err) {
		return f.verdict(ctx, key, l, cost, false)
	}
	return d, err
}

func (f *failover) Reset(ctx context.Context, key string, l sluice.Limit) error {
	if f.local != nil {
		f.local.Reset(ctx, key, l)
	}
	c, cancel := f.ctx(ctx)
	defer cancel()
	return f.primary.Reset(c, key, l)
}

func (f *failover) TakeAll(ctx context.Context, reqs []sluice.Request) ([]sluice.Decision, error) {
	if f.multi == nil {
		return nil, errors.New("server: store cannot take several limits at once")
	}
	c, cancel := f.ctx(ctx)
	out, err := f.multi.TakeAll(c, reqs)
	cancel()
	if !f.failed(err) {
		return out, err
	}
	out = make([]sluice.Decision, len(reqs))
	if f.policy != FailLocal {
		for i, r := range reqs {
			out[i], _ = f.verdict(ctx, r.Key, r.Limit, r.Cost, true)
		}
		return out, nil
	}
	f.localMu.Lock()
	defer f.localMu.Unlock()
	all := true
	for i, r := range reqs {
		if out[i], err = f.local.Peek(ctx, r.Key, r.Limit, r.Cost); err != nil {
			return nil, err
		}
		all = all && out[i].Allowed
	}
	if all {
		for i, r := range reqs {
			if out[i], err = f.local.Take(ctx, r.Key, r.Limit, r.Cost); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
